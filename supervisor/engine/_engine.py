"""The task engine: sessions and tasks over the store, the workers and the owned tools.

The engine is the only writer of events. It enforces the contract's invariants: one active task per
session; ``task.started`` first and exactly one terminal event last; nothing stored after a terminal
event (later worker events are dropped and counted); per tool-call attempt requested ->
policy_evaluated* -> approved|denied -> started -> completed (the last two only if approved, see ``ToolFlow``).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import trio

from pydantic import ValidationError

from codesdk.protocol import (
    InputBlock,
    ModelInputAppended,
    SendInputParams,
    SendInputResult,
    CONTRACT_VERSION,
    BudgetLimits,
    BudgetRaised,
    BudgetReached,
    NormalizedEvent,
    PriceTable,
    SessionBudget,
    first_reached,
    INPUT_SHARE,
    CanonicalizationError,
    config_refusal,
    ContextTooLarge,
    DescribeEnvParams,
    EnsureLoginResult,
    ErrorCode,
    EventType,
    GetAuthStatusParams,
    InteractionMode,
    IsolationLevel,
    Message,
    Model,
    PermissionMode,
    ResumeMode,
    Rpc,
    RuntimeInfo,
    RuntimeOffer,
    ForkPoint,
    SessionCreated,
    SessionRef,
    StartTaskParams,
    StartTaskResult,
    StopReceipt,
    TaskFailed,
    TaskFailureCode,
    TaskStarted,
    TaskStopped,
    Trace,
    TraceContext,
    TraceParent,
    WorkerAnswer,
    canonical_json,
    check_runtime_name,
)

from codesdk.procs.orphans import Orphans
from ..audit import audit
from ..ids import is_id, new_id
from ..namespaces import (
    VOLUMES_DIR,
    NamespaceBudgets,
    NamespaceState,
    DiskQuotaError,
    DiskUsage,
    InvalidNamespace,
    Namespace,
    is_disk_full,
    make_workspace,
)
from ..namespaces import WorkspaceRefused as WorkspacePathRefused
from ..store import (
    COMMIT_LINGER_S,
    LEASE_S,
    DroppedSession,
    EventDraft,
    EventStore,
    InvalidTransition,
    Leases,
    PostgresLeases,
    Quotas,
    Recorder,
    SessionRecord,
    SoleLeases,
    StoreError,
    TaskRecord,
    TaskState,
    TaskUpdate,
    UnknownSession,
    open_postgres,
)
from ..store import SessionBusy as StoredSessionBusy
from ..tools import Approver
from ..workers.launch import Placement, PoolConfig
from codesdk.worker.client import InvalidResult, RpcError, WorkerError
from ..workers.pool import WorkerPool
from codesdk.worker.client import REAP_WAIT_S
from ._approvals import APPROVAL_TIMEOUT_S, ApprovalBroker
from ._audience import Audience, RoutingPolicy
from ._questions import Answerer, QuestionBroker, QuestionPolicy
from ._grants import GrantBook
from ._compile import compile_input, context_window
from ._lifecycle import (
    check_isolation,
    events_to_fork,
    made_workspace,
    placement_of,
    remove_ephemeral_home,
    remove_workspace,
    sweep_ephemeral_homes,
)
from ._telemetry import Observers
from ._budgets import Budgets
from ._deadlines import DeadlineLimits, TaskClock
from ._ending import REQUEST_TIMEOUT_S, TaskEnder
from ._errors import (
    ApproverRequired,
    BudgetNotPaused,
    EngineError,
    InsufficientSpace,
    NamespaceDiskFull,
    InvalidTaskInput,
    NamespaceElsewhere,
    NamespaceUnavailable,
    RuntimeUnavailable,
    SessionBusy,
    TaskNotActive,
    UnknownRuntime,
    WorkspaceMissing,
    WorkspaceRefused,
)
from ._intake import EventIntake
from ._leasing import Leasing
from ._ports import PoolWorkers, WorkerLink, WorkersFactory, pool_workers
from ._recorder import RunRecorder
from ._requests import WorkerEnvironment, ask as _ask
from ._runs import EngineStats, PendingEvent, RunTable, TaskRun
from ._steering import send_input
from ._stopping import (
    TOOLS_WAIT_S,
    StopInProgress,
    call_endings,
    calls_in_flight,
    end_wait_s,
    stop_in_worker,
)
from ._toolflow import ToolFlow, Tooling
from ._toolport import EnginePort

#: The refusals re-exported here are for modules that imported them from ``_engine`` before ``_errors``
#: existed; import them from ``supervisor.engine``.
__all__ = ["Engine", "EngineConfig", "EngineError", "InvalidTaskInput", "TaskNotActive"]

log = logging.getLogger("codesdk.supervisor.engine")

#: Ended runs remembered so their late events are recognised (and counted) rather than "unknown task".
RECENT_RUNS_KEPT = 1000
#: The prompt of the task a raise of a paused budget starts to go on with the work (``raise_budget``).
CONTINUE_PROMPT = ("Continue the previous task where it stopped: it was paused when it reached its budget, which has "
                   "now been raised.")
#: Seconds a new task waits for the worker to let go of the session's previous (stopped) task.
RELEASE_WAIT_S = 15.0


#: Free bytes a new session or task needs on the file systems of the data dir and of its workspace: room for its
#: events, blobs and the runtime's files, and for the terminal events of the tasks already running.
DISK_RESERVE_BYTES = 256 << 20


def free_bytes(path: Path) -> int:
    """Bytes free to unprivileged writers on the file system holding ``path`` (its nearest existing ancestor)."""
    while not path.exists() and path.parent != path:
        path = path.parent
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize


def _mib(n: int) -> str:
    """A size as people read it: MiB up to a GiB, then GiB, TiB."""
    for unit, shift in (("TiB", 40), ("GiB", 30)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):,.1f} {unit}"
    return f"{n / (1 << 20):.1f} MiB"


@dataclass(frozen=True)
class EngineConfig:
    data_dir: Path
    pool: PoolConfig
    default_runtime: str = "scripted"
    workspaces_dir: Path | None = None
    approval_timeout_s: float = APPROVAL_TIMEOUT_S
    #: How long a runtime's question waits for its user, and what it becomes then (``--question-timeout`` /
    #: ``--question-fallback``).
    questions: QuestionPolicy = field(default_factory=QuestionPolicy)
    #: What an approval or question nobody can answer becomes, and when a pending one escalates (``serve
    #: --unattended``, ``--unattended-wait``, ``--escalate-after``). None: each waits its whole timeout, as an
    #: embedded engine's (whose tasks have their own approver) always did.
    routing: RoutingPolicy | None = None
    store_vfs: str | None = None  # a registered SQLite VFS for the store (fault-injection tests)
    #: A PostgreSQL URL: the store several supervisors share, with namespace leases (None: SQLite in data_dir).
    store: str | None = None
    #: Seconds a namespace lease outlives its holder's last renewal (PostgreSQL only; see ``store.Leases``).
    lease_s: float = LEASE_S
    holder: str = "a CodeSDK supervisor"  # who we are, to a second process that finds the data dir locked
    #: Per-tenant limits: checked when a task is admitted (``start_task``) and whenever its events are stored.
    quotas: Quotas = field(default_factory=Quotas)
    #: Readiness and admission refuse (``InsufficientSpace``) when the data dir's or the workspace's file system has
    #: less free than this (0: not checked).
    disk_reserve_bytes: int = DISK_RESERVE_BYTES
    #: How free space is measured (the seam tests replace): free bytes of the file system holding a path.
    free_space: Callable[[Path], int] = free_bytes
    #: Tasks' deadlines: the operator's defaults and maxima for ``timeout_s`` and ``idle_timeout_s``.
    deadlines: DeadlineLimits = field(default_factory=DeadlineLimits)
    #: The longest a paced stream's events wait for other sessions' to share their commit (the store writer's
    #: "Linger"; ``serve --commit-linger-ms``; 0: never).
    commit_linger_s: float = COMMIT_LINGER_S
    #: The time of day (the seam tests replace): a task left running by a supervisor that is gone is told it passed
    #: its stored deadline by it.
    wall_clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    #: The operator's prices per model (``serve --price-table``): the cost of usage a runtime reports without one.
    prices: PriceTable = field(default_factory=PriceTable)
    #: Where namespaces' variables, limits and quarantines are kept (``open_namespace_state``); None: the data
    #: dir's files, as ``pool.variables`` (the same instance, set by whoever makes both).
    namespace_state: NamespaceState | None = field(default=None, compare=False)


class Engine:
    """Sessions and tasks. ``workers`` makes where the engine gets each namespace's worker: the pool of real
    worker processes unless a test gives a double (see ``_ports``)."""

    def __init__(self, config: EngineConfig, store: Recorder, tooling: Tooling, nursery: trio.Nursery, *,
                 workers: WorkersFactory = pool_workers, leases: Leases | None = None) -> None:
        self.config = config
        self.store = store
        self.tooling = tooling
        self._nursery = nursery
        self.stats = EngineStats()
        #: Who watches its tasks (``observe(...)``: the service's metrics and tracer).
        self.observers = Observers()
        self._runs = RunTable(RECENT_RUNS_KEPT)
        self._ender = TaskEnder(store, self._runs, nursery)
        self._recorder = RunRecorder(store, config.quotas, self._ender.over_quota)
        #: Who can answer approvals and questions: the API's event streams count themselves in (``attached``);
        #: the service sets its webhook registry as ``audience.webhooks``.
        self.audience = Audience()
        self.approvals = ApprovalBroker(store, config.approval_timeout_s, tooling.input_problems,
                                        audience=self.audience, routing=config.routing, append=self._recorder.append)
        self.grants = GrantBook(store, config.quotas)
        self.questions = QuestionBroker(store, self._recorder, config.questions, audience=self.audience,
                                        routing=config.routing)
        self._ender.question_ends = self.questions.close_for_end
        #: Budgets: tasks' and sessions' limits, the namespaces' monthly spend (``_budgets``).
        self.budgets = Budgets(store, self._recorder, config.prices, config.namespace_state.budgets if config.namespace_state else
                               NamespaceBudgets(config.data_dir),
                               config.wall_clock, start_stop=self._start_stop)
        tools = ToolFlow(EnginePort(store, self._recorder, tooling, self.approvals, self.grants), self.stats)
        intake = EventIntake(store, self._runs, self.stats, self._recorder, tools, self._ender, self.questions,
                             budgets=self.budgets)
        #: the namespaces' turns at the event path (weighted deficit round robin; ``codesdk.supervisor.fair``)
        self.turns = intake.turns
        self._workers = workers(config.pool, nursery, intake.on_events, intake.on_exit)
        self.leasing = Leasing(store, leases or SoleLeases(), self._runs, self.approvals, self._workers.let_go,
                               wall_clock=config.wall_clock, questions=self.questions)

    @classmethod
    @asynccontextmanager
    async def open(cls, config: EngineConfig, tooling: Tooling, *,
                   workers: WorkersFactory = pool_workers) -> AsyncIterator[Engine]:
        async with _open_store(config) as store, _open_leases(config, store) as leases, \
                trio.open_nursery() as nursery:
            store.commit_linger_s = config.commit_linger_s
            engine = cls(config, store, tooling, nursery, workers=workers, leases=leases)
            store.fence_with(lambda: leases.epochs, engine.leasing.fenced)  # before any write for a namespace
            await engine.leasing.recover()
            await sweep_ephemeral_homes(store, config.pool.data_dir)  # sessions deleted while we were down
            await nursery.start(engine.leasing.keep)
            # What dead workers and tools left is re-parented to us; the sweep asks the registry of this process's
            # children, the one its spawners own their children in (``PoolConfig.children``), what to leave alone.
            orphans = Orphans(config.pool.children)
            nursery.start_soon(orphans.forever)
            try:
                yield engine
            finally:
                with trio.CancelScope(shield=True):
                    await engine._close()
                    await orphans.end_adopted(REAP_WAIT_S)
                nursery.cancel_scope.cancel()

    @property
    def pool(self) -> WorkerPool:
        """The pool of worker processes (status, quarantines, namespace variables, for operators)."""
        if not isinstance(self._workers, PoolWorkers):
            raise TypeError("this engine was given worker doubles: it has no pool of worker processes")
        return self._workers.pool

    async def stop_all(self) -> list[str]:
        """End every running task with ``task.stopped`` ("supervisor shutting down"), committed; the ids of the
        sessions they belong to. The service calls it first when it drains, so that open event streams can be
        given those events before they end; closing the engine calls it again for whatever is left."""
        sessions: list[str] = []
        for run in self._runs.active_runs():
            try:
                await self._ender.finish(run, EventType.TASK_STOPPED, TaskStopped(reason="supervisor shutting down",
                                                                                    requested_by="supervisor"))
                sessions.append(run.session_id)
            except StoreError as exc:  # torn down from outside: the store is gone; the task stays "running"
                log.error("task %s could not be marked stopped: %s", run.task_id, exc)
        return sessions

    async def _close(self) -> None:
        await self.stop_all()
        await self._workers.aclose()
        if self.config.pool.disks is not None:  # the namespaces' volumes: remounted by the next start
            await trio.to_thread.run_sync(self.config.pool.disks.unmount_all)

    # -- sessions -------------------------------------------------------------------------------

    async def create_session(self, *, runtime: str | None = None, namespace: str = "default",
                             workspace: Path | None = None, metadata: dict[str, Any] | None = None,
                             session_id: str | None = None, title: str | None = None,
                             isolation: IsolationLevel = IsolationLevel.NAMESPACED,
                             budget: BudgetLimits | None = None) -> SessionRecord:
        """A new session and its ``session.created``. ``InvalidNamespace``; ``WorkspaceRefused``; ``InsufficientSpace``;
        ``InvalidTaskInput``
        for a name no runtime can have (``protocol.RUNTIME_NAME_PATTERN``); ``IsolationRefused``.

        ``isolation``: where its runtime's HOME is — the namespace's (``namespaced``), one made for the session and
        removed with it (``ephemeral``), or the service user's own (``shared``: ``check_isolation``). Each level
        other than ``namespaced`` runs in a worker of its own (``placement_of``).

        ``session_id``: one chosen ahead (``new_id("ses")``: ``codesdk run`` chooses it, and makes the default
        workspace, before the supervisor is even imported); the default workspace is that session's own either way,
        so it is removed (if still empty) when the session is refused."""
        Namespace.parse(namespace)  # InvalidNamespace with a clear message
        runtime = _runtime_name(runtime or self.config.default_runtime)
        isolation = _isolation_level(isolation)
        check_isolation(isolation, namespace, self.config.pool.worker_uids)
        await self.leasing.own(namespace)  # its workspace and worker are on the supervisor that runs it
        if session_id is not None and not is_id(session_id, "ses"):
            raise ValueError(f"not a session id: {session_id!r}")
        self._check_space(workspace if workspace is not None else self.config.workspaces_dir)
        session_id = session_id or new_id("ses")
        made = workspace is None or not workspace.exists()
        if workspace is None:
            workspace = await self._default_workspace(namespace, session_id)
        workspace = await self._prepare_workspace(workspace, namespace)
        try:
            record = await self.store.create_session(session_id, runtime=runtime, namespace=namespace,
                                                     workspace=str(workspace), metadata=metadata,
                                                     quotas=self.config.quotas, title=title, isolation=isolation,
                                                     budget=None if budget is None else SessionBudget(limits=budget))
        except BaseException:
            if made:  # nothing of the refused session is left behind (its workspace is still empty)
                with trio.CancelScope(shield=True), contextlib.suppress(OSError):
                    await trio.to_thread.run_sync(workspace.rmdir)
            raise
        await self.store.append(session_id, [EventDraft(
            type=EventType.SESSION_CREATED, runtime=RuntimeInfo(name=runtime),
            payload=SessionCreated(contract_version=CONTRACT_VERSION, runtime=runtime, namespace=namespace,
                                   workspace=str(workspace), metadata=metadata or {}, title=title),
            trace=Trace(session_id=session_id))])
        return record.model_copy(update={"last_seq": record.last_seq + 1})  # its session.created, just stored

    async def _default_workspace(self, namespace: str, session_id: str) -> Path:
        root = (self.config.workspaces_dir or await self._namespace_workspaces(namespace)
                or self.config.data_dir / "workspaces")
        return root / session_id

    def _workspace_roots(self) -> list[Path]:
        """Where the service makes sessions' default workspaces (a namespace volume's aside)."""
        return [root for root in (self.config.workspaces_dir, self.config.data_dir / "workspaces") if root is not None]

    async def update_session(self, session_id: str, *, title: str | None = None, archived: bool | None = None,
                             metadata: dict[str, Any] | None = None, by: str) -> SessionRecord:
        """Retitle the session (``""``: no title), archive or unarchive it, and/or replace its metadata (None: as
        it is); a change of its archiving is audited, as done ``by`` whom."""
        before = await self.store.get_session(session_id)
        await self.leasing.own(before.namespace)  # written by the supervisor that runs the namespace (fencing)
        record = await self.store.update_session(session_id, title=title, archived=archived, metadata=metadata)
        if archived is not None and archived != (before.archived_at is not None):
            audit("session.archived" if archived else "session.unarchived", by, session=session_id,
                  namespace=record.namespace)
        return record

    async def fork_session(self, session_id: str, *, at_seq: int | None = None, title: str | None = None,
                           metadata: dict[str, Any] | None = None, new_workspace: bool = False,
                           by: str) -> SessionRecord:
        """A new session whose first events are copies of ``session_id``'s up to ``at_seq`` (``events_to_fork``:
        ``ForkInsideTask``, ``ForkPastEnd``), in its namespace and on its runtime, with the same workspace or
        (``new_workspace``) an empty one of its own. Its runtime is given the copied transcript on its first task
        (a fork has no runtime session id). ``QuotaExceeded`` as a new session and as its copied events.

        It keeps the session's isolation level: a fork of an ephemeral session gets a new, empty HOME of its own
        (nothing of the parent's runtime state — its login cache least of all — is copied); ``IsolationRefused``
        for a shared one where ``shared`` is no longer allowed."""
        parent = await self.store.get_session(session_id)
        check_isolation(parent.isolation, parent.namespace, self.config.pool.worker_uids)
        await self.leasing.own(parent.namespace)
        events, cut = await events_to_fork(self.store, session_id, at_seq)
        fork_id = new_id("ses")
        workspace = Path(parent.workspace) if parent.workspace is not None else None
        made = None
        if new_workspace or workspace is None:
            self._check_space(self.config.workspaces_dir)
            made = workspace = await self._prepare_workspace(await self._default_workspace(parent.namespace, fork_id),
                                                             parent.namespace)
        origin = ForkPoint(session_id=session_id, seq=max(cut, 1))
        title = title or parent.title
        metadata = parent.metadata if metadata is None else metadata
        record = SessionRecord(session_id=fork_id, runtime=parent.runtime, namespace=parent.namespace,
                               workspace=str(workspace), created_at=datetime.now(UTC), metadata=metadata,
                               title=title, forked_from=origin, isolation=parent.isolation,
                               budget=fork_budget(parent.budget, events))
        created = EventDraft(
            type=EventType.SESSION_CREATED, runtime=RuntimeInfo(name=parent.runtime), trace=Trace(session_id=fork_id),
            payload=SessionCreated(contract_version=CONTRACT_VERSION, runtime=parent.runtime,
                                   namespace=parent.namespace, workspace=str(workspace), metadata=metadata,
                                   title=title, forked_from=origin))
        try:
            forked = await self.store.fork_session(session_id, created, events, record=record,
                                                   quotas=self.config.quotas)
        except BaseException:
            if made is not None:  # nothing of the refused fork is left behind
                with contextlib.suppress(OSError):
                    await trio.to_thread.run_sync(made.rmdir)
            raise
        audit("session.forked", by, session=fork_id, forked_from=session_id, at_seq=origin.seq,
              namespace=parent.namespace, events=len(events) + 1)
        return forked

    async def delete_session(self, session_id: str, *, by: str) -> tuple[DroppedSession, bool]:
        """Delete an idle session (``SessionBusy`` while a task of it is pending or running): the store's part
        (``EventStore.drop_session``), then its default workspace unless another session works in it. Returns what
        was dropped and whether the workspace was removed."""
        session = await self.store.get_session(session_id)
        await self.leasing.own(session.namespace)  # its workspace is on the supervisor that runs the namespace
        try:
            dropped = await self.store.drop_session(session_id)
        except StoredSessionBusy as exc:
            raise SessionBusy(session_id, exc.active_task_id, then="stop it before deleting the session") from exc
        self.grants.forget(session_id)
        removed = False
        workspace = made_workspace(session.workspace, self._workspace_roots(), self.config.data_dir)
        if workspace is not None and not dropped.workspace_shared:
            removed = await trio.to_thread.run_sync(remove_workspace, workspace)
        home_removed = None
        if session.isolation == IsolationLevel.EPHEMERAL:  # its own worker first: nothing may hold its HOME then
            await self._workers.session_ended(placement_of(session))
            home_removed = await remove_ephemeral_home(self.store, self.config.pool, session.namespace, session_id)
        audit("session.deleted", by, session=session_id, namespace=session.namespace, events=dropped.events,
              stored_bytes=dropped.stored_bytes, blobs=len(dropped.blobs), workspace_removed=removed,
              **({"home_removed": home_removed} if home_removed is not None else {}))
        return dropped, removed

    def space_shortage(self, workspace: Path | None = None) -> str | None:
        """What lacks the free space a task needs (``EngineConfig.disk_reserve_bytes``): the data dir's file system,
        then the workspace's (when given), said as one actionable line; None when both have enough."""
        reserve = self.config.disk_reserve_bytes
        if reserve <= 0:
            return None
        places = [("data dir", self.config.data_dir)]
        if workspace is not None:
            places.append(("workspace", workspace))
        volumes = self.config.data_dir.resolve() / VOLUMES_DIR  # workspaces are kept as real paths
        for what, path in places:
            if path.parent.parent.parent == volumes:
                continue  # on its namespace's own disk, bounded by its quota: not the shared disk the reserve keeps
            try:
                free = self.config.free_space(path)
            except OSError as exc:
                return f"the free space of the {what} {path} cannot be measured: {exc}"
            if free < reserve:
                return (f"the {what} {path} has only {_mib(free)} free on its file system; a task needs "
                        f"{_mib(reserve)} (the disk reserve): free space there, then retry")
        return None

    async def _check_workspace_here(self, session: SessionRecord) -> None:
        """``WorkspaceMissing`` if the session's workspace is not on this host, before anything is stored: a task
        there would run with no files while its transcript says they exist (a namespace that moved here from
        another supervisor, without shared storage, or a workspace removed by hand). A namespace with a disk quota
        is left to its worker's start, which mounts its volume (where its workspaces are) or says why it cannot."""
        disks, workspace = self.config.pool.disks, session.workspace
        if not workspace:
            return

        def missing() -> bool:  # a file read, or a query on PostgreSQL: off the loop
            try:
                if disks is not None and disks.quota_for(session.namespace) is not None:
                    return False
            except (DiskQuotaError, OSError):
                return False  # unknown here: the worker's start reads the quota again and says what is wrong
            return not Path(workspace).is_dir()

        if not await trio.to_thread.run_sync(missing):
            return
        raise WorkspaceMissing(
            f"session {session.session_id}'s workspace {session.workspace} is not on this host: it was removed, or "
            f"namespace {session.namespace} moved here from another supervisor whose files this host does not share "
            "(its sessions go on with their files only where every host mounts the data dir's workspaces and "
            "namespaces on shared storage at the same path: docs/operations.md, \"Past one machine\"); start a "
            "new session, or ask the operator")

    def _check_space(self, workspace: Path | None = None) -> None:
        if (shortage := self.space_shortage(workspace)) is not None:
            raise InsufficientSpace(shortage)

    async def _namespace_workspaces(self, namespace: str) -> Path | None:
        """Where the namespace's default workspaces go when it has a disk quota: on its volume (mounted now), so
        they count against it; else None."""
        disks = self.config.pool.disks
        if disks is None or disks.quota_for(namespace) is None:
            return None
        try:  # a namespace already running on the host disk moves onto its volume at its next worker start
            volume = await trio.to_thread.run_sync(
                lambda: disks.ensure(Namespace.parse(namespace), move_files_in=False))
        except (DiskQuotaError, OSError) as exc:
            raise NamespaceUnavailable(f"namespace {namespace}'s disk cannot be mounted: {exc}") from exc
        return disks.workspaces(namespace) if volume is not None else None

    async def _prepare_workspace(self, workspace: Path, namespace: str) -> Path:
        """The checked workspace, created, and the namespace's own with per-namespace uids."""
        try:
            return await trio.to_thread.run_sync(make_workspace, workspace, namespace, self.config.pool.data_dir,
                                                 self.config.pool.worker_uids)
        except WorkspacePathRefused as exc:
            raise WorkspaceRefused(str(exc)) from exc
        except OSError as exc:
            if not is_disk_full(exc):
                raise
            raise NamespaceDiskFull(f"namespace {namespace}'s disk is full{_fill_of(workspace.parent)}, so a new "
                                    "session's workspace does not fit: delete files from its workspaces, or ask the "
                                    "operator for a larger quota") from exc

    # -- tasks ----------------------------------------------------------------------------------

    async def start_task(self, session_id: str, prompt: str, *, permission_mode: PermissionMode = PermissionMode.ASK,
                         interaction_mode: InteractionMode = InteractionMode.NON_INTERACTIVE,
                         runtime_config: dict[str, Any] | None = None, approver: Approver | None = None,
                         answerer: Answerer | None = None, durable_approvals: bool = False, trace: TraceContext | None = None,
                         traceparent: TraceParent | None = None,
                         runtime: str | None = None, max_input_tokens: int | None = None,
                         timeout_s: float | None = None, idle_timeout_s: float | None = None,
                         budget: BudgetLimits | None = None) -> TaskRecord:
        """Record the task and ``task.started``; the runtime is driven in the background, given the session's
        transcript compiled for it.

        ``runtime``: move the session to this runtime from this task on (by reconstruction: the new runtime gets
        the transcript); the move is kept once the task ends completed or stopped (``TaskEnder.finish``): a task
        that fails there leaves the session where it was. ``max_input_tokens``: a cap on the
        compiled input, below the runtime's own budget. ``traceparent``: the caller's W3C trace, which the task's
        spans join (``trace``: its ids, stored in every event's ``trace``). ``timeout_s`` / ``idle_timeout_s``: the task's deadlines
        (None: the operator's default, ``EngineConfig.deadlines``); past one the task is stopped, with its receipt,
        and fails ``TASK_TIMEOUT`` (``_deadlines``).

        Refusals (nothing stored): ``SessionBusy``, ``InsufficientSpace`` (the data dir's or the workspace's file
        system is short of the disk reserve), ``ApproverRequired``, ``InvalidTaskInput``, and the store's
        ``QuotaExceeded`` (admission) and ``UnknownSession``."""
        session = await self.store.get_session(session_id)
        await self.leasing.own(session.namespace)  # its worker runs on the supervisor holding its lease
        busy = self._runs.active_in(session_id)
        if busy is not None:
            raise SessionBusy(session_id, busy.task_id)
        self._check_space(Path(session.workspace) if session.workspace else None)
        await self._check_workspace_here(session)
        task_id = new_id("task")
        meter = await self.budgets.admit(session, task_id, budget)  # BudgetPaused, MonthlyBudgetSpent
        if durable_approvals:  # decisions come from whoever decides the stored approval (the HTTP API)
            interaction_mode, approver = InteractionMode.INTERACTIVE, None
        elif interaction_mode == InteractionMode.INTERACTIVE and approver is None:
            raise ApproverRequired("an interactive task needs an approver (or durable_approvals, decided over the API)")
        if max_input_tokens is not None and (not isinstance(max_input_tokens, int) or isinstance(max_input_tokens, bool)
                                             or not 1 <= max_input_tokens <= 2**53):
            raise InvalidTaskInput(f"max_input_tokens must be a whole number of tokens from 1 to 2^53, not "
                                   f"{max_input_tokens!r}")
        timeout_s, idle_timeout_s = self.config.deadlines.resolve(timeout_s, idle_timeout_s)
        target = _runtime_name(runtime or session.runtime)
        switched_from = session.runtime if target != session.runtime else None
        runtime_session_id = None if switched_from else session.runtime_session_id  # another runtime's id is no use
        params = StartTaskParams(
            runtime=target, session=SessionRef(session_id=session_id, runtime_session_id=runtime_session_id),
            task_id=task_id, workspace=session.workspace, messages=(Message.user_text(prompt),),
            tool_manifest=self.tooling.manifest(), permission_mode=permission_mode,
            interaction_mode=interaction_mode, runtime_config=runtime_config or {}, trace=trace or TraceContext())
        started = TaskStarted(task_id=task_id, prompt_preview=prompt[:200], permission_mode=permission_mode,
                              interaction_mode=interaction_mode, runtime_config=runtime_config or {},
                              timeout_s=timeout_s, idle_timeout_s=idle_timeout_s)
        _check_storable(params, started)
        async with self.turns.turn(session.namespace, 1):  # a light turn: a flood elsewhere waits, not this
            record = await self._admit(session, task_id, prompt, target)
            tr = params.trace
            run = TaskRun(task_id=task_id, session=session, params=params, approver=approver, answerer=answerer,
                          prompt=prompt,
                          max_input_tokens=max_input_tokens, switched_from=switched_from,
                          trace=Trace(session_id=session_id, task_id=task_id, request_id=tr.request_id,
                                      client_id=tr.client_id, user_id=tr.user_id),
                          runtime=RuntimeInfo(name=target, runtime_session_id=runtime_session_id),
                          clock=TaskClock.arm(timeout_s, idle_timeout_s), meter=meter,
                          telemetry=self.observers.task(task_id=task_id, session_id=session_id,
                                                        namespace=session.namespace, runtime=target,
                                                        request_id=tr.request_id, client_id=tr.client_id,
                                                        parent=traceparent))
            await self._record_start(run, started)
        self._nursery.start_soon(self._drive, run, name=f"drive:{task_id}")
        return record

    async def _admit(self, session: SessionRecord, task_id: str, prompt: str, runtime: str) -> TaskRecord:
        """The task's row. Admission (``QuotaExceeded``, nothing stored): the session and namespace are under
        their stored-data quotas and the namespace runs fewer tasks than it may — checked in the transaction
        that records the task, as is the session's one active task."""
        try:
            return await self.store.create_task(session.session_id, task_id, runtime=runtime,
                                                metadata={"prompt_preview": prompt[:200]}, quotas=self.config.quotas)
        except StoredSessionBusy as exc:
            raise SessionBusy(session.session_id, exc.active_task_id) from exc

    async def _record_start(self, run: TaskRun, started: TaskStarted) -> None:
        """Store ``task.started``; a start that fails halfway still ends the task."""
        try:
            self._runs.add(run)
            await self.store.append(run.session_id, [self._draft(run, EventType.TASK_STARTED, started)],
                                    idempotency_key=f"{run.task_id}:started")
        except BaseException as exc:  # the task row exists: it ends now, with exactly one terminal event
            self._runs.discard(run)
            with trio.CancelScope(shield=True):
                await self._abandon(run, started, exc)
            raise

    async def _abandon(self, run: TaskRun, started: TaskStarted, exc: BaseException) -> None:
        """A task whose start could not be completed (its row exists) ends now: ``task.started`` (a no-op if it
        was stored, or is still on its way: same idempotency key) then ``task.failed INTERNAL`` — the session is
        never left with a task that never ends."""
        failed = TaskFailed(code=TaskFailureCode.INTERNAL, retryable=True,
                            message=f"the task could not be started: {type(exc).__name__}: {exc}")
        try:
            await self.store.append(run.session_id, [self._draft(run, EventType.TASK_STARTED, started)],
                                    idempotency_key=f"{run.task_id}:started")
            await self.store.append(run.session_id, [self._draft(run, EventType.TASK_FAILED, failed)],
                                    task_update=TaskUpdate(task_id=run.task_id, state=TaskState.FAILED,
                                                           error=failed.to_json_obj()))
        except StoreError as store_error:  # the store itself fails: the next start recovers the task
            log.error("task %s could not be ended after its failed start: %s", run.task_id, store_error)

    @staticmethod
    def _draft(run: TaskRun, event_type: EventType, payload: Model) -> EventDraft:
        return EventDraft(type=event_type, runtime=run.runtime, payload=payload, trace=run.trace)

    async def stop_task(self, task_id: str, reason: str = "stop requested", requested_by: str = "user") -> TaskRecord:
        """Stop the task and end it with ``task.stopped`` and its receipt (``_stopping``): nothing of it is stored
        from the request on; its tool calls in flight are ended; the worker is asked to stop it and waited for
        (``end_wait_s``). Returns once the task has ended. A second stop waits for the first.
        ``TaskNotActive`` if it is not running."""
        run = self._runs.active(task_id)
        if run is None:
            record = await self.store.get_task(task_id)
            if not record.state.is_terminal:  # running elsewhere (NamespaceElsewhere), or orphaned and failed now
                await self.leasing.own((await self.store.get_session(record.session_id)).namespace)
                record = await self.store.get_task(task_id)
            raise TaskNotActive(f"task {task_id} is not running (state: {record.state})")
        if run.stop is None:
            run.stop = StopInProgress(reason=reason, requested_by=requested_by)
            self._nursery.start_soon(self._carry_out_stop, run, name=f"stop:{task_id}")  # not the caller's to cancel
        await run.done.wait()
        return await self.store.get_task(task_id)

    def _start_stop(self, run: TaskRun) -> None:
        """Carry out the stop set on ``run`` (a budget's), in the engine's nursery."""
        self._nursery.start_soon(self._carry_out_stop, run, name=f"stop:{run.task_id}")

    # -- budgets --------------------------------------------------------------------------------

    async def set_budget(self, session_id: str, limits: BudgetLimits, *, by: str) -> SessionRecord:
        """Replace the session's limits (a paused session stays paused: ``raise_budget`` ends a pause)."""
        session = await self.store.get_session(session_id)
        await self.leasing.own(session.namespace)  # written by the supervisor that runs the namespace (fencing)

        def change(budget: SessionBudget | None) -> SessionBudget:
            return (budget or SessionBudget()).model_copy(update={"limits": limits})

        record = await self.store.change_budget(session_id, change)
        audit("session.budget_changed", by, session=session_id, namespace=session.namespace,
              limits=limits.to_json_obj())
        return record

    async def raise_budget(self, session_id: str, limits: BudgetLimits, *, by: str, go_on: bool = False,
                           task_budget: BudgetLimits | None = None, prompt: str = CONTINUE_PROMPT,
                           ) -> tuple[SessionRecord, TaskRecord | None]:
        """End the session's pause at its budget: its limits become ``limits`` (over its own, kind by kind),
        ``budget.raised`` is stored, and with ``go_on`` a task is started to go on with the work (the stopped task's
        modes and config; its runtime resumes natively where it can, else is given the transcript).
        ``BudgetNotPaused``; ``InvalidTaskInput`` when a session limit reached is not raised above what was spent;
        ``SessionBusy`` while the stopped task is still ending."""
        session = await self.store.get_session(session_id)
        await self.leasing.own(session.namespace)
        if (busy := self._runs.active_in(session_id)) is not None:
            raise SessionBusy(session_id, busy.task_id, then="wait for it to end, then raise the budget")
        budget = session.budget or SessionBudget()
        if budget.paused is None:
            raise BudgetNotPaused(f"session {session_id} is not paused at its budget: there is nothing to raise "
                                  f"(change its limits with PUT /v1/sessions/{session_id}/budget)")
        new_limits = budget.limits.merged(limits)
        # Whichever limit paused it (the task's or the session's), a session limit at what was spent would pause
        # the next task at once.
        if (still := first_reached(new_limits, budget.spent, next_tool_call=True)) is not None:
            raise InvalidTaskInput(f"body field 'limits.{still.value}': the session already spent "
                                   f"{budget.spent.amount(still):g} of it; raise it above that")
        def unpause(stored: SessionBudget | None) -> SessionBudget:
            if stored is None or stored.paused != budget.paused:  # raised meanwhile by another request
                raise BudgetNotPaused(f"session {session_id} is not paused at its budget any more: it was raised")
            return stored.model_copy(update={"limits": new_limits, "paused": None, "paused_at": None})

        # One commit: budget.raised and the end of the pause are stored together, once.
        await self.store.append(session_id, [EventDraft(
            type=EventType.BUDGET_RAISED, runtime=RuntimeInfo(name=session.runtime),
            payload=BudgetRaised(limits=new_limits, raised_by=by, reached=budget.paused, continued=go_on),
            trace=Trace(session_id=session_id))], budget_change=unpause)
        audit("session.budget_raised", by, session=session_id, namespace=session.namespace,
              limits=new_limits.to_json_obj(), continued=go_on)
        if not go_on:
            return await self.store.get_session(session_id), None
        started = await self.store.last_event_of_type(session_id, EventType.TASK_STARTED.value)
        before = started.payload if started is not None and isinstance(started.payload, TaskStarted) else TaskStarted(
            task_id="")
        task = await self.start_task(
            session_id, prompt, permission_mode=before.permission_mode, interaction_mode=before.interaction_mode,
            durable_approvals=before.interaction_mode == InteractionMode.INTERACTIVE,
            runtime_config=dict(before.runtime_config), timeout_s=before.timeout_s,
            idle_timeout_s=before.idle_timeout_s, budget=task_budget)
        return await self.store.get_session(session_id), task

    async def _carry_out_stop(self, run: TaskRun) -> None:
        stop = run.stop
        assert stop is not None
        try:
            before = await calls_in_flight(self.store, run.session_id, run.task_id)
            if run.tools_nursery is not None:
                run.tools_nursery.cancel_scope.cancel()
                with trio.move_on_after(TOOLS_WAIT_S):
                    await run.tools_ended.wait()
            receipt = await stop_in_worker(run.worker, run.task_id, stop, end_wait_s(run.params.runtime_config))
            if receipt.worker == WorkerAnswer.NO_ANSWER and run.worker is not None and not run.worker.exited.is_set():
                # A worker that does not answer a stop is hung: it is treated as crashed (killed, counted, replaced),
                # never left holding the task's session and the namespace.
                await self._workers.hung(run.namespace, run.worker, f"did not answer a stop ({receipt.worker_detail})")
                receipt = receipt.model_copy(update={"worker_detail": f"{receipt.worker_detail}; it was treated as "
                                                     "crashed: its process tree was killed (SIGKILL), and the "
                                                     "namespace's next task gets a new worker"})
            after = await calls_in_flight(self.store, run.session_id, run.task_id)
            receipt = receipt.model_copy(update={
                "tool_calls": call_endings(before, after),
                "duration_ms": round((trio.current_time() - stop.started) * 1000, 3)})
        except StoreError as exc:  # the store is failing: the stop is still stored, without what could not be read
            log.error("task %s: its stop's receipt is incomplete: %s", run.task_id, exc)
            receipt = StopReceipt(worker_detail=f"the receipt could not be completed: {exc}")
        if stop.expiry is not None:  # stopped at its deadline: it failed
            await self._ender.fail(run, TaskFailureCode.TASK_TIMEOUT, stop.expiry.message, retryable=False,
                                   deadline=stop.expiry.deadline, limit_s=stop.expiry.limit_s,
                                   receipt=receipt.to_json_obj())
            return
        await self._ender.finish(run, EventType.TASK_STOPPED, TaskStopped(
            reason=stop.reason, requested_by=stop.requested_by, receipt=receipt))

    async def _watch_deadlines(self, run: TaskRun) -> None:
        """Stop the task when one of its deadlines passes (unless it is ending or being stopped already): through
        the stop's own path, so it ends with a receipt — as ``task.failed TASK_TIMEOUT``."""
        expiry = await run.clock.watch()
        if run.ended or run.stop is not None:
            return
        log.warning("task %s: %s", run.task_id, expiry.message)
        run.stop = StopInProgress(reason=expiry.message, requested_by="supervisor", expiry=expiry)
        self._nursery.start_soon(self._carry_out_stop, run, name=f"deadline:{run.task_id}")

    async def wait_task(self, task_id: str) -> TaskRecord:
        run = self._runs.find(task_id)  # recently ended too: its end may still be being stored
        if run is not None:
            await run.done.wait()
        return await self.store.get_task(task_id)

    async def send_input(self, task_id: str, text: str | tuple[InputBlock, ...], *,
                         input_id: str | None = None) -> SendInputResult:
        """Add a user's input to a running task (steering, ``_steering``): the answer says whether the runtime takes
        it into the running turn or queues it for the next (the session's next task). A task still being given to
        its worker is waited for. Refusals: ``TaskNotActive`` (ended, being stopped), ``InvalidTaskInput`` (empty,
        too long, an input id the session has used), ``RuntimeUnavailable`` (its worker did not take it)."""
        run = self._runs.active(task_id)
        if run is None:
            record = await self.store.get_task(task_id)
            if not record.state.is_terminal:  # running elsewhere (NamespaceElsewhere), or orphaned and failed now
                await self.leasing.own((await self.store.get_session(record.session_id)).namespace)
                record = await self.store.get_task(task_id)
            raise TaskNotActive(f"task {task_id} is not running (state: {record.state}): an input goes to a running "
                                "task; start a new task with it instead")
        try:
            params = SendInputParams(task_id=task_id, input_id=input_id or new_id("input"), input=text)
        except ValidationError as exc:
            raise InvalidTaskInput(f"input: {exc.errors()[0]['msg']}") from None
        if params.input_id in run.inputs or params.input_id in await self._input_ids(run.session_id):
            raise InvalidTaskInput(f"input_id {params.input_id!r} is used already in this session: give a new one")
        with trio.move_on_after(REQUEST_TIMEOUT_S):
            await run.input_stored.wait()  # a pending task: its worker has it once its input is stored
        return await send_input(run, params)

    async def _input_ids(self, session_id: str) -> set[str]:
        ids: set[str] = set()
        after = 0
        while page := await self.store.read_types(session_id, (EventType.MODEL_INPUT_APPENDED,), after, 1000):
            after = page[-1].seq
            ids |= {e.payload.input_id for e in page if isinstance(e.payload, ModelInputAppended)}
        return ids

    def active_task(self, session_id: str) -> str | None:
        run = self._runs.active_in(session_id)
        return run.task_id if run is not None else None

    # -- namespaces' workers --------------------------------------------------------------------

    @asynccontextmanager
    async def _borrowed_worker(self, namespace: str, placement: Placement | None = None
                               ) -> AsyncIterator[WorkerLink]:
        """The namespace's worker (started if needed) for one request — or ``placement``'s (a session's own, the
        shared one). ``InvalidNamespace``; ``NamespaceUnavailable``; ``NamespaceElsewhere`` (its worker runs on
        the supervisor holding its lease)."""
        Namespace.parse(namespace)
        await self.leasing.own(namespace)
        async with self._workers.borrow(namespace, placement) as worker:
            yield worker

    def prewarm(self, namespace: str) -> None:
        """Start the namespace's worker now, in the background, so a task started soon finds it running (a new
        process imports for a fraction of a second). Failures are left to the task's own start to report."""
        async def warm() -> None:
            with contextlib.suppress(EngineError, InvalidNamespace):
                async with self._borrowed_worker(namespace):
                    pass

        self._nursery.start_soon(warm, name=f"prewarm:{namespace}")

    async def ensure_login(self, namespace: str, runtime: str) -> EnsureLoginResult:
        """Ask the namespace's worker whether ``runtime`` is logged in there, and what to do if not.
        ``UnknownRuntime``; ``RuntimeUnavailable``; ``NamespaceUnavailable``."""
        async with self._borrowed_worker(namespace) as worker:
            return await _ask(worker, namespace, f"for {runtime!r}", Rpc.ENSURE_LOGIN,
                              GetAuthStatusParams(runtime=runtime))

    async def runtime_env(self, namespace: str, session_id: str | None = None) -> WorkerEnvironment:
        """What the namespace's worker (started if needed) really runs with: its environment's safe view (names of
        variables, never values), its process, and per runtime what it would load on its own. With ``session_id``,
        the worker that runs that session's tasks (its own for an ``ephemeral`` one), project files looked for in
        its workspace. ``UnknownSession`` (none of that id in the namespace); ``RuntimeUnavailable``;
        ``NamespaceUnavailable``."""
        workspace, placement = None, None
        if session_id is not None:
            session = await self.store.get_session(session_id)
            if session.namespace != namespace:  # another namespace's session is not there for this view
                raise UnknownSession(session_id)
            workspace, placement = session.workspace, placement_of(session)
        async with self._borrowed_worker(namespace, placement) as worker:
            found = await _ask(worker, namespace, "about its environment", Rpc.DESCRIBE_ENV,
                               DescribeEnvParams(cwd=workspace))
            return WorkerEnvironment.of(worker, workspace, found.runtimes)

    async def runtimes(self, namespace: str) -> list[RuntimeOffer]:
        """What the namespace's worker can host (it is started if needed), with capabilities and versions."""
        async with self._borrowed_worker(namespace) as worker:
            return list(worker.info.runtimes) if worker.info else []

    async def check_offer(self, namespace: str, runtime: str, runtime_config: Mapping[str, object] | None = None,
                          *, available: bool = True, worker_needed: bool = True) -> RuntimeOffer | None:
        """Before anything is stored, what the namespace's worker offers (its ``initialize``) refuses:
        ``UnknownRuntime`` for a runtime it does not host; ``InvalidTaskInput`` for a ``runtime_config`` key or
        choice the runtime does not declare (``config_refusal``); ``RuntimeUnavailable`` for one it hosts but
        cannot run now (unless ``available`` is False: asking how to log in is still useful then).

        ``worker_needed`` False (the session's own runtime, only its config to check): when no worker can be had
        for the namespace now (quarantined, failing, run elsewhere), nothing is checked and None returned — the
        task's own start says why it cannot run, as it always has."""
        try:
            offered = await self.runtimes(namespace)
        except (NamespaceUnavailable, NamespaceElsewhere):
            if worker_needed:
                raise
            return None
        offers = {offer.name: offer for offer in offered}
        offer = offers.get(runtime)
        if offer is None:
            raise UnknownRuntime(f"no runtime {runtime!r} in namespace {namespace!r}; it can run: "
                                 f"{', '.join(sorted(offers)) or 'none'}")
        if runtime_config and (refusal := config_refusal(offer.capabilities, runtime_config)) is not None:
            raise InvalidTaskInput(refusal)
        if available and not offer.available:
            raise RuntimeUnavailable(f"runtime {runtime!r} is not available in namespace {namespace!r}: "
                                     f"{offer.unavailable_reason or 'its worker says so'}")
        return offer

    # -- driving a task -------------------------------------------------------------------------

    async def _drive(self, run: TaskRun) -> None:
        """Drive the task to its end, its deadlines watched meanwhile."""
        async with trio.open_nursery() as watch:
            if run.clock.armed:
                watch.start_soon(self._watch_deadlines, run, name=f"deadlines:{run.task_id}")
            await self._drive_in_worker(run)
            watch.cancel_scope.cancel()

    async def _drive_in_worker(self, run: TaskRun) -> None:
        with trio.move_on_after(RELEASE_WAIT_S):
            for other in self._runs.unreleased_in(run.session_id):
                await other.released.wait()
        try:
            async with self._workers.borrow(run.namespace, placement_of(run.session)) as worker:
                if run.ended:  # stopped before it reached a worker: nothing to start
                    run.released.set()
                    return
                run.worker = worker
                async with self.turns.turn(run.namespace, 1):
                    compiled = await self._compile(run, worker)
                if not compiled:
                    run.released.set()
                    return
                try:
                    async with trio.open_nursery() as tools:
                        run.tools_nursery = tools
                        await self._start_in_worker(run, worker)
                        await run.done.wait()
                        tools.cancel_scope.cancel()
                finally:
                    run.tools_ended.set()
        except NamespaceUnavailable as exc:  # no worker to be had
            run.released.set()
            await self._ender.fail(run, TaskFailureCode.WORKER_UNAVAILABLE, str(exc), retryable=True)

    async def _compile(self, run: TaskRun, worker: WorkerLink) -> bool:
        """Compile and store the task's input for its runtime; False when the task ended instead (failed: too
        large for the budget, or not storable; or stopped meanwhile)."""
        window = context_window(worker, run.params.runtime)
        try:
            run.params, run.model_input = await compile_input(
                self.store, run.params, run.prompt, window_tokens=window, max_input_tokens=run.max_input_tokens,
                switched_from=run.switched_from)
        except ContextTooLarge as exc:
            await self._ender.fail(run, TaskFailureCode.CONTEXT_TOO_LARGE, _too_large_hint(run, exc, window),
                                   retryable=False, needed_tokens=exc.needed_tokens, budget_tokens=exc.budget_tokens,
                                   window_tokens=window, max_input_tokens=run.max_input_tokens)
            return False
        except (StoreError, CanonicalizationError, ValueError) as exc:
            log.error("task %s: its input could not be compiled: %s", run.task_id, exc)
            await self._ender.fail(run, TaskFailureCode.INTERNAL, f"the task's input could not be compiled from the "
                                   f"session's transcript: {type(exc).__name__}: {exc}", retryable=True)
            return False
        return not run.ended and run.stop is None

    async def _start_in_worker(self, run: TaskRun, worker: WorkerLink) -> None:
        try:
            with trio.fail_after(REQUEST_TIMEOUT_S):
                accepted = await worker.connection.request(Rpc.START_TASK, run.params)
        except RpcError as exc:
            run.released.set()
            known = exc.data.get("known") if isinstance(exc.data, dict) else None
            hosted = f" (this namespace's worker hosts: {', '.join(map(str, known))})" if isinstance(known, list) else ""
            await self._ender.fail(run, _code_for_rpc(exc.code), f"the worker refused the task: {exc.message}{hosted}",
                                   retryable=False, rpc_code=exc.code, data=exc.data)
        except trio.TooSlowError:
            await self._ender.fail(run, TaskFailureCode.TIMEOUT, "the worker did not accept the task in time",
                                   retryable=True)
        except InvalidResult as exc:  # it answered, but not with a StartTaskResult: the worker is broken
            await self._ender.fail_and_stop(run, TaskFailureCode.PROTOCOL_ERROR, str(exc), retryable=False)
        except WorkerError:
            pass  # the worker died: its exit fails the task with WORKER_CRASHED (EventIntake.on_exit)
        else:  # no turn of its own: the task's first events wait for it inside theirs (``EventIntake._handle``)
            await self._accepted(run, worker, accepted)

    async def _accepted(self, run: TaskRun, worker: WorkerLink, result: StartTaskResult) -> None:
        """The runtime has the task: store ``model.input`` (with how the runtime was given the transcript and what
        it loads implicitly, as the worker reported them) before any of the runtime's events, which wait for
        ``input_stored``."""
        try:
            model_input = run.model_input
            assert model_input is not None
            update: dict[str, Any] = {"resume": result.resume, "sent_hash": result.sent_hash,
                                      "isolation": run.session.isolation}
            if result.resume == ResumeMode.NATIVE:  # the runtime was sent the prompt only: nothing was compiled
                update |= {"context": None, "interrupted_calls": ()}
            if result.implicit_sources is not None:
                update["implicit_sources_ref"] = await self.store.put_json_blob(result.implicit_sources,
                                                                                 session_id=run.session_id)
            await self._recorder.append(run, [PendingEvent(EventType.MODEL_INPUT, model_input.model_copy(
                update=update))])
        finally:
            run.input_stored.set()
        if run.switched_from is None and result.runtime_session_id and \
                result.runtime_session_id != run.session.runtime_session_id:
            await self.store.update_session(run.session_id, runtime_session_id=result.runtime_session_id)
        if not run.ended:
            try:
                await self.store.update_task(run.task_id, state=TaskState.RUNNING, worker_pid=worker.pid)
            except InvalidTransition:  # lost a race with the terminal update; the terminal state stands
                log.debug("task %s ended before it was marked running", run.task_id)


def fork_budget(parent: SessionBudget | None, copied: Sequence[NormalizedEvent]) -> SessionBudget | None:
    """A fork's budget: the parent's limits, nothing spent yet, and paused where its copied events leave it paused
    (a ``budget.reached`` no ``budget.raised`` answered): the fork goes on only once raised, as its events say."""
    paused = None
    for event in copied:
        if isinstance(event.payload, BudgetReached):
            paused = event.payload
        elif event.type == EventType.BUDGET_RAISED:
            paused = None
    if parent is None and paused is None:
        return None
    return SessionBudget(limits=parent.limits if parent is not None else BudgetLimits(), paused=paused,
                         paused_at=None if paused is None else datetime.now(UTC))


def _runtime_name(name: str) -> str:
    """``name`` if it may name a runtime (``protocol.RUNTIME_NAME_PATTERN``), else ``InvalidTaskInput``."""
    try:
        return check_runtime_name(name)
    except ValueError as exc:
        raise InvalidTaskInput(str(exc)) from None


def _isolation_level(level: str) -> IsolationLevel:
    """``level`` as an ``IsolationLevel``, else ``InvalidTaskInput`` naming the choices."""
    try:
        return IsolationLevel(level)
    except ValueError:
        raise InvalidTaskInput(f"unknown isolation level {level!r}: choose one of "
                               f"{', '.join(level.value for level in IsolationLevel)}") from None


def _check_storable(params: StartTaskParams, started: TaskStarted) -> None:
    """``InvalidTaskInput`` unless all of the task's input can be stored — checked before anything is stored, so
    a refused task leaves no trace."""
    try:
        canonical_json(params.model_dump(mode="json", exclude={"trace"}))
        canonical_json(started.to_json_obj())
    except (CanonicalizationError, ValueError, TypeError) as exc:
        raise InvalidTaskInput(f"the task's input cannot be stored (runtime_config and the prompt must be plain "
                               f"JSON: strings of valid text, integers within ±2^53): {exc}") from exc


def _too_large_hint(run: TaskRun, exc: ContextTooLarge, window: int | None) -> str:
    by_task = run.max_input_tokens is not None and exc.budget_tokens == run.max_input_tokens
    limit = ("the task's max_input_tokens" if by_task else
             f"{INPUT_SHARE:.0%} of {run.params.runtime}'s context window of {window} tokens, the rest left for the "
             f"runtime's own instructions and its answer")
    return (f"the request does not fit the context budget even without the session's earlier turns: it is about "
            f"{exc.needed_tokens} tokens, the budget is {exc.budget_tokens} ({limit}). Shorten the prompt, or put "
            f"large inputs in a file of the workspace and refer to it"
            + (", or raise max_input_tokens" if by_task else "") + ".")


_FAILURE_FOR_RPC_ERROR: dict[int, str] = {
    ErrorCode.UNKNOWN_RUNTIME: TaskFailureCode.RUNTIME_UNAVAILABLE,
    ErrorCode.RUNTIME_UNAVAILABLE: TaskFailureCode.RUNTIME_UNAVAILABLE,
    ErrorCode.INVALID_PARAMS: TaskFailureCode.PROTOCOL_ERROR,
    ErrorCode.INVALID_SCENARIO: TaskFailureCode.INVALID_SCENARIO,
    ErrorCode.INVALID_RUNTIME_CONFIG: TaskFailureCode.INVALID_RUNTIME_CONFIG,
    ErrorCode.UNSAFE_WORKSPACE: TaskFailureCode.UNSAFE_WORKSPACE,
}


def _code_for_rpc(code: int) -> str:
    return _FAILURE_FOR_RPC_ERROR.get(code, TaskFailureCode.RUNTIME_ERROR)


def _open_store(config: EngineConfig) -> AbstractAsyncContextManager[Recorder]:
    """The store the config names: PostgreSQL at ``config.store``, else SQLite in the data dir. Either way this
    supervisor holds the data dir's lock (its workspaces, namespaces' HOMEs and API socket are its own)."""
    if config.store is not None:
        return open_postgres(config.store, data_dir=config.data_dir, holder=config.holder, lease_s=config.lease_s)
    return EventStore.open(config.data_dir, vfs=config.store_vfs, holder=config.holder)


@asynccontextmanager
async def _open_leases(config: EngineConfig, store: Recorder) -> AsyncIterator[Leases]:
    """Namespace leases: in the PostgreSQL database the supervisors share, or every namespace ours (SQLite)."""
    if config.store is None:
        yield SoleLeases()
        return
    leases = await PostgresLeases.open(config.store, store.location, config.lease_s)
    try:
        yield leases
    finally:
        with trio.CancelScope(shield=True):
            try:
                await leases.aclose()
            except StoreError as exc:  # they expire by themselves
                log.error("namespace leases could not be given up (they expire in %.0f s): %s", config.lease_s, exc)


def _fill_of(path: Path) -> str:
    """`` (15.1 MiB of 15.2 MiB and … files used)`` for the volume holding ``path``; empty if it can't be read."""
    try:
        return f" ({DiskUsage.of(path).describe()})"
    except OSError:
        return ""
