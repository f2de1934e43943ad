"""The long-running service (``codesdk-supervisor serve``, run by systemd, Type=notify).

Start-up: open the store (recovering tasks a previous process left running), start the worker pool, serve the
HTTP API on a unix socket, then tell systemd READY=1. While running: WATCHDOG=1 at half the configured
interval, but only while the store's writer makes progress on a probe. SIGHUP (``ExecReload=``): RELOADING=1,
read again what can be re-read — the tokens file, the log level (``DATA_DIR/log-level``), the namespaces'
variables (idle workers make way for ones that have them) — log what it did, READY=1; it never ends the service.
SIGTERM/SIGINT: STOPPING=1, stop running tasks (task.stopped), give every open event stream those events and end
it cleanly (``StreamDrain``), stop accepting, shut the workers down, commit, exit 0.

Apart from its command line (``cli.admin`` turns the flags into ``SupervisorOptions``): this module knows how the
service runs, not how it is asked for — no argparse, no API client.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import trio

from ..api import TokenAuth, TokenFileInvalid, open_token_auth
from ..api.server import StreamDrain, serve_api
from ..engine import Engine
from ..namespaces import (
    DiskQuotaError,
    NamespaceDisks,
    NamespaceStateUnavailable,
    SecretKeyError,
    UidRangeError,
    UnsafeDataDir,
    check_keys_held,
    disk_unsupported,
)
from ..store import DataDirBusy, EventStore, StoreError, check_store_url, is_postgres_url
from ..webhooks import WebhookOptions, WebhookService
from ._sdnotify import Notifier, watchdog_interval_s
from .assembly import SupervisorOptions, check_options, open_engine

__all__ = ["STORE_PROBE_TIMEOUT_S", "Notifier", "ServiceRefused", "run_service", "serve", "webhook_service"]

log = logging.getLogger("codesdk.supervisor.service")

#: Seconds a store probe may take before the watchdog stops being fed.
STORE_PROBE_TIMEOUT_S = 10.0

#: Seconds the drain gives open event streams to receive the stopped tasks' final events (TimeoutStopSec=45).
STREAM_DRAIN_S = 10.0


class ServiceRefused(Exception):
    """The service could not start, or had to stop, for a reason the operator must read (one line).

    ``exit_code``: 2 when a setting or the data dir must change first; 1 when the store failed (the database may
    come back: systemd tries again)."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def run_service(options: SupervisorOptions, socket_path: Path, port: int | None = None, *,
                advertise: Sequence[str] = (), metrics_port: int | None = None,
                otlp_endpoint: str | None = None) -> None:
    """Check ``options``, then serve until SIGTERM or SIGINT (``ServiceRefused`` for what keeps it from serving).
    ``otlp_endpoint``: export traces of tasks there (``observe.tracing``; the ``otel`` extra).

    Options that could only fail later are refused before anything is made (not even the data dir)."""
    try:
        check_options(options)
        if options.store is not None:
            check_store_url(options.store)
            if is_postgres_url(options.store) and options.secret_key is not None:
                check_keys_held(options.store, options.secret_key, options.old_secret_keys)
    except (UidRangeError, DiskQuotaError, StoreError, SecretKeyError) as exc:
        raise ServiceRefused(str(exc), 2) from None
    except NamespaceStateUnavailable as exc:
        raise ServiceRefused(str(exc), 1) from None
    if metrics_port is not None and metrics_port == port:
        raise ServiceRefused(f"--metrics-port {metrics_port} is the API's --port too: give the metrics a port of "
                             "their own", 2)
    if otlp_endpoint:
        try:
            from ..observe.tracing import traces_url
        except ImportError as exc:
            raise ServiceRefused(f"traces need the otel extra (pip install 'codesdk[otel]'): {exc}", 2) from None
        try:
            traces_url(otlp_endpoint)
        except ValueError as exc:
            raise ServiceRefused(f"--otlp-endpoint (or OTEL_EXPORTER_OTLP_ENDPOINT): {exc}", 2) from None
    options.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    _warn_about_trust(options)
    _say_disk_quotas(options)
    _make_non_dumpable()
    try:
        trio.run(partial(serve, options, socket_path, port, Notifier(), advertise=advertise,
                         metrics_port=metrics_port, otlp_endpoint=otlp_endpoint))
    except (DataDirBusy, TokenFileInvalid, UnsafeDataDir, StoreError, BaseExceptionGroup) as exc:
        refused = _leaf(exc)
        if isinstance(refused, StoreError) and not isinstance(refused, DataDirBusy):
            raise ServiceRefused(str(refused), 1) from None  # the database: systemd retries
        if not isinstance(refused, (DataDirBusy, TokenFileInvalid, UnsafeDataDir)):
            raise
        raise ServiceRefused(str(refused), 2) from None


async def serve(options: SupervisorOptions, socket_path: Path, port: int | None, notifier: Notifier,
                task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED, *,
                advertise: Sequence[str] = (), metrics_port: int | None = None,
                otlp_endpoint: str | None = None) -> None:
    data_dir = options.data_dir
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async with (open_engine(options) as engine, _traced(engine, otlp_endpoint),
                    open_token_auth(data_dir, options.store) as auth):
            drain = StreamDrain()
            async with trio.open_nursery() as nursery:
                webhooks = webhook_service(engine, options.webhooks)
                await nursery.start(webhooks.run)  # the delivery loop: its sends in a nursery of its own
                bound = await nursery.start(partial(serve_api, engine, auth, socket_path, port,
                                                    limits=options.api_limits, drain=drain,
                                                    metrics_port=metrics_port, webhooks=webhooks))
                api = [f"unix:{socket_path}", *([f"http://127.0.0.1:{port}"] if port else [])]
                if engine.store.lock is not None:  # a CLI that finds the data dir locked comes here instead
                    engine.store.lock.announce(api)
                # what a request for a namespace this supervisor runs is told on the others (PostgreSQL)
                engine.leasing.leases.announce(list(advertise) or api)
                log.info("codesdk-supervisor serving on %s (data dir %s, store %s, supervisor %s)", ", ".join(bound),
                         data_dir, engine.store.location, engine.leasing.leases.supervisor_id)
                # What start-up built lives as long as the service: out of the collector's full passes, which a
                # tenant's flood triggers and every tenant waits for (measured: 30-60 ms each, 11-17 ms after this).
                gc.collect()
                gc.freeze()
                notifier.notify("READY=1", f"STATUS=serving on {', '.join(bound)}")
                interval = watchdog_interval_s()
                if interval:
                    nursery.start_soon(_feed_watchdog, engine, notifier, interval)
                task_status.started(bound)
                async for signum in signals:
                    if signum == signal.SIGHUP:
                        notifier.notify("RELOADING=1", "STATUS=reloading")
                        await _reload(engine, auth, data_dir)
                        notifier.notify("READY=1", f"STATUS=serving on {', '.join(bound)}")
                        continue
                    log.info("%s: draining", signal.Signals(signum).name)
                    notifier.notify("STOPPING=1", "STATUS=draining: stopping tasks and workers")
                    await _drain(engine, drain)
                    break
                nursery.cancel_scope.cancel()  # stop accepting; the engine's exit stops tasks and workers
    notifier.notify("STATUS=stopped")


def webhook_service(engine: Engine, options: WebhookOptions) -> WebhookService:
    """The service's webhooks over its store, told of quarantines and of namespaces moved here; on PostgreSQL
    (leases that must be renewed) they deliver only what this supervisor's namespaces caused (or what nobody's
    live lease holds); approval routing counts them among who can answer. Its ``run`` is the delivery loop."""
    if not isinstance(engine.store, EventStore):
        raise TypeError("the service runs on an EventStore")
    leases = engine.leasing.leases
    webhooks = WebhookService(engine.store, options,
                              supervisor_id=None if leases.renew_every_s is None else leases.supervisor_id)
    engine.pool.on_quarantine = webhooks.quarantined
    engine.leasing.on_moved = webhooks.lease_moved
    engine.audience.webhooks = webhooks.accepts  # a webhook that takes an approval is someone who can answer it
    return webhooks


@asynccontextmanager
async def _traced(engine: Engine, endpoint: str | None) -> AsyncIterator[None]:
    """The engine's tasks traced to ``endpoint`` while the service runs; the spans still queued are sent at its
    end (bounded by the exporter's timeout)."""
    if not endpoint:
        yield
        return
    from ..observe.tracing import open_tracer, traces_url

    tracer, shutdown = open_tracer(endpoint)
    engine.observers.add(tracer)
    log.info("traces of tasks are sent to %s (OTLP/HTTP)", traces_url(endpoint))
    try:
        yield
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(shutdown)


async def _drain(engine: Engine, drain: StreamDrain) -> None:
    """Stop the running tasks (their task.stopped committed), give each open event stream every event up to them,
    end the streams' bodies cleanly, and say what was done. The API and the workers are closed after this."""
    drain.draining = True  # from now on nothing new starts (503 shutting_down): the stops below are the last word
    with trio.CancelScope(shield=True):
        sessions = await engine.stop_all()
        streams, delivered = await drain.drain(engine.store, STREAM_DRAIN_S)
    log.info("drain: %d running task(s) stopped (task.stopped) in %d session(s); %d open event stream(s) given "
             "their final events and ended%s", len(sessions), len(set(sessions)), delivered,
             f"; {streams - delivered} cut at the {STREAM_DRAIN_S:g} s limit" if streams > delivered else "")


#: A file in the data dir whose one word (DEBUG, INFO, WARNING, ...) sets the log level at each SIGHUP.
LOG_LEVEL_FILE = "log-level"


async def _reload(engine: Engine, auth: TokenAuth, data_dir: Path) -> None:
    """SIGHUP: re-read what can change without a restart, and say what it did. Never raises: a reload that
    fails in part logs the part and leaves the service serving."""
    tokens = await trio.to_thread.run_sync(auth.reload)
    level = _reload_log_level(data_dir)
    namespaces = sorted({str(slot["namespace"]) for slot in engine.pool.status()})  # once each, whatever its slots
    for namespace in namespaces:
        await engine.pool.env_changed(namespace)
    said = (f"reloaded {tokens} token(s) from {auth.where}" if auth.broken is None else
            f"the tokens of {auth.where} did NOT load (see the error above): only the admin token is valid until "
            "they do")
    log.warning("SIGHUP: %s; log level %s; namespace variables re-read for %d running namespace(s) (idle workers "
                "restart with them)", said, level, len(namespaces))


def _reload_log_level(data_dir: Path) -> str:
    path = data_dir / LOG_LEVEL_FILE
    root = logging.getLogger()
    try:
        wanted = path.read_text().strip().upper()
    except FileNotFoundError:
        return f"{logging.getLevelName(root.level)} (unchanged: no {path})"
    except OSError as exc:
        return f"{logging.getLevelName(root.level)} (unchanged: {exc})"
    if not isinstance(logging.getLevelName(wanted), int):
        log.error("%s says %r, not a log level (DEBUG, INFO, WARNING, ERROR); the level stays %s", path, wanted,
                  logging.getLevelName(root.level))
        return f"{logging.getLevelName(root.level)} (unchanged)"
    root.setLevel(wanted)
    return wanted


async def _feed_watchdog(engine: Engine, notifier: Notifier, interval: float) -> None:
    """WATCHDOG=1 only while the store's writer answers: a wedged writer lets systemd restart us. A probe that
    fails at once (the disk is full, the database is away) is an answer: the writer works, readiness reports the
    store (/readyz 503), and the service stays up to go on once the store is back — a restart would not help."""
    store = engine.store
    while True:
        answered = False
        with trio.move_on_after(STORE_PROBE_TIMEOUT_S):
            try:
                await store.ping()
            except StoreError as exc:
                log.error("store probe failed: %s", exc)
            answered = True
        if answered:
            notifier.notify("WATCHDOG=1")
        await trio.sleep(interval)


def _warn_about_trust(options: SupervisorOptions) -> None:
    """Say at start-up what the operator's choices give tenants (docs/operations.md, "Tenant isolation")."""
    root_workers = os.geteuid() == 0 and options.worker_uids is None
    if options.worker_uids is None:
        log.warning("without --worker-uids every tenant's worker and runtime runs as one uid (%d%s), in one trust "
                    "domain: tenants are kept apart by environment and directories, not by the kernel; give each "
                    "namespace its own uid with --worker-uids START:COUNT (docs/operations.md, \"Tenant "
                    "isolation\")", os.geteuid(), ", root" if root_workers else "")
    if options.test_scenarios:
        log.warning("--enable-test-scenarios: any tenant can run any command as its worker's uid%s, outside the "
                    "exec sandbox (scripted `spawn` steps); use it on test rigs only", " (root)" if root_workers else "")


def _say_disk_quotas(options: SupervisorOptions) -> None:
    """Whether namespaces' disks are bounded (docs/operations.md, "Limits"), and why not where they cannot be."""
    try:  # on PostgreSQL the overrides are in the database, not migrated yet on a first start: not read here
        own = ({} if options.store is not None and is_postgres_url(options.store)
               else NamespaceDisks(options.data_dir, options.namespace_disk).overrides())
    except DiskQuotaError as exc:
        log.error("%s", exc)
        return
    if options.namespace_disk is not None:
        log.info("each namespace's HOME and default workspaces live on a volume of its own: %s each%s",
                 options.namespace_disk, f" ({len(own)} set per namespace)" if own else "")
    elif own and (reason := disk_unsupported()) is not None:
        log.warning("%d namespaces have a disk quota (`namespace disk set`) but %s: their workers will be refused",
                    len(own), reason)
    elif not own:
        log.info("namespaces' disks are not bounded: their workspaces and HOMEs share the data dir's disk "
                 "(--namespace-disk SIZE[:FILES] bounds each)")


def _make_non_dumpable() -> None:
    """PR_SET_DUMPABLE 0: processes of our uid (a worker without a uid of its own) can no longer read our
    /proc/<pid>/environ, mem or fds, nor ptrace us; we ourselves still can. Also means no core dumps."""
    import ctypes

    pr_set_dumpable = 4
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(pr_set_dumpable, 0, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE) failed")
    except (OSError, AttributeError) as exc:
        log.warning("could not make the supervisor non-dumpable (%s); same-uid processes may read its /proc "
                    "entries", exc)


def _leaf(exc: BaseException) -> BaseException:
    """The one error inside trio's exception groups, if there is exactly one."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc
