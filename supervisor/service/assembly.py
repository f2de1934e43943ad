"""Assembling an embedded supervisor: store + worker pool + owned tools + engine, from options."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

from codesdk.procs.children import Children
from codesdk.protocol import PriceTable
from codesdk.procs.orphans import become_subreaper

from ..api import ApiLimits
from ..config import default_data_dir
from ..groups import GroupLimits, ResourceGroups
from ..engine import DISK_RESERVE_BYTES, DeadlineLimits, Engine, EngineConfig, QuestionPolicy, RoutingPolicy
from ..namespaces import (
    DiskQuota,
    DiskQuotaError,
    NamespaceDisks,
    NamespaceState,
    SecretKey,
    open_namespace_state,
    require_secret_key,
    UidRange,
    UidRangeError,
    check_can_switch_uids,
    check_reachable_by_workers,
    disk_unsupported,
    secure_data_dir,
    tighten_data_dir,
)
from ..store import COMMIT_LINGER_S, LEASE_S, Quotas, is_postgres_url
from ..egress import EgressPolicy
from ..tools import (
    DEFAULT_EXEC_UID,
    Connector,
    ExecPolicy,
    FetchPolicy,
    ToolRegistry,
    ToolsConfig,
    check_exec_identity,
    open_tcp,
)
from codesdk.worker.command import worker_argv

from ..workers.launch import PoolConfig, WorkerPolicy, workers_env
from ..webhooks import WebhookOptions


@dataclass(frozen=True)
class SupervisorOptions:
    data_dir: Path = field(default_factory=default_data_dir)
    exec_allowlist: tuple[str, ...] = ()  # non-empty enables the sandboxed workspace.exec tool
    #: ``http.fetch``'s egress policy (``--allow-fetch``...): allowing a host enables the tool.
    fetch: EgressPolicy = field(default_factory=EgressPolicy)
    #: ``yolo`` tasks run ``http.fetch`` without asking (``--allow-fetch-unattended``); ``auto``/``ask`` still ask.
    fetch_unattended: bool = False
    #: Where ``http.fetch`` opens its connections (tests: inside a network namespace of their own).
    fetch_connect: Connector = open_tcp
    #: When a namespace's worker is let go (idle), restarted, quarantined, or killed after its grace.
    worker_policy: WorkerPolicy = field(default_factory=WorkerPolicy)
    worker_env: dict[str, dict[str, str]] = field(default_factory=dict)
    worker_argv: tuple[str, ...] = ()
    worker_path: str | None = None
    #: Fork ``codesdk-worker``s from a pre-imported template process (``PoolConfig.template``): the service does;
    #: one ``codesdk run`` would pay the template's start for a single worker, so it does not.
    worker_template: bool = False
    # A range of otherwise unused uids/gids: each namespace's worker runs as its own uid from it (needs root or
    # CAP_SETUID/CAP_SETGID/...). None (the default): every worker runs as the supervisor's uid — one trust
    # domain, where tenants are separated by environment and directories but not by the kernel.
    worker_uids: UidRange | None = None
    #: The uid and gid ``workspace.exec`` commands run as when the supervisor is root and the workspace is not a
    #: namespace's own (``serve --exec-uid UID[:GID]``): never 0, outside ``worker_uids``; with no passwd entry by
    #: default, so it owns nothing on the host. The workspace is lent to it for each run.
    exec_uid: tuple[int, int] = (DEFAULT_EXEC_UID, DEFAULT_EXEC_UID)
    #: Who this supervisor is, for a second process that finds the data dir locked ("codesdk run", ...).
    holder: str = "an embedded CodeSDK supervisor"
    #: The scripted runtime's fault-injection steps and inline scenarios (test instruments): off for tenants of a
    #: service unless the operator enables them; ``codesdk run`` (one user's own supervisor) turns them on.
    test_scenarios: bool = False
    #: Per-tenant quotas: events and bytes stored per session and per namespace, tasks at once per namespace.
    quotas: Quotas = field(default_factory=Quotas)
    #: Free bytes a new session or task needs on the data dir's and its workspace's file systems; below it
    #: ``/readyz`` answers 503 and they are refused ``insufficient_space`` (0: not checked).
    disk_reserve_bytes: int = DISK_RESERVE_BYTES
    #: Every namespace's disk quota (``serve --namespace-disk SIZE[:FILES]``): its HOME tree and default workspaces
    #: on an ext4 image of its own; per-namespace overrides in the data dir (``namespace disk set``). None: off.
    namespace_disk: DiskQuota | None = None
    #: The largest file one ``workspace.exec`` command may write (RLIMIT_FSIZE, ``serve --exec-max-file-size``).
    exec_max_file_bytes: int | None = ExecPolicy.max_file_bytes
    #: Tasks' deadlines (``timeout_s``, ``idle_timeout_s``): the operator's defaults and maxima (none: no deadline).
    task_deadlines: DeadlineLimits = field(default_factory=DeadlineLimits)
    #: The longest a paced stream's events wait for other sessions' to share their commit (``--commit-linger-ms``).
    commit_linger_s: float = COMMIT_LINGER_S
    #: How long a runtime's question waits for its user, and what it becomes then (``--question-timeout`` …).
    questions: QuestionPolicy = field(default_factory=QuestionPolicy)
    #: What an approval or question nobody can answer becomes, and when a pending one escalates (``serve
    #: --unattended`` …; docs/operations.md "Approval routing"). None: each waits its whole timeout.
    routing: RoutingPolicy | None = None
    #: USD per million tokens by model (``--price-table``): the cost of usage a runtime reports without one.
    prices: PriceTable = field(default_factory=PriceTable)
    #: What API clients may hold: connections (in all, per token), event streams per token, header/body timeouts.
    api_limits: ApiLimits = field(default_factory=ApiLimits)
    #: The event store: None for SQLite in the data dir (the embedded default); a ``postgresql://`` URL for a
    #: database several supervisors share, each running the namespaces whose leases it holds.
    store: str | None = None
    #: Seconds a namespace's lease outlives its supervisor's last renewal (PostgreSQL only): how soon another
    #: supervisor takes over the namespaces of one that died.
    lease_s: float = LEASE_S
    #: The deployment's secret key (``--secret-key-file``, ``$CODESDK_SECRET_KEY``): namespace variables kept in
    #: PostgreSQL are encrypted under it. Needed with a ``postgresql://`` store, unused otherwise.
    secret_key: SecretKey | None = field(default=None, repr=False)
    #: Previous keys (``--old-secret-key-file``): rows not yet re-encrypted by a rotation open with them.
    old_secret_keys: tuple[SecretKey, ...] = field(default=(), repr=False)
    #: The registry of this process's children (``codesdk.procs.children``), which the orphan sweep leaves alone:
    #: one per process. None: ``open_engine`` makes one (a process running one engine at a time); the ``codesdk``
    #: command gives the one its headstart worker is owned in; a process running engines side by side, each the same.
    children: Children | None = field(default=None, compare=False)
    #: A resource group (cgroup) per namespace with these default limits (``serve`` turns it on; where no group
    #: can be created it says why and runs without): ``codesdk.supervisor.groups``.
    resource_groups: bool = False
    group_limits: GroupLimits = field(default_factory=GroupLimits)
    #: Webhooks (``serve --webhook-allow`` …): hosts endpoints may be on (none by default), retries, timeouts.
    webhooks: WebhookOptions = field(default_factory=WebhookOptions)


def check_options(options: SupervisorOptions) -> None:
    """Fail at start-up, with what to do, on options that could only fail later (``UidRangeError``)."""
    try:
        check_exec_identity(*options.exec_uid, _namespace_uids(options.worker_uids))
    except ValueError as exc:
        raise UidRangeError(str(exc)) from exc
    if options.store is not None and is_postgres_url(options.store):
        require_secret_key(options.secret_key, "--store postgresql://… (namespace variables are kept there, "
                           "encrypted)")
    if options.namespace_disk is not None and (reason := disk_unsupported()) is not None:
        raise DiskQuotaError(f"--namespace-disk {options.namespace_disk}: {reason}; drop the flag to run without "
                             "disk quotas")
    if options.worker_uids is not None:
        check_can_switch_uids()
        check_reachable_by_workers((list(options.worker_argv) or worker_argv())[0])


def _namespace_uids(uids: UidRange | None) -> range | None:
    return None if uids is None else range(uids.start, uids.start + uids.count)


@asynccontextmanager
async def open_engine(options: SupervisorOptions) -> AsyncIterator[Engine]:
    data_dir = Path(options.data_dir)
    check_options(options)
    children = options.children if options.children is not None else Children()
    become_subreaper()  # orphans of a worker's runtime are adopted and reaped here, not left as zombies
    secure_data_dir(data_dir)
    if options.worker_uids is not None:  # created here with 0700, not later by mkdir(parents=True) with the umask
        for private in ("blobs", "workspaces"):
            (data_dir / private).mkdir(exist_ok=True, mode=0o700)
    worker_env = workers_env(options.worker_env, test_scenarios=options.test_scenarios)
    groups = ResourceGroups.open(data_dir, options.group_limits, enabled=options.resource_groups)
    try:
        async with _open_engine(options, data_dir, children, worker_env, groups) as engine:
            yield engine
    finally:
        groups.close()


@asynccontextmanager
async def _open_engine(options: SupervisorOptions, data_dir: Path, children: Children,
                       worker_env: dict[str, Mapping[str, str]], groups: ResourceGroups) -> AsyncIterator[Engine]:
    state = open_namespace_state(data_dir, options.store, options.secret_key, options.old_secret_keys)
    try:
        async with _open_engine_with(options, data_dir, children, worker_env, groups, state) as engine:
            yield engine
    finally:
        state.close()


@asynccontextmanager
async def _open_engine_with(options: SupervisorOptions, data_dir: Path, children: Children,
                            worker_env: dict[str, Mapping[str, str]], groups: ResourceGroups,
                            state: NamespaceState) -> AsyncIterator[Engine]:
    pool = PoolConfig(data_dir=data_dir, argv=options.worker_argv, policy=options.worker_policy,
                      env=worker_env, path=options.worker_path, worker_uids=options.worker_uids,
                      template=options.worker_template, children=children, groups=groups,
                      disks=NamespaceDisks(data_dir, options.namespace_disk, state.disk_overrides),
                      variables=state.variables, quarantines=state.quarantines)
    exec_policy = ExecPolicy(enabled=bool(options.exec_allowlist), allowlist=options.exec_allowlist,
                             exec_uid=options.exec_uid[0], exec_gid=options.exec_uid[1],
                             namespace_uids=_namespace_uids(options.worker_uids),
                             max_processes=options.group_limits.pids,
                             max_file_bytes=options.exec_max_file_bytes)
    fetch_policy = FetchPolicy(egress=options.fetch, connect=options.fetch_connect,
                               unattended=options.fetch_unattended, namespace_hosts=state.egress.get)
    tools = ToolRegistry(ToolsConfig(exec=exec_policy, fetch=fetch_policy), children=children, groups=groups)
    async with Engine.open(EngineConfig(data_dir=data_dir, pool=pool, holder=options.holder,
                                        quotas=options.quotas, store=options.store, lease_s=options.lease_s,
                                        disk_reserve_bytes=options.disk_reserve_bytes,
                                        deadlines=options.task_deadlines,
                                        commit_linger_s=options.commit_linger_s, questions=options.questions,
                                        routing=options.routing,
                                        prices=options.prices, namespace_state=state),
                           tools) as engine:
        if options.worker_uids is not None:  # the data dir becomes 0711: nothing in it may rely on the umask
            tighten_data_dir(data_dir)
        yield engine
