"""``codesdk-supervisor``: the service's command line — ``serve`` (its flags become ``SupervisorOptions``, then
``service.serve`` runs) and the operator's commands beside it: ``token add``, ``namespace env set|unset|list``,
``namespace limits set|show``, ``quarantine list|lift``.

Apart from the service so that the service knows nothing of argparse or of the API client: the admin commands reach
a running service through ``codesdk.client``, as any client does. Both the service and the client are imported only
by the commands that use them (``token add`` starts neither an HTTP server nor a client).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from codesdk._version import __version__
from codesdk.protocol import PriceTable, PriceTableError, parse_price_table

from ..api import ADMIN_TOKEN_FILE, ApiLimits, PostgresTokenStore, TokenAuth
from ..bundle import BundleLimits
from ..config import default_data_dir
from ..engine import (
    DISK_RESERVE_BYTES,
    SERVICE_IDLE_TIMEOUT_MAX_S,
    SERVICE_IDLE_TIMEOUT_S,
    SERVICE_TIMEOUT_MAX_S,
    SERVICE_TIMEOUT_S,
    SERVICE_UNATTENDED,
    SERVICE_UNATTENDED_WAIT_S,
    DeadlineLimits,
    RoutingPolicy,
    Unattended,
)
from ..groups import (
    DEFAULT_MEMORY,
    DEFAULT_PIDS,
    DEFAULT_WEIGHT,
    GroupLimits,
    LimitError,
    LimitOverrides,
    StoredLimits,
    apply_stored,
    format_size,
    service_defaults,
    parse_size,
)
from ..namespaces import (
    NamespaceState,
    NamespaceStateUnavailable,
    UndecryptableVariable,
    open_namespace_state,
    SecretKeyError,
    DiskQuota,
    DiskQuotaError,
    InvalidNamespace,
    Namespace,
    NamespaceBudgetError,
    NamespaceDisks,
    NamespaceEgressError,
    NamespaceEnvError,
    UidRange,
    UidRangeError,
    check_monthly_usd,
)
from ..observe.logs import LOG_FORMATS
from ..observe.logs import configured as logging_configured
from ..service.assembly import SupervisorOptions
from ..store import (COMMIT_LINGER_S, LEASE_S, MAX_COMMIT_LINGER_S, QUOTA_FLAGS, Quotas, StoreError, check_store_url,
                     current_holder, open_token_table)
from ..tools import DEFAULT_EXEC_UID, check_exec_identity
from ..workers.launch import WorkerPolicy
from ..egress import EgressPolicy, HostPattern, IPNetwork
from ..webhooks import WebhookOptions
from .import_data_dir import import_parser
from .secret_key import add_secret_key_flag, add_secret_key_parser, old_secret_keys_of, secret_key_of
from .common import (
    EXIT_USAGE,
    Parser,
    add_store_flag,
    add_fetch_flags,
    add_question_flags,
    data_dir,
    fetch_flags_refusal,
    fetch_address,
    fetch_host,
    fetch_options,
    namespace_name,
    port,
    question_policy,
    seconds,
    strict_values,
)

PROG = "codesdk-supervisor"
_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def main(argv: list[str] | None = None) -> int:
    """The ``codesdk-supervisor`` command: parse, run the subcommand, return its exit code."""
    args = build_parser().parse_args(argv)
    command: Callable[[argparse.Namespace], int] = args.run
    return command(args)


def build_parser() -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = Parser(prog=PROG, description="The CodeSDK supervisor service.")
    parser.add_argument("--version", action="version", version=f"codesdk {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    _token_parser(sub)
    _quarantine_parser(sub)
    _namespace_parser(sub)
    _openapi_parser(sub)
    import_parser(sub)
    add_secret_key_parser(sub, PROG)
    return strict_values(parser)


# -- serve ----------------------------------------------------------------------------------------


def _serve_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    run = sub.add_parser("serve", help="serve the HTTP API until SIGTERM")
    run.set_defaults(run=_serve_command)
    run.add_argument("--data-dir", type=data_dir, default=default_data_dir())
    run.add_argument("--listen", type=Path, default=None,
                     help="unix socket for the API (default: DATA_DIR/api.sock; systemd: $RUNTIME_DIRECTORY/api.sock)")
    run.add_argument("--port", type=port, default=None, help="also listen on 127.0.0.1:PORT")
    run.add_argument("--otlp-endpoint", default=os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or None, metavar="URL",
                     help="send traces of tasks to this OpenTelemetry collector (OTLP over HTTP: http://host:4318; "
                          "default: $OTEL_EXPORTER_OTLP_ENDPOINT; needs the otel extra). Default: no traces")
    run.add_argument("--metrics-port", type=port, default=None, metavar="PORT",
                     help="serve /metrics (and the probes) alone on 127.0.0.1:PORT, for Prometheus with a metrics "
                          "token (`token add NAME --metrics`)")
    run.add_argument("--log-level", default="INFO", type=str.upper, choices=_LOG_LEVELS,
                     help="DEBUG, INFO (default), WARNING, ERROR or CRITICAL")
    run.add_argument("--log-format", default="text", choices=LOG_FORMATS,
                     help="text (default; with journald's priority prefixes when stderr is the journal) or json "
                          "(one object per line, with the audit and access facts as fields)")
    run.add_argument("--worker-uids", type=_uid_range, default=None, metavar="START:COUNT",
                     help="run each namespace's worker as its own uid/gid from this range of unused ids (no "
                          "passwd entries needed; needs root or CAP_SETUID/CAP_SETGID/CAP_CHOWN/CAP_DAC_OVERRIDE/"
                          "CAP_FOWNER). Default: every worker runs as the supervisor's uid (one trust domain)")
    run.add_argument("--allow-exec", action="append", metavar="COMMAND", default=None,
                     help="enable the sandboxed workspace.exec tool for tenants, for this command (an executable "
                          "name or absolute path; repeatable). Default: off")
    add_fetch_flags(run, "for tenants")
    _add_webhook_flags(run)
    add_question_flags(run, "over the API")
    _add_routing_flags(run)
    run.add_argument("--exec-uid", type=_exec_identity, default=None, metavar="UID[:GID]",
                     help="the uid (and gid; default: the same number) workspace.exec commands run as when the "
                          "service is root and the workspace is not a namespace's own: never 0, outside "
                          f"--worker-uids; the workspace is lent to it for each run. Default: {DEFAULT_EXEC_UID}, "
                          "which should have no passwd entry")
    run.add_argument("--enable-test-scenarios", action="store_true",
                     help="let tenants use the scripted runtime's fault-injection steps (crash, hang, flood, ...) and "
                          "inline scenarios: test instruments for test rigs, off by default. DANGER: any tenant can "
                          "then run any command as its worker's uid, outside the exec sandbox (root without "
                          "--worker-uids); never on a host with tenants you do not trust")
    policy = WorkerPolicy()
    run.add_argument("--max-restarts", type=int, default=policy.max_restarts,
                     help="crashes within --restart-window that quarantine")
    run.add_argument("--restart-window", type=float, default=policy.restart_window_s,
                     help="seconds (burst intensity)")
    run.add_argument("--sustained-max-restarts", type=int, default=policy.sustained_max_restarts,
                     help="crashes within --sustained-window that quarantine")
    run.add_argument("--sustained-window", type=float, default=policy.sustained_window_s,
                     help="seconds (sustained intensity)")
    run.add_argument("--quarantine", type=float, default=policy.quarantine_s,
                     help="seconds a quarantine lasts unless lifted")
    add_store_flag(run, "the event store (and the API tokens, namespace variables, limits and quarantines): a "
                        "postgresql://USER@HOST/DB URL for a database several supervisors share (each runs the namespaces whose leases it holds; "
                        "docs/operations.md, \"Past one machine\"). Default: $CODESDK_STORE, else SQLite in the data "
                        "dir")
    add_secret_key_flag(run)
    run.add_argument("--lease-s", type=_lease_s, default=LEASE_S, metavar="SECONDS",
                     help="with --store postgresql://: how long a namespace's lease outlives this supervisor's last "
                          "renewal, i.e. how soon another supervisor takes its namespaces over if it dies "
                          "(default %(default)s; renewed every third of it)")
    run.add_argument("--advertise", action="append", default=None, metavar="URL",
                     help="with --store postgresql://: where clients reach this supervisor's API, told to requests "
                          "for its namespaces that reach another supervisor (repeatable; default: the socket and "
                          "port it listens on)")
    run.add_argument("--worker-template", action=argparse.BooleanOptionalAction, default=True,
                     help="fork workers from a pre-imported template process: ~30 ms and ~6 MB of memory of their "
                          "own each when idle, instead of ~0.5 s and ~24 MB (docs/operations.md; default: on; "
                          "--no-worker-template spawns each as a new interpreter)")
    run.add_argument("--commit-linger-ms", type=_commit_linger_ms, default=COMMIT_LINGER_S * 1000, metavar="MS",
                     help="the longest a paced stream's events wait for other sessions' to share their commit, while "
                          "many streams are live (fewer commits and wakeups per event; a lone stream, a flood and "
                          "tool calls never wait; 0 turns it off; at most "
                          f"{MAX_COMMIT_LINGER_S * 1000:g}; default %(default)g)")
    run.add_argument("--price-table", type=_price_table, default=PriceTable(), metavar="FILE",
                     help='USD per million tokens by model, for budgets\' cost where a runtime reports none: JSON '
                          '{"models": {"<model>": {"input": 3, "output": 15, "cached_input": 0.3}}} '
                          "(docs/operations.md, \"Price table\"; default: none, usage without a cost is unpriced)")
    _add_limit_flags(run)
    _add_deadline_flags(run)
    _add_group_flags(run)


def _price_table(path: str) -> PriceTable:
    """The price table file, checked now: a bad one stops ``serve`` (exit 2) saying where and what."""
    try:
        return parse_price_table(Path(path).read_bytes(), path)
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot read {path}: {exc.strerror or exc}") from None
    except PriceTableError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _commit_linger_ms(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of milliseconds") from None
    if not 0 <= value <= MAX_COMMIT_LINGER_S * 1000:
        raise argparse.ArgumentTypeError(f"{text} ms is outside 0-{MAX_COMMIT_LINGER_S * 1000:g} ms")
    return value


def _add_group_flags(run: argparse.ArgumentParser) -> None:
    """Each namespace's resource group and its default limits (docs/operations.md, "Resource groups")."""
    groups = run.add_argument_group("resource groups", "a cgroup per namespace holding its worker, its runtimes "
                                                       "and its exec calls; `namespace limits set` overrides these "
                                                       "per namespace")
    groups.add_argument("--resource-groups", action=argparse.BooleanOptionalAction, default=True,
                        help="create them (default: on; where the host offers none the service says why at "
                             "start-up and in /readyz, and runs without)")
    groups.add_argument("--namespace-pids", type=_positive_int, default=DEFAULT_PIDS, metavar="N",
                        help="processes one namespace may hold at once; also exec's RLIMIT_NPROC (default "
                             "%(default)s)")
    groups.add_argument("--namespace-memory", type=_group_size, default=DEFAULT_MEMORY, metavar="SIZE",
                        help="memory one namespace may use, tmpfs pages it writes included (default "
                             f"{format_size(DEFAULT_MEMORY)})")
    groups.add_argument("--namespace-cpu-weight", type=_positive_int, default=DEFAULT_WEIGHT, metavar="W",
                        help="CPU weight, 1-10000 (default %(default)s)")
    groups.add_argument("--namespace-io-weight", type=_positive_int, default=DEFAULT_WEIGHT, metavar="W",
                        help="IO weight, 1-10000, where the host's IO scheduler offers one (default %(default)s)")


def _group_size(text: str) -> int:
    try:
        return parse_size(text)
    except LimitError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _add_limit_flags(run: argparse.ArgumentParser) -> None:
    """Per-tenant quotas and API limits (docs/operations.md, "Limits")."""
    quotas, api = Quotas(), ApiLimits()
    limits = run.add_argument_group("limits", "what one tenant may store, run and hold open (sizes take K/M/G/T; "
                                              "'none' lifts a quota)")
    for name, (flag, unit) in QUOTA_FLAGS.items():
        limits.add_argument(flag, dest=f"quota_{name}", type=_quota_value, default=getattr(quotas, name),
                            metavar="N", help=f"{unit} (default {getattr(quotas, name)})")
    limits.add_argument("--disk-reserve", type=_disk_reserve, default=DISK_RESERVE_BYTES, metavar="SIZE",
                        help="free space the data dir's and a task's workspace's file systems must keep: below it "
                             "/readyz answers 503 and new sessions and tasks are refused (exit 69); 0 turns the "
                             f"check off (default {DISK_RESERVE_BYTES >> 20}M)")
    limits.add_argument("--namespace-disk", type=_disk_quota, default=None, metavar="SIZE[:FILES]",
                        help="each namespace's disk quota: its HOME tree and default workspaces live on an ext4 "
                             "image of this size (and FILES inodes) of its own, loop-mounted; needs root and loop "
                             "devices; per namespace: `namespace disk set` (default: off)")
    max_file = SupervisorOptions.exec_max_file_bytes
    limits.add_argument("--exec-max-file-size", type=_quota_value, default=max_file, metavar="SIZE",
                        help="the largest file one workspace.exec command may write (RLIMIT_FSIZE; 'none' lifts "
                             f"it; default {(max_file or 0) >> 20}M)")
    limits.add_argument("--max-connections", type=_positive_int, default=api.max_connections, metavar="N",
                        help="open API connections in all (default %(default)s; lowered to fit RLIMIT_NOFILE, keeping "
                             "a reserve of descriptors for the store and workers)")
    limits.add_argument("--max-connections-per-principal", type=_positive_int, metavar="N",
                        default=api.max_connections_per_principal, help="open API connections per token "
                                                                        "(default %(default)s)")
    limits.add_argument("--max-streams-per-principal", type=_positive_int, default=api.max_streams_per_principal,
                        metavar="N", help="open SSE event streams per token (default %(default)s)")
    limits.add_argument("--header-timeout", type=_positive_float, default=api.header_timeout_s, metavar="SECONDS",
                        help="time a connection has to send a request's headers, also the keep-alive idle time "
                             "(default %(default)s)")
    limits.add_argument("--body-timeout", type=_positive_float, default=api.body_timeout_s, metavar="SECONDS",
                        help="time a request body may take to arrive (default %(default)s)")
    limits.add_argument("--send-timeout", type=_positive_float, default=api.send_timeout_s, metavar="SECONDS",
                        help="time a client may take to read each 64 KiB of a response (or an event of a stream) "
                             "before its connection is closed (default %(default)s)")
    bundles = api.bundles  # support bundles (docs/operations.md "Support bundles")
    limits.add_argument("--bundle-max-mb", type=_positive_int, default=bundles.max_bytes >> 20, metavar="MIB",
                        help="the most a support bundle's events and blobs take; past it the bundle is cut short and "
                             "says so (default %(default)s)")
    limits.add_argument("--bundle-interval", type=_positive_float, default=bundles.min_interval_s, metavar="SECONDS",
                        help="time a token waits between two bundles built for it (default %(default)s)")
    limits.add_argument("--bundle-cache-mb", type=_positive_int, default=bundles.cache_bytes >> 20, metavar="MIB",
                        help="built bundles kept in <data-dir>/bundle-cache for unchanged sessions "
                             "(default %(default)s)")


def _serve_options(args: argparse.Namespace) -> SupervisorOptions:
    """The service's options from ``serve``'s flags."""
    policy = WorkerPolicy(max_restarts=args.max_restarts, restart_window_s=args.restart_window,
                          sustained_max_restarts=args.sustained_max_restarts,
                          sustained_window_s=args.sustained_window, quarantine_s=args.quarantine)
    return SupervisorOptions(
        data_dir=args.data_dir, worker_policy=policy, worker_uids=args.worker_uids,
        holder="codesdk-supervisor serve",
        test_scenarios=args.enable_test_scenarios, exec_allowlist=tuple(args.allow_exec or ()),
        fetch=fetch_options(args), fetch_unattended=args.allow_fetch_unattended,
        quotas=_quotas(args), api_limits=_api_limits(args), worker_template=args.worker_template,
        store=args.store, lease_s=args.lease_s, disk_reserve_bytes=args.disk_reserve,
        namespace_disk=args.namespace_disk, exec_max_file_bytes=args.exec_max_file_size,
        task_deadlines=_task_deadlines(args), commit_linger_s=args.commit_linger_ms / 1000,
        questions=question_policy(args), routing=_routing_policy(args), prices=args.price_table,
        resource_groups=args.resource_groups, group_limits=_group_limits(args), webhooks=_webhook_options(args),
        **({"exec_uid": args.exec_uid} if args.exec_uid is not None else {}))


def _add_routing_flags(run: argparse.ArgumentParser) -> None:
    """Approval routing (docs/operations.md, "Approval routing"): what nobody-can-answer becomes, and escalation."""
    group = run.add_argument_group(
        "approval routing", "an approval or question nobody can answer (no client following the namespace's "
                            "events, no webhook for it) gets the fallback at once instead of waiting on nobody")
    group.add_argument("--unattended", choices=[u.value for u in Unattended], default=SERVICE_UNATTENDED.value,
                       help="deny: denied (a question declined) at once, with the reason; wait: it waits "
                            "--unattended-wait only (default %(default)s)")
    group.add_argument("--unattended-wait", type=seconds, default=SERVICE_UNATTENDED_WAIT_S, metavar="SECONDS",
                       help="how long an approval or question nobody can answer waits with --unattended wait, "
                            "instead of its whole timeout (default %(default)g)")
    group.add_argument("--escalate-after", type=seconds, default=None, metavar="SECONDS",
                       help="record approval.escalated / question.escalated once for a request still pending this "
                            "long, for the webhooks subscribed to it (default: never)")


def _routing_policy(args: argparse.Namespace) -> RoutingPolicy:
    return RoutingPolicy(unattended=Unattended(args.unattended), unattended_wait_s=args.unattended_wait,
                         escalate_after_s=args.escalate_after)


def _add_webhook_flags(run: argparse.ArgumentParser) -> None:
    """Webhooks (docs/webhooks.md): where endpoints may be, and how deliveries are retried."""
    defaults = WebhookOptions()
    group = run.add_argument_group("webhooks", "signed deliveries of events to endpoints tenants and the admin "
                                               "register (docs/webhooks.md); none may be registered until a host "
                                               "is allowed")
    group.add_argument("--webhook-allow", action="append", type=_webhook_host, metavar="HOST_PATTERN", default=None,
                       help="let webhook endpoints be on this host: example.com, *.example.com, or an IP, each with "
                            "an optional :PORT (else the scheme's default port); repeatable. Default: none")
    group.add_argument("--webhook-allow-address", action="append", type=_webhook_address, metavar="CIDR",
                       default=None,
                       help="let deliveries connect to these addresses although they are not public (loopback, "
                            "private, link-local...: refused otherwise); repeatable")
    group.add_argument("--webhook-max-attempts", type=_positive_int, default=defaults.max_attempts, metavar="N",
                       help="attempts before a delivery is dead (default %(default)s)")
    group.add_argument("--webhook-retry-base", type=_positive_float, default=defaults.retry_base_s,
                       metavar="SECONDS", help="the first retry's delay; each next one doubles, with jitter, up to "
                                               "an hour (default %(default)s)")
    group.add_argument("--webhook-timeout", type=_positive_float, default=defaults.timeout_s, metavar="SECONDS",
                       help="the longest one attempt may take, connecting included (default %(default)s)")


def _webhook_host(value: str) -> HostPattern:
    """``--webhook-allow``: a pattern as ``--allow-fetch`` takes, refused in this flag's name."""
    try:
        return fetch_host(value)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(str(exc).replace("--allow-fetch ", "")) from None


def _webhook_address(value: str) -> IPNetwork:
    try:
        return fetch_address(value)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(str(exc).replace("--allow-fetch-address", "--webhook-allow-address")) from None


def _webhook_options(args: argparse.Namespace) -> WebhookOptions:
    return WebhookOptions(egress=EgressPolicy(hosts=tuple(args.webhook_allow or ()),
                                              addresses=tuple(args.webhook_allow_address or ())),
                          max_attempts=args.webhook_max_attempts, retry_base_s=args.webhook_retry_base,
                          timeout_s=args.webhook_timeout)


def _add_deadline_flags(run: argparse.ArgumentParser) -> None:
    """Tasks' deadlines (docs/operations.md, "Task deadlines")."""
    group = run.add_argument_group("task deadlines", "how long a task may run, and stay silent, before it is stopped "
                                                     "and fails TASK_TIMEOUT (seconds; 'none' or 0: no deadline)")
    for flag, default, what in (
            ("--task-timeout-default", SERVICE_TIMEOUT_S, "wall clock from a task's start, for a task that asks for "
                                                          "no timeout_s; lowered to the maximum if that is lower"),
            ("--task-timeout-max", SERVICE_TIMEOUT_MAX_S, "the most timeout_s a task may ask for (more is refused, "
                                                          "422); with no default, a task asking for none gets it"),
            ("--task-idle-timeout-default", SERVICE_IDLE_TIMEOUT_S, "the runtime silent this long (waiting for an "
                                                                    "approval or a supervisor's tool does not count), "
                                                                    "for a task that asks for no idle_timeout_s; "
                                                                    "lowered to the maximum if that is lower"),
            ("--task-idle-timeout-max", SERVICE_IDLE_TIMEOUT_MAX_S, "the most idle_timeout_s a task may ask for "
                                                                    "(more is refused, 422)")):
        # absent when not given (SUPPRESS): a default left as it is yields to a lower maximum, one given does not
        group.add_argument(flag, type=_deadline_value, default=argparse.SUPPRESS, metavar="SECONDS",
                           help=f"{what} (default {'none' if default is None else f'{default:g}'})")


def _deadline_value(text: str) -> float | None:
    """Seconds above 0, or ``none``/``0`` for no deadline."""
    if text.strip().lower() in ("none", "0"):
        return None
    try:
        return seconds(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"invalid deadline {text!r}: a number of seconds above 0, or 'none'") from None


def _task_deadlines(args: argparse.Namespace) -> DeadlineLimits:
    def default(name: str, service_default: float, most: float | None) -> float | None:
        if hasattr(args, name):
            given: float | None = getattr(args, name)
            return given
        return service_default if most is None else min(service_default, most)

    timeout_max: float | None = getattr(args, "task_timeout_max", SERVICE_TIMEOUT_MAX_S)
    idle_max: float | None = getattr(args, "task_idle_timeout_max", SERVICE_IDLE_TIMEOUT_MAX_S)
    try:
        return DeadlineLimits(timeout_default_s=default("task_timeout_default", SERVICE_TIMEOUT_S, timeout_max),
                              timeout_max_s=timeout_max, idle_max_s=idle_max,
                              idle_default_s=default("task_idle_timeout_default", SERVICE_IDLE_TIMEOUT_S, idle_max))
    except ValueError as exc:  # a default above its maximum
        said = str(exc)
        for name, flag in (("timeout_default_s", "--task-timeout-default"), ("timeout_max_s", "--task-timeout-max"),
                           ("idle_default_s", "--task-idle-timeout-default"), ("idle_max_s", "--task-idle-timeout-max")):
            said = said.replace(name, flag)
        print(f"{PROG} serve: {said}: lower the default or raise the maximum", file=sys.stderr)
        raise SystemExit(2) from None


def _group_limits(args: argparse.Namespace) -> GroupLimits:
    try:
        return GroupLimits(pids=args.namespace_pids, memory=args.namespace_memory,
                           cpu_weight=args.namespace_cpu_weight, io_weight=args.namespace_io_weight)
    except LimitError as exc:
        raise SystemExit(f"{PROG} serve: {exc}") from exc


def _quotas(args: argparse.Namespace) -> Quotas:
    return Quotas(**{name: getattr(args, f"quota_{name}") for name in QUOTA_FLAGS})


def _api_limits(args: argparse.Namespace) -> ApiLimits:
    return ApiLimits(max_connections=args.max_connections,
                     max_connections_per_principal=args.max_connections_per_principal,
                     max_streams_per_principal=args.max_streams_per_principal,
                     header_timeout_s=args.header_timeout, body_timeout_s=args.body_timeout,
                     send_timeout_s=args.send_timeout,
                     bundles=BundleLimits(max_bytes=args.bundle_max_mb << 20, min_interval_s=args.bundle_interval,
                                          cache_bytes=args.bundle_cache_mb << 20))


def _serve_command(args: argparse.Namespace) -> int:
    from ..service.serve import ServiceRefused, run_service  # the HTTP stack: only for serve

    refusal = fetch_flags_refusal(args)
    if refusal is not None:
        print(f"{PROG} serve: error: {refusal}", file=sys.stderr)
        return EXIT_USAGE
    try:
        secret_key = secret_key_of(args)
        old_keys = old_secret_keys_of(args)
    except SecretKeyError as exc:
        print(f"{PROG} serve: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    with logging_configured(args.log_level, args.log_format):
        options = replace(_serve_options(args), secret_key=secret_key, old_secret_keys=old_keys)
        socket_path: Path = args.listen or options.data_dir / "api.sock"
        try:
            run_service(options, socket_path, args.port, advertise=args.advertise or (),
                        metrics_port=args.metrics_port, otlp_endpoint=args.otlp_endpoint)
        except ServiceRefused as refused:
            print(f"{PROG}: {refused}", file=sys.stderr)
            return refused.exit_code
    return 0


# -- flag values ----------------------------------------------------------------------------------

_SIZE_SUFFIXES = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def _quota_value(text: str) -> int | None:
    """A positive count or size (``2G``, ``512M``, ``100k``), or ``none`` for no limit."""
    value = text.strip().lower()
    if value == "none":
        return None
    scale = _SIZE_SUFFIXES.get(value[-1:], 1)
    number = value[:-1] if scale > 1 else value
    if not _is_digits(number) or int(number) < 1:
        raise argparse.ArgumentTypeError(f"invalid limit {text!r}: a positive number (K/M/G/T allowed) or 'none'")
    return int(number) * scale


def _disk_reserve(text: str) -> int:
    """A size (``256M``, ``1G``) or 0 (no check)."""
    if text.strip() == "0":
        return 0
    try:
        size = _quota_value(text) if text.strip().lower() != "none" else None
    except argparse.ArgumentTypeError:
        size = None
    if size is None:
        raise argparse.ArgumentTypeError(f"invalid size {text!r}: a number of bytes (K/M/G/T allowed), or 0 for no "
                                         "check")
    return size


def _disk_quota(text: str) -> DiskQuota:
    try:
        return DiskQuota.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"invalid number of seconds {text!r}: must be > 0")
    return value


def _positive_int(text: str) -> int:
    if not _is_digits(text.strip()) or int(text) < 1:
        raise argparse.ArgumentTypeError(f"invalid number {text!r}: must be a positive integer")
    return int(text)


def _is_digits(text: str) -> bool:
    """ASCII digits only: ``str.isdigit`` also takes '²', which ``int`` then refuses with an unclear error."""
    return text.isascii() and text.isdigit()


def _lease_s(text: str) -> float:
    value = _positive_float(text)
    if not 1 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"a lease lasts from 1 to 3600 seconds, not {text}")
    return value


def _uid_range(text: str) -> UidRange:
    try:
        return UidRange.parse(text)
    except UidRangeError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _exec_identity(text: str) -> tuple[int, int]:
    uid, sep, gid = text.partition(":")
    if not uid.strip().isdigit() or (sep and not gid.strip().isdigit()):
        raise argparse.ArgumentTypeError(f"invalid exec uid {text!r}: use UID or UID:GID, e.g. {DEFAULT_EXEC_UID}")
    identity = (int(uid), int(gid) if sep else int(uid))
    try:
        check_exec_identity(*identity)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    return identity


# -- token ----------------------------------------------------------------------------------------


def _token_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    token = sub.add_parser("token", help="API tokens: add, list, revoke, rotate")
    token_sub = token.add_subparsers(dest="token_command", required=True)
    add = token_sub.add_parser("add", help="create a token bound to namespaces; prints it once")
    add.set_defaults(run=_token_add_command)
    add.add_argument("name", help="unique per namespace")
    add.add_argument("--namespace", action="append", type=namespace_name,
                     help="default | user:<id> | ci:<job> (repeat; one at least, unless --metrics)")
    add.add_argument("--metrics", action="store_true",
                     help="a token for Prometheus: it reads /metrics and nothing else (no namespace)")
    listing = token_sub.add_parser("list", help="every token's id, name, role and namespaces (never the token)")
    listing.set_defaults(run=_token_list_command)
    revoke = token_sub.add_parser("revoke", help="remove a token: it stops working at once")
    revoke.set_defaults(run=_token_revoke_command)
    rotate = token_sub.add_parser("rotate", help="replace a token by a new one (same id, name, namespaces); "
                                                 "prints it once, the old one stops working")
    rotate.set_defaults(run=_token_rotate_command)
    for cmd in (revoke, rotate):
        cmd.add_argument("token", metavar="ID_OR_NAME", help="the id from `token list`, or a name used once")
    for cmd in (add, listing, revoke, rotate):
        cmd.add_argument("--data-dir", type=data_dir, default=None,
                         help=f"the service's data dir (default: {default_data_dir()})")
        add_store_flag(cmd, "the tokens: those of the PostgreSQL database the services share (serve's --store) "
                            "rather than the data dir's")


class _BadStoreUrl(Exception):
    """--store is no PostgreSQL URL psycopg can read."""


@contextmanager
def _token_table(args: argparse.Namespace) -> Iterator[TokenAuth]:
    """The token table: the database's with ``--store``, else the data dir's; a data dir that does not exist is
    refused, never created (a typo would otherwise make a token no service reads)."""
    if args.store is not None:
        try:
            check_store_url(args.store)
        except StoreError as exc:
            raise _BadStoreUrl(str(exc)) from None
        table = open_token_table(args.store)
        try:
            auth = TokenAuth(store=PostgresTokenStore(table))
            auth.reload(fail_closed=False)
            yield auth
        finally:
            table.close()
        return
    data_dir: Path = args.data_dir or default_data_dir()
    if not data_dir.is_dir():
        raise ValueError(f"the data dir {data_dir} does not exist; pass the service's --data-dir (the unit's: "
                         "/var/lib/codesdk)")
    yield TokenAuth.bootstrap(data_dir)


def _token_command(args: argparse.Namespace, act: Callable[[TokenAuth], None]) -> int:
    try:
        with _token_table(args) as auth:
            act(auth)
    except _BadStoreUrl as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    except StoreError as exc:  # the database: it may come back
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:  # an invalid namespace, a name taken, no such token, a broken tokens file
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"{PROG}: cannot use the tokens file ({exc}); run as the service's user", file=sys.stderr)
        return 2
    return 0


def _token_add_command(args: argparse.Namespace) -> int:
    def add(auth: TokenAuth) -> None:
        if not args.metrics and not args.namespace:
            raise ValueError("token add needs --namespace (the namespaces the token may use), or --metrics")
        token = auth.add_principal(args.name, args.namespace or [], metrics=args.metrics)
        print(token)
        print(f"token {args.name!r} added to {auth.where}", file=sys.stderr)

    return _token_command(args, add)


def _token_list_command(args: argparse.Namespace) -> int:
    def listing(auth: TokenAuth) -> None:
        for token_id, principal in auth.records():
            role = "admin" if principal.admin else "metrics" if principal.metrics else "tenant"
            print(f"{token_id}\t{principal.name}\t{role}\t{','.join(sorted(principal.namespaces)) or '-'}")

    return _token_command(args, listing)


def _token_revoke_command(args: argparse.Namespace) -> int:
    def revoke(auth: TokenAuth) -> None:
        token_id, principal = auth.revoke(args.token)
        print(f"token {token_id} ({principal.name}) revoked in {auth.where}", file=sys.stderr)

    return _token_command(args, revoke)


def _token_rotate_command(args: argparse.Namespace) -> int:
    def rotate(auth: TokenAuth) -> None:
        token_id, principal, token = auth.rotate(args.token)
        print(token)
        print(f"token {token_id} ({principal.name}) rotated in {auth.where}; the old token no longer works",
              file=sys.stderr)

    return _token_command(args, rotate)


# -- openapi --------------------------------------------------------------------------------------


def _openapi_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    openapi = sub.add_parser("openapi", help="print the API's OpenAPI 3.1 document (what a service serves at "
                                             "/v1/openapi.json), for client generators; no service needed")
    openapi.add_argument("--html", action="store_true", help="the web page of it instead (/v1/docs)")
    openapi.set_defaults(run=_openapi_command)


def _openapi_command(args: argparse.Namespace) -> int:
    from ..api.openapi import openapi_document, reference_page

    document = openapi_document(version="1")
    sys.stdout.write(reference_page(document) if args.html else json.dumps(document, indent=2) + "\n")
    return 0


# -- quarantine -----------------------------------------------------------------------------------


def _quarantine_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    quarantine = sub.add_parser("quarantine", help="namespaces whose workers crashed too often")
    quarantine_sub = quarantine.add_subparsers(dest="quarantine_command", required=True)
    for name, text in (("list", "every namespace's worker state and quarantine"),
                       ("lift", "let a quarantined namespace start workers again now")):
        cmd = quarantine_sub.add_parser(name, help=text)
        cmd.set_defaults(run=_quarantine_command)
        if name == "lift":
            cmd.add_argument("namespace", type=namespace_name)
        cmd.add_argument("--data-dir", type=data_dir, default=default_data_dir())
        cmd.add_argument("--listen", type=Path, default=None,
                         help="the running service's API socket (default: the one the service announces in its "
                              "data dir's lock file, else DATA_DIR/api.sock)")


def _service_socket(data_dir: Path, listen: Path | None = None) -> Path:
    """Where the running service listens: ``--listen`` if given, else the socket it announces in the data dir's
    lock file (whatever its --listen), else DATA_DIR/api.sock. One way for every operator command."""
    if listen is not None:
        return listen
    holder = current_holder(data_dir)
    announced = next((a[len("unix:"):] for a in holder.api if a.startswith("unix:")), None) if holder else None
    return Path(announced) if announced else data_dir / "api.sock"


def _quarantine_command(args: argparse.Namespace) -> int:
    """Talk to the running service over its socket with the admin token (the pool's state lives there)."""
    import httpx2

    from codesdk.client import ApiError, Client, ServiceUnreachable

    data_dir: Path = args.data_dir
    if args.quarantine_command == "lift":
        try:
            Namespace.parse(args.namespace)
        except InvalidNamespace as exc:
            print(f"{PROG}: {exc}", file=sys.stderr)
            return 2
    socket_path = _service_socket(data_dir, args.listen)
    try:
        token = (data_dir / ADMIN_TOKEN_FILE).read_text().strip()
    except OSError as exc:
        print(f"{PROG}: cannot read the admin token ({exc}); pass the service's --data-dir", file=sys.stderr)
        return 2
    try:
        with Client(socket=socket_path, token=token) as client:
            if args.quarantine_command == "lift":
                lifted = client.lift_quarantine(args.namespace)
                print(f"{args.namespace}: quarantine lifted" if lifted else f"{args.namespace}: not quarantined")
                return 0
            for slot in client.workers():
                until = slot.quarantined_until
                note = (f"quarantined until {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(until))}: "
                        f"{slot.quarantine_reason}") if until else ""
                print(f"{slot.namespace}\t{slot.state}\tcrashes={slot.recent_crashes}\t{note}".rstrip())
            return 0
    except ServiceUnreachable as exc:
        print(f"{PROG}: {exc.message}", file=sys.stderr)  # says where, why, and what to check: once
        return 3
    except ApiError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2 if exc.status == 422 else 1
    except (OSError, httpx2.TransportError) as exc:
        print(f"{PROG}: cannot reach the service at {socket_path} ({exc}); is `{PROG} serve` running with this "
              "--data-dir?", file=sys.stderr)
        return 3


# -- namespace env --------------------------------------------------------------------------------


def _namespace_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    namespace = sub.add_parser("namespace", help="a namespace's stored variables (API keys, base URLs, ...) and "
                                                 "resource limits")
    namespace_sub = namespace.add_subparsers(dest="namespace_command", required=True)
    env = namespace_sub.add_parser("env", help="set, unset or list a namespace's variables; values are never shown")
    env_sub = env.add_subparsers(dest="env_command", required=True)
    env_set = env_sub.add_parser("set", help="set variables: KEY=VALUE (visible to ps), or KEY alone to read the "
                                             "value from stdin (hidden prompt on a terminal)")
    env_set.add_argument("namespace", type=namespace_name)
    env_set.add_argument("assignments", nargs="+", metavar="KEY[=VALUE]")
    env_unset = env_sub.add_parser("unset", help="remove variables")
    env_unset.add_argument("namespace", type=namespace_name)
    env_unset.add_argument("names", nargs="+", metavar="KEY")
    env_list = env_sub.add_parser("list", help="names and fingerprints (an HMAC of each value, never the value)")
    env_list.add_argument("namespace", type=namespace_name)
    for cmd in (env_set, env_unset, env_list):
        cmd.set_defaults(run=_namespace_env_command)
        cmd.add_argument("--data-dir", type=data_dir, default=default_data_dir())
        _add_shared_state_flags(cmd)
    disk = namespace_sub.add_parser("disk", help="a namespace's own disk quota (over serve's --namespace-disk)")
    disk_sub = disk.add_subparsers(dest="disk_command", required=True)
    disk_set = disk_sub.add_parser("set", help="set its quota; a larger one grows its volume when its worker next "
                                               "starts (a smaller one is not applied to an existing volume)")
    disk_set.add_argument("namespace", type=namespace_name)
    disk_set.add_argument("quota", type=_disk_quota, metavar="SIZE[:FILES]")
    disk_unset = disk_sub.add_parser("unset", help="drop its own quota: serve's --namespace-disk applies again")
    disk_unset.add_argument("namespace", type=namespace_name)
    disk_show = disk_sub.add_parser("show", help="its quota and, when its volume is mounted, how full it is")
    disk_show.add_argument("namespace", type=namespace_name)
    for cmd in (disk_set, disk_unset, disk_show):
        cmd.set_defaults(run=_namespace_disk_command)
        cmd.add_argument("--data-dir", type=data_dir, default=default_data_dir())
        _add_shared_state_flags(cmd)
    _namespace_limits_parser(namespace_sub)
    _namespace_egress_parser(namespace_sub)
    _namespace_budget_parser(namespace_sub)


def _namespace_budget_parser(namespace_sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    budget = namespace_sub.add_parser("budget", help="a namespace's monthly budget in USD: once its sessions spent it "
                                                     "in a calendar month (UTC), new tasks are refused (402)")
    budget.add_argument("namespace", type=namespace_name)
    given = budget.add_mutually_exclusive_group()
    given.add_argument("--monthly-usd", type=_monthly_usd, default=None, metavar="USD",
                       help="set it (0: no new task at all); without a flag: show it")
    given.add_argument("--clear", action="store_true", help="drop it: no monthly budget")
    budget.add_argument("--data-dir", type=data_dir, default=default_data_dir())
    _add_shared_state_flags(budget)
    budget.set_defaults(run=_namespace_budget_command)


def _monthly_usd(text: str) -> float:
    try:
        return check_monthly_usd(float(text))
    except (ValueError, NamespaceBudgetError):
        raise argparse.ArgumentTypeError(f"invalid budget {text!r}: a number of USD, 0 or more") from None


def _add_shared_state_flags(cmd: argparse.ArgumentParser) -> None:
    add_store_flag(cmd, "the postgresql:// store the supervisors share, where the setting is kept with it (default: "
                        "$CODESDK_STORE, else the data dir's files)")
    add_secret_key_flag(cmd)


def _namespace_state(args: argparse.Namespace) -> NamespaceState:
    """Where the namespace settings are: the data dir's files, or with --store postgresql:// the database
    (``SecretKeyError`` without the key)."""
    return open_namespace_state(args.data_dir, args.store, secret_key_of(args), old_secret_keys_of(args))


def _namespace_budget_command(args: argparse.Namespace) -> int:
    """On the data dir's file (or the shared database) directly, read at each task's start. What the namespace
    spent this month is the service's to say (``GET /v1/namespaces/{ns}/budget``)."""
    try:
        with _namespace_state(args) as state:
            if args.clear:
                limit = state.budgets.set(args.namespace, None)
            elif args.monthly_usd is not None:
                limit = state.budgets.set(args.namespace, args.monthly_usd)
            else:
                limit = state.budgets.get(args.namespace)
    except (NamespaceBudgetError, InvalidNamespace, OSError, SecretKeyError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"monthly_usd\t{'none' if limit is None else f'{limit:g}'}")
    print("note\twhat it spent this month (UTC): GET /v1/namespaces/{ns}/budget on the running service")
    return 0


def _namespace_egress_parser(namespace_sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    egress = namespace_sub.add_parser("egress", help="narrow the hosts http.fetch may reach for a namespace (within "
                                                     "serve's --allow-fetch)")
    egress_sub = egress.add_subparsers(dest="egress_command", required=True)
    egress_set = egress_sub.add_parser("set", help="allow only these hosts (each also allowed by serve's "
                                                   "--allow-fetch): replaces the namespace's list")
    egress_set.add_argument("namespace", type=namespace_name)
    egress_set.add_argument("patterns", nargs="+", type=fetch_host, metavar="HOST_PATTERN")
    egress_none = egress_sub.add_parser("deny-all", help="allow it no host at all")
    egress_none.add_argument("namespace", type=namespace_name)
    egress_clear = egress_sub.add_parser("clear", help="drop the namespace's list: serve's --allow-fetch applies")
    egress_clear.add_argument("namespace", type=namespace_name)
    egress_show = egress_sub.add_parser("show", help="the namespace's list")
    egress_show.add_argument("namespace", type=namespace_name)
    for cmd in (egress_set, egress_none, egress_clear, egress_show):
        cmd.set_defaults(run=_namespace_egress_command)
        cmd.add_argument("--data-dir", type=data_dir, default=default_data_dir())
        _add_shared_state_flags(cmd)


def _namespace_egress_command(args: argparse.Namespace) -> int:
    """On the data dir's file directly, read by the next http.fetch call. The service's --allow-fetch is not known
    here: a pattern outside it allows nothing (PUT /v1/namespaces/{ns}/egress refuses one)."""
    try:
        with _namespace_state(args) as state:
            if args.egress_command == "set":
                own = state.egress.set(args.namespace, tuple(args.patterns))
            elif args.egress_command == "deny-all":
                own = state.egress.set(args.namespace, ())
            elif args.egress_command == "clear":
                own = state.egress.set(args.namespace, None)
            else:
                own = state.egress.get(args.namespace)
    except (NamespaceEgressError, InvalidNamespace, OSError, SecretKeyError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if own is None:
        print("hosts\tserve --allow-fetch (no list of its own)")
    else:
        print(f"hosts\t{' '.join(str(p) for p in own) or 'none'}")
        print("note\tonly hosts serve's --allow-fetch also allows can be fetched")
    return 0


def _namespace_disk_command(args: argparse.Namespace) -> int:
    """On the data dir's file (or the shared database) directly: the quota applies when the namespace's volume is
    next prepared (its next worker start or default workspace)."""
    try:
        with _namespace_state(args) as state:
            disks = NamespaceDisks(args.data_dir, table=state.disk_overrides)
            if args.disk_command == "set":
                disks.set_override(args.namespace, args.quota)
            elif args.disk_command == "unset":
                disks.set_override(args.namespace, None)
            own = disks.overrides().get(args.namespace)
            usage = disks.usage(args.namespace)
    except (DiskQuotaError, InvalidNamespace, ValueError, OSError, SecretKeyError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    print(f"quota\t{own if own is not None else 'serve --namespace-disk (if given)'}")
    print(f"used\t{usage.describe() if usage is not None else 'volume not mounted'}")
    return 0


def _namespace_limits_parser(namespace_sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    limits = namespace_sub.add_parser("limits", help="a namespace's resource-group limits (processes, memory, CPU "
                                                     "and IO weight)")
    limits_sub = limits.add_subparsers(dest="limits_command", required=True)
    limits_set = limits_sub.add_parser("set", help="override the service's defaults for this namespace: applied "
                                                   "at once to its running group, and on its next start")
    limits_set.add_argument("--pids", type=_positive_int, default=None, metavar="N")
    limits_set.add_argument("--memory", type=_group_size, default=None, metavar="SIZE")
    limits_set.add_argument("--cpu-weight", type=_positive_int, default=None, metavar="W")
    limits_set.add_argument("--io-weight", type=_positive_int, default=None, metavar="W")
    limits_show = limits_sub.add_parser("show", help="the namespace's limits, and which are its own overrides")
    for cmd in (limits_set, limits_show):
        cmd.add_argument("namespace", type=namespace_name)
        cmd.add_argument("--data-dir", type=data_dir, default=default_data_dir())
        cmd.set_defaults(run=_namespace_limits_command)


def _namespace_limits_command(args: argparse.Namespace) -> int:
    """On the files in the data dir (like the other namespace settings); a running supervisor's group for the
    namespace gets them at once (its subtree is recorded in the data dir)."""
    stored = StoredLimits(args.data_dir)
    try:
        if args.limits_command == "set":
            given = LimitOverrides(pids=args.pids, memory=args.memory, cpu_weight=args.cpu_weight,
                                   io_weight=args.io_weight)
            if not given.to_json_obj():
                raise LimitError("nothing to set: give --pids, --memory, --cpu-weight or --io-weight")
            GroupLimits().with_overrides(given)  # each value checked before anything is stored
            stored.set(args.namespace, given)
            where = apply_stored(args.data_dir, args.namespace)
            print(f"namespace {args.namespace}: applied to its running group {where}" if where else
                  f"namespace {args.namespace}: stored; applied when its worker next starts", file=sys.stderr)
        own = stored.get(args.namespace)
    except (LimitError, InvalidNamespace, OSError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    effective = service_defaults(args.data_dir).with_overrides(own)
    for name, value in effective.to_json_obj().items():
        shown = format_size(value) if name == "memory" else str(value)
        print(f"{name}\t{shown}\t{'set' if getattr(own, name) is not None else 'default'}")
    return 0


def _namespace_env_command(args: argparse.Namespace) -> int:
    """Through the running service when it holds the data dir (it restarts idle workers at once), else on the
    files directly (the next worker started for the namespace has the change)."""
    from codesdk.client import ApiError, Client, EnvVariable

    data_dir: Path = args.data_dir
    try:
        set_values: dict[str, str] = {}
        unset: list[str] = []
        if args.env_command == "set":
            if sum("=" not in item for item in args.assignments) > 1:
                raise NamespaceEnvError("only one KEY may take its value from stdin; give the others as KEY=VALUE")
            for item in args.assignments:
                name, sep, value = item.partition("=")
                set_values[name] = value if sep else _value_from_stdin(name)
        elif args.env_command == "unset":
            unset = list(args.names)
        holder = current_holder(data_dir)
        socket = _service_socket(data_dir) if holder is not None and holder.api else None
        if socket is not None:
            token = (data_dir / ADMIN_TOKEN_FILE).read_text().strip()
            with Client(socket=socket, token=token) as client:
                entries = (client.update_namespace_env(args.namespace, set=set_values, unset=unset)
                           if args.env_command != "list" else client.namespace_env(args.namespace))
        else:
            with _namespace_state(args) as state:
                objs = (state.variables.update(args.namespace, set_values, unset) if args.env_command != "list"
                        else state.variables.entries(args.namespace))
            entries = [EnvVariable(name=e.name, fingerprint=e.fingerprint) for e in objs]
    except (NamespaceEnvError, InvalidNamespace, ApiError, OSError, SecretKeyError, UndecryptableVariable,
            NamespaceStateUnavailable) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    for entry in entries:
        print(f"{entry.name}\t{entry.fingerprint}")
    if not entries:
        print(f"namespace {args.namespace} has no stored variables", file=sys.stderr)
    return 0


def _value_from_stdin(name: str) -> str:
    """A secret's value without putting it on a command line: a hidden prompt, or all of stdin."""
    if sys.stdin.isatty():
        import getpass

        return getpass.getpass(f"value of {name}: ")
    value = sys.stdin.read()
    value = value.removesuffix("\n")
    if not value:
        raise NamespaceEnvError(f"no value for {name} on stdin (empty); pipe the value in, or use "
                                f"`namespace env unset NS {name}` to remove it")
    return value


if __name__ == "__main__":
    sys.exit(main())
