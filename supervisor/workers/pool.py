"""The worker pool: at most one worker per credential namespace, started on demand.

Each worker lives in its own nursery under the pool's: it counts as running after its handshake, its
events are pumped to the engine in order, and only after its output has ended and it has been reaped
does the pool report the exit — so the engine never mistakes events that were already sent for lost.
Crashes restart lazily with exponential backoff. Too many crashes — a burst in a short window, or a sustained
rate over a long one — quarantine the namespace: new tasks are refused with a clear error, other namespaces are
untouched, and the quarantine lifts after ``quarantine_s`` or when an operator lifts it (``lift_quarantine``).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from functools import partial

import trio

from codesdk.procs.launch import Launch
from codesdk.procs.orphans import discard
from codesdk.procs.process import ForkedChild, StartedProcess
from codesdk.procs.tree import ProcessTable
from codesdk.protocol import (
    ExitStatus,
    IsolationLevel,
    IsolationMode,
    NoParams,
    Rpc,
    RuntimeEnv,
    WireEvent,
)
from codesdk.worker.client import (
    REAP_WAIT_S,
    RESOURCE_ERRNOS,
    RpcError,
    WorkerError,
    WorkerProcess,
    WorkerResourcesExhausted,
    WorkerSpec,
    check_descriptor_headroom,
    exhausted_message,
)

from ..namespaces import (
    DiskQuotaError,
    KeyNotHeld,
    Namespace,
    NamespaceStateUnavailable,
    QuarantineRecord,
    UidRangeError,
    UndecryptableVariable,
)
from .launch import EPHEMERAL, NAMESPACED, Headstart, Placement, PoolConfig, prepare_launch, template_env
from .template import TemplateUnavailable, WorkerTemplate

log = logging.getLogger("codesdk.supervisor.pool")

EventHandler = Callable[[WorkerProcess, Sequence[WireEvent]], Awaitable[None]]
#: Most events handed to the engine at once; bounds the size of one append transaction.
EVENT_BATCH = 512

ExitHandler = Callable[[str, WorkerProcess, ExitStatus], Awaitable[None]]


class SlotState(StrEnum):
    STOPPED = "stopped"
    STARTING = "starting"
    RUNNING = "running"
    FAILING = "failing"


class NamespaceFailing(RuntimeError):
    """No worker can serve this namespace now (it failed to start, is quarantined, or the pool is closing)."""


SHUTTING_DOWN = "the supervisor is shutting down"


class NamespaceQuarantined(NamespaceFailing):
    """Workers of this namespace crashed too often; none is started until the quarantine lifts."""


@dataclass(frozen=True)
class Quarantine:
    since: float  # wall-clock seconds (for people)
    until: float  # wall-clock seconds
    deadline: float  # monotonic, what the pool compares against
    reason: str


@dataclass
class _Slot:
    namespace: Namespace
    placement: Placement
    worker: WorkerProcess | None = None
    starting: trio.Event | None = None
    start_scope: trio.CancelScope | None = None  # the start under way, cancelled when the pool closes
    active: int = 0
    crashes: deque[float] = field(default_factory=deque)  # monotonic times, within sustained_window_s
    quarantine: Quarantine | None = None
    last_exit: ExitStatus | None = None
    last_error: str | None = None
    idle_scope: trio.CancelScope | None = None
    workers_started: int = 0
    vacated: trio.Event = field(default_factory=trio.Event)  # set once the current worker is gone
    env_stamp: str = ""  # the stored variables' stamp the current worker was started with
    started_by: str | None = None  # how the current (or last) worker started: "template", "ahead", "new interpreter"
    hung: str | None = None  # why the current worker was killed as hung (``kill_hung``), until its exit is reported


def _describe(exc: BaseException) -> str:
    """The leaf errors of a (nested) exception group, not "Exceptions from Trio nursery"."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(inner) for inner in exc.exceptions)
    return str(exc) or type(exc).__name__


def _contains(exc: BaseException, kind: type[BaseException]) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return any(_contains(inner, kind) for inner in exc.exceptions)
    return isinstance(exc, kind)


@dataclass
class _Heard:
    """When a worker was last heard from (an event handed over, or a ping answered), and whether the supervisor is
    busy handing its events over: then its answers wait behind them unread (the store is slow, a PostgreSQL
    failover), and its silence says nothing about the worker."""

    at: float = field(default_factory=trio.current_time)
    handing_over: bool = False


class WorkerPool:
    def __init__(self, config: PoolConfig, nursery: trio.Nursery, on_event: EventHandler,
                 on_exit: ExitHandler) -> None:
        self.config = config
        self._nursery = nursery
        self._on_event = on_event
        self._on_exit = on_exit
        self._slots: dict[str, _Slot] = {}
        self._closing = False
        #: Told of each quarantine as it begins (namespace, reason, until as Unix time): the service's webhooks.
        self.on_quarantine: Callable[[str, str, float], None] | None = None
        self.namespace_env = config.variables
        self._headstarts: dict[str, Headstart] = {}
        #: Snapshots of the process table its workers' trees are watched in: one scan of /proc serves them all.
        self._table = ProcessTable()
        self._template = (WorkerTemplate(config.worker_argv(), template_env(config), config.children)
                          if config.template else None)
        if self._template is not None:  # in the background: until it is ready, workers start the usual way
            self._template.ensure_started(nursery)

    # -- public ---------------------------------------------------------------------------------

    async def acquire(self, namespace: str, placement: Placement | None = None) -> WorkerProcess:
        """The namespace's running worker (started if needed), counted as in use until ``release``; with a
        ``placement`` other than the namespace's own, that placement's worker (a slot of its own, never shared
        with the namespace's: ``Placement.key`` names it, and ``release`` takes that key)."""
        placement = placement or Placement(namespace)
        slot = self._slots.get(placement.key)
        if slot is None:
            slot = self._slots[placement.key] = _Slot(Namespace.parse(namespace), placement)
        while True:
            if self._closing:
                raise NamespaceFailing(SHUTTING_DOWN)
            if slot.worker is not None:
                worker = slot.worker
                if worker.exited.is_set() or worker.stopping:
                    await slot.vacated.wait()  # never two workers for one namespace
                    continue
                if slot.active == 0 and await self._env_changed(slot):
                    self._retire(slot, worker, "its stored variables changed")
                    continue
                slot.active += 1
                slot.worker.mark_busy(True)
                if slot.idle_scope is not None:
                    slot.idle_scope.cancel()
                    slot.idle_scope = None
                return slot.worker
            if slot.starting is not None:
                await slot.starting.wait()
                if slot.worker is None and not self._closing:  # the start we waited for failed
                    raise NamespaceFailing(slot.last_error or f"namespace {namespace!r}: worker failed to start")
                continue
            await self._start(slot)

    def offer(self, headstart: Headstart) -> None:
        """A worker started ahead of the pool (``launch.Headstart``): adopted by its namespace's next start
        if it was launched exactly as that start would launch it, discarded otherwise (or when the pool closes)."""
        previous = self._headstarts.pop(headstart.namespace, None)
        if previous is not None:
            previous.discard()
        if headstart.children is not self.config.children:  # owned where the orphan sweep does not look
            log.warning("namespace %s: not adopting a worker started ahead with another registry of children",
                        headstart.namespace)
            headstart.discard()
        elif self._closing:
            headstart.discard()
        else:
            self._headstarts[headstart.namespace] = headstart

    def release(self, key: str, worker: WorkerProcess) -> None:
        """The worker acquired for ``key`` (a namespace, or ``Placement.key``) is no longer in use by that task."""
        slot = self._slots.get(key)
        if slot is None or slot.worker is not worker:
            return
        slot.active = max(0, slot.active - 1)
        if slot.active == 0:
            worker.mark_busy(False)
        if slot.active == 0 and not worker.exited.is_set():
            scope = trio.CancelScope()
            slot.idle_scope = scope
            self._nursery.start_soon(self._idle_timer, slot, worker, scope)

    def status(self) -> list[dict[str, object]]:
        now = time.monotonic()
        out: list[dict[str, object]] = []
        for name, slot in sorted(self._slots.items()):
            out.append({
                "namespace": slot.namespace.name,
                "isolation": slot.placement.isolation,
                "session_id": slot.placement.session_id,
                "state": self._state(slot, now).value,
                "pid": slot.worker.pid if slot.worker and not slot.worker.exited.is_set() else None,
                "active_tasks": slot.active,
                "workers_started": slot.workers_started,
                "started_by": slot.started_by,
                "recent_crashes": self._crashes_within(slot, self.config.policy.restart_window_s, now),
                "last_exit": slot.last_exit.describe() if slot.last_exit else None,
                "last_error": slot.last_error,
                "quarantined_until": slot.quarantine.until if slot.quarantine else None,
                "quarantine_reason": slot.quarantine.reason if slot.quarantine else None,
            })
        return out

    async def status_with_shared(self) -> list[dict[str, object]]:
        """``status``, with the quarantines recorded in the shared database (by any supervisor) shown on their
        namespace's worker, or as a worker of their own where this supervisor has none for it."""
        out = self.status()
        if self.config.quarantines is None:
            return out
        try:
            shared = await trio.to_thread.run_sync(self.config.quarantines.all)
        except NamespaceStateUnavailable as exc:
            log.warning("shared quarantines unreadable: %s", exc)
            return out
        for row in out:
            record = shared.pop(str(row["namespace"]), None)
            if record is not None and row["quarantined_until"] is None:
                row.update(state="quarantined", quarantined_until=record.until, quarantine_reason=record.reason)
        for namespace, record in sorted(shared.items()):
            out.append({"namespace": namespace, "isolation": NAMESPACED, "session_id": None, "state": "quarantined",
                        "pid": None, "active_tasks": 0, "workers_started": 0, "started_by": None,
                        "recent_crashes": 0, "last_exit": None, "last_error": None,
                        "quarantined_until": record.until, "quarantine_reason": record.reason})
        return out

    def template_state(self) -> str:
        """The worker template's state for operators (``WorkerTemplate.state``), or ``off`` when not configured."""
        return "off" if self._template is None else self._template.state()

    def lift_quarantine(self, namespace: str) -> bool:
        """Let the namespace start workers again now (its sessions' own too), with a fresh crash budget. False if
        none of them was quarantined."""
        lifted = False
        for slot in self._slots_of(namespace):
            if slot.quarantine is not None:
                log.warning("namespace %s: quarantine lifted by the operator (%s worker)", namespace,
                            slot.placement.isolation)
                slot.quarantine = None
                slot.crashes.clear()
                lifted = True
        return lifted

    async def lift_shared_quarantine(self, namespace: str) -> bool:
        """Lift the namespace's quarantine every supervisor sees (``PoolConfig.quarantines``), if there is one."""
        if self.config.quarantines is None:
            return False
        return await trio.to_thread.run_sync(self.config.quarantines.lift, namespace)

    async def env_changed(self, namespace: str) -> None:
        """The namespace's stored variables changed: an idle worker (each of its slots') makes way for one that
        has them now; a busy one finishes its tasks first (it is replaced when it becomes idle)."""
        for slot in self._slots_of(namespace):
            worker = slot.worker
            if worker is not None and await self._env_changed(slot):
                self._retire(slot, worker, "its stored variables changed")

    async def let_go(self, namespace: str) -> None:
        """The namespace is no longer ours to run (its lease was lost to another supervisor): its worker and the
        runtimes under it are killed now rather than shut down gracefully, and that is no crash. Its sessions' own
        workers (ephemeral, shared) too."""
        for slot in self._slots_of(namespace):
            worker = slot.worker
            if worker is not None:
                log.error("namespace %s: its lease was lost; killing its worker pid %d", namespace, worker.pid)
                worker.stopping = True
                await worker.kill()

    async def kill_hung(self, namespace: str, worker: WorkerProcess, why: str) -> None:
        """The worker did not answer (``why``: a stop, or the liveness ping): it is treated as crashed. Its whole
        tree is SIGKILLed at once (a frozen process cannot act on SIGTERM); its exit, reported as usual, fails its
        tasks once and counts toward quarantine; the namespace's next task starts a new worker."""
        slot = next((s for s in self._slots_of(namespace) if s.worker is worker), None)
        if slot is None or worker.exited.is_set() or worker.stopping:
            return
        slot.hung = why
        log.error("namespace %s: worker pid %d %s; killing it as hung", namespace, worker.pid, why)
        await worker.kill(term_grace_s=0)

    def worker_of(self, namespace: str, placement: Placement | None = None) -> WorkerProcess | None:
        slot = self._slots.get(placement.key if placement is not None else namespace)
        return slot.worker if slot else None

    async def session_ended(self, placement: Placement) -> None:
        """A session with a worker of its own (ephemeral) is gone: that worker is shut down now (bounded) and its
        slot forgotten, so the session's HOME can be removed. Any other placement's worker serves other sessions
        too, and is left alone."""
        slot = self._slots.get(placement.key)
        if slot is None or slot.placement.isolation != EPHEMERAL:
            return
        if slot.worker is not None:
            slot.worker.stopping = True
            await slot.worker.shutdown(self.config.policy.shutdown_grace_s)
            await slot.vacated.wait()
        if slot.starting is None and slot.worker is None and self._slots.get(placement.key) is slot:
            del self._slots[placement.key]

    def _slots_of(self, namespace: str) -> list[_Slot]:
        return [slot for slot in self._slots.values() if slot.namespace.name == namespace]

    async def aclose(self) -> None:
        """Shut every worker down (bounded) and wait for their exits to be reported."""
        self._closing = True
        for slot in self._slots.values():  # a start under way would spawn a worker nobody shuts down
            if slot.start_scope is not None:
                slot.start_scope.cancel()
        for headstart in self._headstarts.values():
            headstart.discard()
        self._headstarts.clear()
        if self._template is not None:
            self._template.close()
        with trio.CancelScope(shield=True):
            for slot in self._slots.values():
                if slot.starting is not None:
                    await slot.starting.wait()
            async with trio.open_nursery() as nursery:
                for slot in self._slots.values():
                    if slot.worker is not None:
                        nursery.start_soon(slot.worker.shutdown, self.config.policy.shutdown_grace_s)
            for slot in self._slots.values():
                if slot.worker is not None:
                    await slot.vacated.wait()

    # -- internals ------------------------------------------------------------------------------

    def _state(self, slot: _Slot, now: float) -> SlotState:
        if slot.starting is not None:
            return SlotState.STARTING
        if slot.worker is not None:
            return SlotState.RUNNING
        if self._quarantine_of(slot, now) is not None:
            return SlotState.FAILING
        return SlotState.STOPPED

    def _crashes_within(self, slot: _Slot, window_s: float, now: float) -> int:
        horizon = max(self.config.policy.sustained_window_s, self.config.policy.restart_window_s)
        while slot.crashes and now - slot.crashes[0] > horizon:
            slot.crashes.popleft()
        return sum(1 for t in slot.crashes if now - t <= window_s)

    def _quarantine_of(self, slot: _Slot, now: float) -> Quarantine | None:
        """The slot's quarantine if still in force; an expired one is lifted with a fresh crash budget."""
        if slot.quarantine is not None and now >= slot.quarantine.deadline:
            log.info("namespace %s: quarantine expired; workers may start again", slot.namespace.name)
            slot.quarantine = None
            slot.crashes.clear()
        return slot.quarantine

    def _record_crash(self, slot: _Slot) -> None:
        """Count a crash; quarantine the namespace when the burst or the sustained intensity is reached."""
        now = time.monotonic()
        slot.crashes.append(now)
        config = self.config
        burst = self._crashes_within(slot, config.policy.restart_window_s, now)
        sustained = self._crashes_within(slot, config.policy.sustained_window_s, now)
        if burst >= config.policy.max_restarts:
            why = f"{burst} crashes in {config.policy.restart_window_s:.0f} s"
        elif sustained >= config.policy.sustained_max_restarts:
            why = f"{sustained} crashes in {config.policy.sustained_window_s:.0f} s"
        else:
            return
        wall = time.time()
        slot.quarantine = Quarantine(since=wall, until=wall + config.policy.quarantine_s,
                                     deadline=now + config.policy.quarantine_s,
                                     reason=f"{why} (last: {slot.last_error or 'unknown'})")
        log.error("namespace %s: quarantined for %.0f s: %s", slot.namespace.name, config.policy.quarantine_s,
                  slot.quarantine.reason)
        if self.on_quarantine is not None:
            self.on_quarantine(slot.namespace.name, slot.quarantine.reason, slot.quarantine.until)
        if self.config.quarantines is not None:
            self._nursery.start_soon(self._share_quarantine, slot.namespace.name, slot.quarantine.reason)

    async def _share_quarantine(self, namespace: str, reason: str) -> None:
        """Record the quarantine where every supervisor sees it, so a namespace that moves stays quarantined."""
        assert self.config.quarantines is not None
        try:
            await trio.to_thread.run_sync(self.config.quarantines.begin, namespace, self.config.policy.quarantine_s,
                                          reason)
        except NamespaceStateUnavailable as exc:  # this supervisor's own still holds; the database is back later
            log.error("namespace %s: quarantine not shared with the other supervisors: %s", namespace, exc)

    async def _shared_quarantine(self, namespace: str) -> QuarantineRecord | None:
        """The quarantine another supervisor (or this one, before it restarted) recorded, if still in force by the
        database's clock. Unreadable: none (the local one still holds; starting is what a single host would do)."""
        if self.config.quarantines is None:
            return None
        try:
            return await trio.to_thread.run_sync(self.config.quarantines.current, namespace)
        except NamespaceStateUnavailable as exc:
            log.warning("namespace %s: shared quarantines unreadable, going by this supervisor's own: %s",
                        namespace, exc)
            return None

    async def _start(self, slot: _Slot) -> None:
        name = slot.namespace.name
        now = time.monotonic()
        quarantine = self._quarantine_of(slot, now)
        if quarantine is not None:
            until = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(quarantine.until))
            raise NamespaceQuarantined(
                f"namespace {name!r} is quarantined: its worker crashed too often — {quarantine.reason}; "
                f"new tasks are refused until {until} (in {max(quarantine.deadline - now, 0):.0f} s) or until "
                f"an operator runs `codesdk-supervisor quarantine lift {name}` — check the worker log first")
        shared = await self._shared_quarantine(name)
        if shared is not None:
            until = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(shared.until))
            raise NamespaceQuarantined(
                f"namespace {name!r} is quarantined: its worker crashed too often — {shared.reason}; new tasks are "
                f"refused until {until} or until an operator runs `codesdk-supervisor quarantine lift {name}` — "
                "check the worker log first")
        slot.starting = trio.Event()
        slot.start_scope = trio.CancelScope()
        try:
            with slot.start_scope:
                await self._launch(slot, now)
            if slot.start_scope.cancelled_caught:
                raise NamespaceFailing(SHUTTING_DOWN)
        finally:
            slot.start_scope = None
            starting, slot.starting = slot.starting, None
            starting.set()

    async def _launch(self, slot: _Slot, now: float) -> None:
        """Start the slot's worker: the body of ``_start``, cancelled (``aclose``) when the pool closes meanwhile."""
        name = slot.namespace.name
        recent = self._crashes_within(slot, self.config.policy.restart_window_s, now)
        if recent:
            delay = min(self.config.backoff_initial_s * 2 ** (recent - 1), self.config.backoff_max_s)
            log.info("namespace %s: restarting worker after %.2f s backoff", name, delay)
            await trio.sleep(delay)
        try:
            prepared = await trio.to_thread.run_sync(prepare_launch, self.config, slot.namespace, slot.placement)
        except (UidRangeError, DiskQuotaError, NamespaceStateUnavailable, UndecryptableVariable) as exc:
            # e.g. the range is exhausted, the database holding its variables unreachable: the operator's to fix
            log.error("namespace %s: %s", name, exc)
            # a key mismatch's detail (key ids, what the operator is to do) stays in the log: tasks show tenants
            told = KeyNotHeld.TENANT_MESSAGE if isinstance(exc, UndecryptableVariable) else str(exc)
            slot.last_error = told
            raise NamespaceFailing(f"namespace {name!r}: {told}") from exc
        except OSError as exc:  # out of descriptors or memory, a broken data dir: this start fails, not us
            why = (exhausted_message(f"namespace {name!r}", exc) if exc.errno in RESOURCE_ERRNOS else
                   f"namespace {name!r}: {exc}")
            log.error("preparing the directories failed: %s", why)
            raise NamespaceFailing(f"no worker could be started: {why}") from exc
        slot.env_stamp = prepared.env_stamp
        launch = prepared.launch
        label = name if slot.placement.isolation == NAMESPACED else slot.placement.key
        spec = worker_spec(launch, f"worker[{label}]",
                           runtime_env(slot.namespace, launch.env, IsolationLevel(slot.placement.isolation)))
        try:
            check_descriptor_headroom(f"namespace {name!r}")
        except WorkerResourcesExhausted as exc:  # the host's trouble, not the namespace's: no crash
            log.error("namespace %s: %s", name, exc)
            raise NamespaceFailing(f"namespace {name!r}: no worker could be started: {exc}") from exc
        adopted = await self._started_elsewhere(slot.placement.key, launch)
        if self._closing:  # closed meanwhile (``aclose`` cancels this start): start nothing more
            if adopted is not None:
                adopted.close()
                discard(adopted.child, adopted.children, self._table.scans)
            raise NamespaceFailing(SHUTTING_DOWN)
        try:
            slot.vacated = trio.Event()
            slot.worker = await self._nursery.start(self._run_worker, slot, spec, adopted)
        except Exception as exc:
            if _contains(exc, WorkerResourcesExhausted):  # the host's trouble, not the namespace's: no crash
                log.error("namespace %s: %s", name, _describe(exc))
                raise NamespaceFailing(f"namespace {name!r}: no worker could be started: {_describe(exc)}") from exc
            if self._closing:  # ended by the pool's own close: neither the namespace's fault nor a crash
                raise NamespaceFailing(SHUTTING_DOWN) from exc
            slot.last_error = f"worker failed to start: {_describe(exc)}"
            log.error("namespace %s: %s", name, slot.last_error)
            self._record_crash(slot)
            raise NamespaceFailing(f"namespace {name!r}: {slot.last_error}") from exc
        slot.workers_started += 1

    async def _started_elsewhere(self, namespace: str, launch: Launch) -> StartedProcess | None:
        """The namespace's worker started ahead of us (``offer``), or forked by the template; None: spawn it."""
        headstart = self._headstarts.pop(namespace, None)
        taken = headstart.take(launch) if headstart is not None else None
        if taken is not None:
            return taken
        if self._template is None:
            return None
        try:
            return await self._template.fork(self._nursery, launch)
        except TemplateUnavailable as exc:
            log.info("namespace %s: starting its worker without the template: %s", namespace, exc)
            return None

    async def _run_worker(self, slot: _Slot, spec: WorkerSpec, adopted: StartedProcess | None,
                          task_status: trio.TaskStatus[WorkerProcess] = trio.TASK_STATUS_IGNORED) -> None:
        vacated = slot.vacated
        worker: WorkerProcess | None = None
        try:
            async with trio.open_nursery() as nursery:
                groups = self.config.groups
                placed = (partial(groups.place_worker, slot.namespace.name, leaf=slot.placement.group_leaf)
                          if groups is not None else None)
                worker = await WorkerProcess.start(nursery, spec, self.config.handshake_timeout_s, adopted,
                                                   children=self.config.children, table=self._table, placed=placed)
                slot.started_by = ("new interpreter" if adopted is None else
                                   "template" if isinstance(adopted.child, ForkedChild) else "ahead")
                log.info("namespace %s: worker pid %d ready (%s)", slot.namespace.name, worker.pid, {
                    "template": "forked by the template", "ahead": "started ahead"}.get(slot.started_by,
                                                                                      slot.started_by))
                heard, watch = _Heard(), trio.CancelScope()
                nursery.start_soon(self._pump_events, worker, heard)
                nursery.start_soon(self._watch_liveness, slot, worker, heard, watch)
                task_status.started(worker)
                await worker.wait_exit()
                watch.cancel()
        finally:
            # Output has ended, every event was handed over, and the process is reaped — also when the pool is
            # being cancelled from outside (the watcher reaps it then), so the exit is always reported.
            with trio.CancelScope(shield=True):
                try:
                    if worker is not None:
                        await self._worker_gone(slot, worker)
                finally:
                    vacated.set()

    async def _worker_gone(self, slot: _Slot, worker: WorkerProcess) -> None:
        with trio.move_on_after(REAP_WAIT_S):
            await worker.exited.wait()
        status = worker.exit_status or ExitStatus(None, 9)
        if self.config.groups is not None:  # a daemon that escaped the worker's tree dies with it here
            await trio.to_thread.run_sync(self.config.groups.worker_ended, slot.namespace.name,
                                          slot.placement.group_leaf)
        slot.last_exit = status
        if slot.worker is worker:
            slot.worker = None
            slot.active = 0
            if slot.idle_scope is not None:
                slot.idle_scope.cancel()
                slot.idle_scope = None
        if not worker.stopping:
            hung, slot.hung = slot.hung, None
            slot.last_error = (f"worker pid {worker.pid} {status.describe()}" if hung is None else
                               f"worker pid {worker.pid} {hung}: killed as hung")
            log.error("namespace %s: %s", slot.namespace.name, slot.last_error)
            self._record_crash(slot)
        await self._on_exit(slot.namespace.name, worker, status)

    async def _watch_liveness(self, slot: _Slot, worker: WorkerProcess, heard: _Heard,
                              scope: trio.CancelScope) -> None:
        """Ping the worker every ``liveness_interval_s``; one that neither answers nor sends anything for
        ``liveness_timeout_s`` is frozen (SIGSTOP, a deadlock, a blocked loop) and is killed as crashed."""
        every, bound = self.config.policy.liveness_interval_s, self.config.policy.liveness_timeout_s
        if every <= 0:
            return
        with scope:
            while True:
                await trio.sleep(every)
                if worker.exited.is_set() or worker.stopping:
                    return
                asked = trio.current_time()
                with trio.move_on_after(bound) as waited:
                    try:
                        await worker.connection.request(Rpc.PING, NoParams())
                    except RpcError as exc:  # answered, if not as asked: alive
                        log.warning("namespace %s: worker pid %d refused the liveness ping: %s",
                                    slot.namespace.name, worker.pid, exc)
                    except WorkerError:
                        return  # gone: its exit is reported as usual
                if not waited.cancelled_caught:
                    heard.at = trio.current_time()
                elif heard.at < asked and not heard.handing_over:  # no answer, no event, and none unread
                    await self.kill_hung(slot.namespace.name, worker,
                                         f"answered no liveness ping and sent nothing for {bound:g} s")
                    return

    async def _pump_events(self, worker: WorkerProcess, heard: _Heard) -> None:
        """Hand events over in order, in batches of whatever has queued up meanwhile (up to EVENT_BATCH)."""
        events = worker.connection.events
        async for first in events:
            heard.at = trio.current_time()
            batch = [first]
            while len(batch) < EVENT_BATCH:
                try:
                    batch.append(events.receive_nowait())
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
            heard.handing_over = True
            try:
                await self._on_event(worker, batch)
            except Exception:  # a worker's bad event must never take the supervisor down; it is logged
                log.exception("%s: events could not be handled (%d in batch); dropped", worker.spec.name, len(batch))
            finally:
                heard.handing_over = False
                heard.at = trio.current_time()
            del batch, first  # handed over: not held here until the worker sends again (a quiet worker kept them)

    async def _env_changed(self, slot: _Slot) -> bool:
        try:
            stamp = await trio.to_thread.run_sync(self.namespace_env.stamp, slot.namespace.name)
        except NamespaceStateUnavailable as exc:  # the worker it has stays until the stamp can be read again
            log.warning("namespace %s: cannot tell whether its variables changed: %s", slot.namespace.name, exc)
            return False
        return stamp != slot.env_stamp

    def _retire(self, slot: _Slot, worker: WorkerProcess, why: str) -> None:
        """Shut an idle worker down (not a crash); the namespace's next task starts a fresh one."""
        if worker.stopping or slot.worker is not worker or slot.active:
            return
        log.info("namespace %s: %s; restarting its idle worker", slot.namespace.name, why)
        worker.stopping = True  # now, so that no acquire hands it out meanwhile
        self._nursery.start_soon(worker.shutdown, self.config.policy.shutdown_grace_s)

    async def _idle_timer(self, slot: _Slot, worker: WorkerProcess, scope: trio.CancelScope) -> None:
        with scope:
            if await self._env_changed(slot):  # became idle with variables that changed while it was busy
                self._retire(slot, worker, "its stored variables changed while it was busy")
                return
            await trio.sleep(self.config.policy.idle_timeout_s)
            if slot.worker is worker and slot.active == 0:
                log.info("namespace %s: worker idle for %.0f s; shutting it down", slot.namespace.name,
                         self.config.policy.idle_timeout_s)
                await worker.shutdown(self.config.policy.shutdown_grace_s)


def worker_spec(launch: Launch, name: str, runtime_env: RuntimeEnv | None = None) -> WorkerSpec:
    """How the worker client starts a worker launched as ``launch``."""
    return WorkerSpec(argv=launch.argv, env=launch.env, cwd=launch.cwd, name=name, runtime_env=runtime_env,
                      user=launch.user, group=launch.group, extra_groups=launch.extra_groups)


def runtime_env(namespace: Namespace, env: Mapping[str, str],
                isolation: IsolationLevel = IsolationLevel.NAMESPACED) -> RuntimeEnv:
    """The safe view sent to the worker: paths and variable names, never values of other variables."""
    return RuntimeEnv(
        namespace=namespace.name, isolation=isolation, mode=IsolationMode.SUBPROCESS,
        home=env["HOME"], xdg_config_home=env["XDG_CONFIG_HOME"], xdg_state_home=env["XDG_STATE_HOME"],
        xdg_cache_home=env["XDG_CACHE_HOME"], xdg_data_home=env["XDG_DATA_HOME"], tmpdir=env["TMPDIR"],
        path=env["PATH"], variable_names=tuple(sorted(env)),
    )
