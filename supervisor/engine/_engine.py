"""The task engine: sessions and tasks over the store, the worker pool and the owned tools.

The engine is the only writer of events. It enforces the contract's invariants: one active task per
session; ``task.started`` first and exactly one terminal event last; nothing stored after a terminal
event (later worker events are dropped and counted); per tool-call attempt requested ->
policy_evaluated* -> approved|denied -> started -> completed (the last two only if approved).
"""

from __future__ import annotations

import contextlib
import json
import logging
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from protocol import (
    CONTRACT_VERSION,
    TERMINAL_EVENT_TYPES,
    CanonicalizationError,
    EnsureLoginResult,
    ErrorCode,
    EventType,
    ExecutedBy,
    ExitStatus,
    InteractionMode,
    Message,
    Method,
    Model,
    ModelInput,
    PermissionMode,
    RuntimeEventParams,
    RuntimeInfo,
    RuntimeOffer,
    SessionCreated,
    SessionRef,
    StartTaskParams,
    StartTaskResult,
    TaskFailed,
    TaskFailureCode,
    TaskStarted,
    TaskStopped,
    ToolCallRequested,
    Trace,
    TraceContext,
    canonical_hash,
    canonical_json,
    sha256_hex,
)

from .._orphans import end_adopted, reap_orphans_forever
from ..namespaces import InvalidNamespace, Namespace, WorkspaceRefused, check_workspace, give_workspace
from ..store import (
    INLINE_BLOB_MAX,
    DatabaseError,
    EventDraft,
    EventStore,
    InvalidTransition,
    SessionRecord,
    StoreError,
    TaskRecord,
    TaskState,
    TaskUpdate,
)
from ..store._store import QuotaExceeded, Quotas
from ..workers import RpcError, WorkerError, WorkerProcess
from ..workers.pool import NamespaceFailing, PoolConfig, WorkerPool
from ..workers.process import REAP_WAIT_S
from ._approvals import APPROVAL_TIMEOUT_S, ApprovalBroker
from ._runs import TaskRun
from ._toolflow import ToolFlow, Tooling
from ._transcript import derive_transcript

log = logging.getLogger("codesdk.supervisor.engine")

#: Tool inputs larger than this (canonical JSON bytes) are stored as a blob and referenced.
INLINE_INPUT_MAX_BYTES = 16 * 1024
#: Ended runs remembered so their late events are recognised (and counted) rather than "unknown task".
RECENT_RUNS_KEPT = 1000
#: Seconds to wait for a worker to accept runtime.startTask / runtime.stop.
REQUEST_TIMEOUT_S = 30.0
#: Seconds a new task waits for the worker to let go of the session's previous (stopped) task.
RELEASE_WAIT_S = 15.0

Approver = Callable[[Any], Awaitable[Any]]


class EngineError(Exception):
    """A request the engine refuses; the message says what to do instead."""


class TaskNotActive(EngineError):
    pass


class InvalidTaskInput(EngineError):
    """The caller's input for a task cannot be stored (nothing was)."""


@dataclass
class EngineStats:
    late_events: int = 0
    unknown_task_events: int = 0
    ordinal_gaps: int = 0
    duplicate_events: int = 0  # repeated ordinals or tool requests, dropped
    invalid_events: int = 0
    worker_crashes: int = 0


@dataclass(frozen=True)
class EngineConfig:
    data_dir: Path
    pool: PoolConfig
    default_runtime: str = "scripted"
    workspaces_dir: Path | None = None
    approval_timeout_s: float = APPROVAL_TIMEOUT_S
    store_vfs: str | None = None  # a registered SQLite VFS for the store (fault-injection tests)
    holder: str = "a CodeSDK supervisor"  # who we are, to a second process that finds the data dir locked
    #: Per-tenant limits: checked when a task is admitted (``start_task``) and whenever its events are stored.
    quotas: Quotas = field(default_factory=Quotas)


class Engine:
    def __init__(self, config: EngineConfig, store: EventStore, tooling: Tooling, nursery: trio.Nursery) -> None:
        self.config = config
        self.store = store
        self.tooling = tooling
        self._nursery = nursery
        self.pool = WorkerPool(config.pool, nursery, self._on_worker_events, self._on_worker_exit)
        self.stats = EngineStats()
        self._runs: dict[str, TaskRun] = {}
        self._recent: OrderedDict[str, TaskRun] = OrderedDict()
        self._tools = ToolFlow(self)
        self.approvals = ApprovalBroker(store, config.approval_timeout_s)

    @classmethod
    @asynccontextmanager
    async def open(cls, config: EngineConfig, tooling: Tooling) -> AsyncIterator[Engine]:
        async with EventStore.open(config.data_dir, vfs=config.store_vfs, holder=config.holder) as store, \
                trio.open_nursery() as nursery:
            engine = cls(config, store, tooling, nursery)
            await engine._recover()
            nursery.start_soon(reap_orphans_forever)  # what dead workers and tools left is re-parented to us
            try:
                yield engine
            finally:
                with trio.CancelScope(shield=True):
                    await engine._close()
                    await end_adopted(REAP_WAIT_S)
                nursery.cancel_scope.cancel()

    async def _recover(self) -> None:
        """Tasks left pending/running by a supervisor that died get their one terminal event now: their
        worker died with it, so nothing else ever will. Their pending approvals are closed as expired.
        Safe because we hold the data dir's lock: no other supervisor can be running them."""
        await self.approvals.expire_orphans()
        for record in await self.store.list_active_tasks():
            session = await self.store.get_session(record.session_id)
            failed = TaskFailed(code=TaskFailureCode.SUPERVISOR_RESTARTED, retryable=True,
                                message="the supervisor stopped while this task was running; its worker went with it")
            await self.store.append(record.session_id, [EventDraft(
                type=EventType.TASK_FAILED, runtime=RuntimeInfo(name=session.runtime), payload=failed,
                trace=Trace(session_id=record.session_id, task_id=record.task_id))],
                task_update=TaskUpdate(task_id=record.task_id, state=TaskState.FAILED, error=failed.to_json_obj()))
            log.warning("task %s was left %s by a previous supervisor; marked failed", record.task_id, record.state)

    async def _close(self) -> None:
        for run in list(self._runs.values()):
            try:
                await self._finish(run, EventType.TASK_STOPPED, TaskStopped(reason="supervisor shutting down",
                                                                              requested_by="supervisor"))
            except StoreError as exc:  # torn down from outside: the store is gone; the task stays "running"
                log.error("task %s could not be marked stopped: %s", run.task_id, exc)
        await self.pool.aclose()

    # -- sessions -------------------------------------------------------------------------------

    async def create_session(self, *, runtime: str | None = None, namespace: str = "default",
                             workspace: Path | None = None, metadata: dict[str, Any] | None = None) -> SessionRecord:
        Namespace.parse(namespace)  # InvalidNamespace with a clear message
        runtime = runtime or self.config.default_runtime
        session_id = f"ses_{uuid.uuid4().hex[:16]}"
        if workspace is None:
            root = self.config.workspaces_dir or self.config.data_dir / "workspaces"
            workspace = root / session_id
        try:
            workspace = check_workspace(workspace, self.config.data_dir)
        except WorkspaceRefused as exc:
            raise EngineError(str(exc)) from exc
        await trio.to_thread.run_sync(lambda: workspace.mkdir(parents=True, exist_ok=True, mode=0o700))
        try:  # with per-namespace uids the workspace becomes the namespace's own; else a no-op
            await trio.to_thread.run_sync(give_workspace, workspace, namespace, self.config.pool.data_dir,
                                          self.config.pool.worker_uids)
        except (ValueError, RuntimeError) as exc:
            raise EngineError(f"cannot give workspace {workspace} to namespace {namespace!r}: {exc}") from exc
        record = await self.store.create_session(session_id, runtime=runtime, namespace=namespace,
                                                 workspace=str(workspace), metadata=metadata)
        await self.store.append(session_id, [EventDraft(
            type=EventType.SESSION_CREATED, runtime=RuntimeInfo(name=runtime),
            payload=SessionCreated(contract_version=CONTRACT_VERSION, runtime=runtime, namespace=namespace,
                                   workspace=str(workspace), metadata=metadata or {}),
            trace=Trace(session_id=session_id))])
        return record

    # -- tasks ----------------------------------------------------------------------------------

    async def start_task(self, session_id: str, prompt: str, *, permission_mode: PermissionMode = PermissionMode.ASK,
                         interaction_mode: InteractionMode = InteractionMode.NON_INTERACTIVE,
                         runtime_config: dict[str, Any] | None = None, approver: Approver | None = None,
                         durable_approvals: bool = False, trace: TraceContext | None = None) -> TaskRecord:
        """Record the task, its input and ``task.started``; the runtime is driven in the background."""
        session = await self.store.get_session(session_id)
        busy = next((r for r in self._runs.values() if r.session_id == session_id), None)
        if busy is not None:
            raise EngineError(f"session {session_id} already has an active task ({busy.task_id}); "
                              "wait for it to end or stop it first")
        task_id = f"task_{uuid.uuid4().hex[:16]}"
        if durable_approvals:  # decisions come from whoever decides the stored approval (the HTTP API)
            interaction_mode, approver = InteractionMode.INTERACTIVE, None
        elif interaction_mode == InteractionMode.INTERACTIVE and approver is None:
            raise EngineError("an interactive task needs an approver (or durable_approvals, decided over the API)")
        messages = (*await derive_transcript(self.store, session_id), Message.user_text(prompt))
        params = StartTaskParams(
            runtime=session.runtime, session=SessionRef(session_id=session_id,
                                                        runtime_session_id=session.runtime_session_id),
            task_id=task_id, workspace=session.workspace, messages=messages, tool_manifest=self.tooling.manifest(),
            permission_mode=permission_mode, interaction_mode=interaction_mode,
            runtime_config=runtime_config or {}, trace=trace or TraceContext())
        compiled = params.model_dump(mode="json", exclude={"trace"})
        try:  # all of the input is checked before anything is stored: a refused task leaves no trace
            compiled_json = canonical_json(compiled)
            started = TaskStarted(task_id=task_id, prompt_preview=prompt[:200], permission_mode=permission_mode,
                                  interaction_mode=interaction_mode, runtime_config=runtime_config or {})
            canonical_json(started.to_json_obj())
        except (CanonicalizationError, ValueError, TypeError) as exc:
            raise InvalidTaskInput(f"the task's input cannot be stored (runtime_config and the prompt must be plain "
                              f"JSON: strings of valid text, integers within ±2^53): {exc}") from exc
        # Admission (QuotaExceeded, nothing stored): the session and namespace are under their stored-data quotas and
        # the namespace runs fewer tasks than it may — checked in the transaction that records the task.
        record = await self.store.create_task(session_id, task_id, runtime=session.runtime,
                                              metadata={"prompt_preview": prompt[:200]}, quotas=self.config.quotas)
        tr = trace or TraceContext()
        run = TaskRun(task_id=task_id, session=session, params=params, approver=approver,
                      trace=Trace(session_id=session_id, task_id=task_id, request_id=tr.request_id,
                                  client_id=tr.client_id, user_id=tr.user_id),
                      runtime=RuntimeInfo(name=session.runtime, runtime_session_id=session.runtime_session_id))
        try:
            input_ref = await self.store.put_blob(compiled_json, "application/json")
            run.model_input = ModelInput(input_ref=input_ref, input_hash=sha256_hex(compiled_json),
                                         message_count=len(messages),
                                         tool_names=tuple(self.tooling.manifest().names()))
            self._runs[task_id] = run
            await self.store.append(session_id, [self._draft(run, EventType.TASK_STARTED, started)],
                                    idempotency_key=f"{task_id}:started")
        except BaseException as exc:  # the task row exists: it ends now, with exactly one terminal event
            self._runs.pop(task_id, None)
            with trio.CancelScope(shield=True):
                await self._abandon(run, started, exc)
            raise
        self._nursery.start_soon(self._drive, run, name=f"drive:{task_id}")
        return record

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
        """Store ``task.stopped`` now; tell the worker (best effort). Later worker events are dropped."""
        run = self._runs.get(task_id)
        if run is None:
            record = await self.store.get_task(task_id)
            raise TaskNotActive(f"task {task_id} is not running (state: {record.state})")
        await self._finish(run, EventType.TASK_STOPPED, TaskStopped(reason=reason, requested_by=requested_by))
        if run.worker is not None and not run.worker.exited.is_set():
            self._nursery.start_soon(self._tell_worker_stop, run.worker, task_id, reason)
        return await self.store.get_task(task_id)

    async def wait_task(self, task_id: str) -> TaskRecord:
        run = self._runs.get(task_id) or self._recent.get(task_id)  # recent: its end may still be being stored
        if run is not None:
            await run.done.wait()
        return await self.store.get_task(task_id)

    @asynccontextmanager
    async def _borrowed_worker(self, namespace: str) -> AsyncIterator[WorkerProcess]:
        """The namespace's worker (started if needed) for one request; an unavailable one is an EngineError."""
        Namespace.parse(namespace)
        try:
            worker = await self.pool.acquire(namespace)
        except NamespaceFailing as exc:
            raise EngineError(str(exc)) from exc
        try:
            yield worker
        finally:
            self.pool.release(namespace, worker)

    def prewarm(self, namespace: str) -> None:
        """Start the namespace's worker now, in the background, so a task started soon finds it running (a new
        process imports for a fraction of a second). Failures are left to the task's own start to report."""
        async def warm() -> None:
            with contextlib.suppress(EngineError, InvalidNamespace):
                async with self._borrowed_worker(namespace):
                    pass

        self._nursery.start_soon(warm, name=f"prewarm:{namespace}")

    async def ensure_login(self, namespace: str, runtime: str) -> EnsureLoginResult:
        """Ask the namespace's worker whether ``runtime`` is logged in there, and what to do if not."""
        async with self._borrowed_worker(namespace) as worker:
            try:
                with trio.fail_after(REQUEST_TIMEOUT_S):
                    result = await worker.connection.request(Method.ENSURE_LOGIN, {"runtime": runtime})
            except RpcError as exc:
                raise EngineError(f"{exc.message}" + (f" ({exc.data})" if exc.data else "")) from exc
        return EnsureLoginResult.model_validate(result)

    async def runtimes(self, namespace: str) -> list[RuntimeOffer]:
        """What the namespace's worker can host (it is started if needed), with capabilities and versions."""
        async with self._borrowed_worker(namespace) as worker:
            return list(worker.info.runtimes) if worker.info else []

    def active_task(self, session_id: str) -> str | None:
        return next((r.task_id for r in self._runs.values() if r.session_id == session_id), None)

    # -- driving a task -------------------------------------------------------------------------

    async def _drive(self, run: TaskRun) -> None:
        previous = [r for r in self._recent.values() if r.session_id == run.session_id and not r.released.is_set()]
        with trio.move_on_after(RELEASE_WAIT_S):
            for other in previous:
                await other.released.wait()
        try:
            worker = await self.pool.acquire(run.namespace)
        except NamespaceFailing as exc:
            run.released.set()
            await self._fail(run, TaskFailureCode.WORKER_UNAVAILABLE, str(exc), retryable=True)
            return
        try:
            if run.ended:  # stopped before it reached a worker: nothing to start
                run.released.set()
                return
            run.worker = worker
            async with trio.open_nursery() as tools:
                run.tools_nursery = tools
                try:
                    with trio.fail_after(REQUEST_TIMEOUT_S):
                        accepted = await worker.connection.request(Method.START_TASK, run.params.to_json_obj())
                except RpcError as exc:
                    run.released.set()
                    await self._fail(run, _code_for_rpc(exc.code), f"the worker refused the task: {exc.message}",
                                     retryable=False, rpc_code=exc.code, data=exc.data)
                except trio.TooSlowError:
                    await self._fail(run, TaskFailureCode.TIMEOUT, "the worker did not accept the task in time",
                                     retryable=True)
                except WorkerError:
                    pass  # the worker died: _on_worker_exit fails the task with WORKER_CRASHED
                else:
                    await self._accepted(run, worker, accepted)
                await run.done.wait()
                tools.cancel_scope.cancel()
        finally:
            self.pool.release(run.namespace, worker)

    async def _accepted(self, run: TaskRun, worker: WorkerProcess, accepted: Any) -> None:
        """The runtime has the task: store ``model.input`` (with what the runtime loads implicitly, as the
        worker reported it) before any of the runtime's events, which wait for ``input_stored``."""
        result = StartTaskResult.model_validate(accepted)
        try:
            model_input = run.model_input
            assert model_input is not None
            if result.implicit_sources is not None:
                ref = await self.store.put_json_blob(result.implicit_sources)
                model_input = model_input.model_copy(update={"implicit_sources_ref": ref})
            await self._append(run, [(EventType.MODEL_INPUT, model_input)])
        finally:
            run.input_stored.set()
        if result.runtime_session_id and result.runtime_session_id != run.session.runtime_session_id:
            await self.store.update_session(run.session_id, runtime_session_id=result.runtime_session_id)
        if not run.ended:
            try:
                await self.store.update_task(run.task_id, state=TaskState.RUNNING, worker_pid=worker.pid)
            except InvalidTransition:  # lost a race with the terminal update; the terminal state stands
                log.debug("task %s ended before it was marked running", run.task_id)

    async def _tell_worker_stop(self, worker: WorkerProcess, task_id: str, reason: str) -> None:
        with trio.move_on_after(REQUEST_TIMEOUT_S):
            try:
                await worker.connection.request(Method.STOP, {"task_id": task_id, "reason": reason})
            except WorkerError as exc:
                log.info("stop of %s not delivered: %s", task_id, exc)

    # -- events from workers --------------------------------------------------------------------

    async def _on_worker_events(self, worker: WorkerProcess, batch: Sequence[RuntimeEventParams]) -> None:
        """Store a worker's events in order. Runs of plain events become one append per task, so a fast
        stream is group-committed; tool requests and terminal events are handled one by one, in place."""
        plain: dict[str, tuple[TaskRun, list[tuple[EventType, Model, RuntimeInfo | None]]]] = {}
        raw_blobs: dict[str, dict[str, tuple[bytes, str]]] = {}  # task -> small raw blobs its events name

        async def flush() -> None:
            # Short runs first. A stream's events are bulk appends: the writer commits them taking turns with
            # everyone else's writes, and while others are writing they go in small parts, each followed by a
            # pause as long as it took (``_share``): a flood slows only itself.
            pending = sorted(plain.values(), key=lambda entry: _is_stream(entry[0]))
            plain.clear()
            for run, items in pending:
                blobs = raw_blobs.pop(run.task_id, None)
                if not _is_stream(run):
                    try:
                        await self._append(run, items, blobs=blobs)
                    except DatabaseError as exc:
                        await self._lost_events(run, exc)
                    continue
                while items:
                    part_size = SHARE_QUANTUM if self._others_writing() else len(items)
                    part, items = items[:part_size], items[part_size:]
                    started = trio.current_time()
                    try:
                        if not await self._append(run, part, blobs=_named_blobs(part, blobs), bulk=True):
                            break
                    except DatabaseError as exc:
                        await self._lost_events(run, exc)
                        break
                    await self._share(started)

        for params in batch:
            run = self._accept(worker, params)
            if run is None:
                continue
            try:
                if not run.input_stored.is_set():  # model.input comes first; it is being stored right now
                    await flush()
                    await run.input_stored.wait()
                    if run.ended:
                        continue
                event = params.event
                if run.runtime.runtime_session_id and run.runtime.runtime_session_id != run.session.runtime_session_id:
                    # The runtime named its own session: keep it, so the session's next task resumes it.
                    run.session = await self.store.update_session(run.session_id,
                                                                  runtime_session_id=run.runtime.runtime_session_id)
                if event.type == EventType.TOOL_CALL_REQUESTED:
                    assert isinstance(event.payload, ToolCallRequested)
                    await flush()
                    await self._tool_requested(run, event.payload)
                elif event.type in TERMINAL_EVENT_TYPES:
                    await flush()
                    await self._finish(run, event.type, await self._stderr_tail_as_blob(event.payload))
                else:
                    payload = event.payload
                    if event.type in _RUNTIME_TOOL_EVENTS:
                        identity = run.approved_runtime_calls.get(getattr(payload, "tool_call_id", ""))
                        if identity is None:  # the runtime ran a tool nobody approved: record, never store as fact
                            self.stats.invalid_events += 1
                            log.warning("task %s: %s for a call that was not approved; dropped", run.task_id, event.type)
                            continue
                        payload = payload.model_copy(update={"attempt": identity.attempt,
                                                             "input_hash": identity.input_hash})
                    runtime = None
                    if event.raw is not None:
                        ref = await self._raw_blob(event.raw, raw_blobs.setdefault(run.task_id, {}))
                        runtime = run.runtime.model_copy(update={"raw_ref": ref})
                    plain.setdefault(run.task_id, (run, []))[1].append((event.type, payload, runtime))
            except CanonicalizationError as exc:  # hostile or buggy input: this task ends, the batch goes on
                await flush()
                await self._fail_and_stop(run, TaskFailureCode.PROTOCOL_ERROR,
                                          f"the runtime sent a {params.event.type} that cannot be stored: {exc}",
                                          retryable=False)
            except DatabaseError as exc:  # the disk failed: what was not stored was never acknowledged
                plain.pop(run.task_id, None)
                await flush()
                await self._lost_events(run, exc)
            except Exception as exc:  # never drop a batch (and a terminal event in it) silently
                if isinstance(exc, StoreError):
                    raise
                log.exception("task %s: handling %s failed", run.task_id, params.event.type)
                await flush()
                await self._fail_and_stop(run, TaskFailureCode.INTERNAL,
                                          f"the supervisor could not handle the runtime's {params.event.type}: "
                                          f"{type(exc).__name__}: {exc}", retryable=False)
        await flush()

    def _others_writing(self) -> bool:
        """Someone's ordinary (not bulk) write was committed within the last SHARE_WINDOW_S."""
        return trio.current_time() - self.store.writer_stats.last_ordinary_at <= SHARE_WINDOW_S

    async def _share(self, started: float) -> None:
        """After a stream's part: while others are writing, pause as long as the part took, so a flood gets at
        most about half of the event loop, the GIL and the writer, and others' small steps find them free. A
        stream alone never pauses."""
        if self._others_writing():
            await trio.sleep(min(trio.current_time() - started, SHARE_WINDOW_S))

    async def _lost_events(self, run: TaskRun, exc: DatabaseError) -> None:
        """Events of this task could not be stored (the disk failed): the task cannot complete truthfully.

        Its terminal event is stored as soon as the disk takes writes again; until then (or if the process
        dies first) the task stays running in the store and the next start fails it as SUPERVISOR_RESTARTED.
        """
        if run.ended:
            return
        log.error("task %s: events could not be stored (%s); stopping the task", run.task_id, exc)
        await self._fail_and_stop(run, TaskFailureCode.INTERNAL,
                                  f"the supervisor could not store the task's events: {exc}", retryable=True)

    async def _fail_and_stop(self, run: TaskRun, code: str, message: str, *, retryable: bool) -> None:
        """End a task the supervisor cannot carry on with, and tell its worker to stop it."""
        worker = run.worker
        await self._fail(run, code, message, retryable=retryable)
        if worker is not None:
            self._nursery.start_soon(self._tell_worker_stop, worker, run.task_id, message)

    async def _stderr_tail_as_blob(self, payload: Model) -> Model:
        """A worker's ``task.failed`` may carry its runtime's stderr tail as text (``details.stderr_tail``): it
        is stored as a blob and the event keeps only ``details.stderr_tail_ref``, as for a crashed worker."""
        if not isinstance(payload, TaskFailed) or not isinstance(payload.details.get("stderr_tail"), str):
            return payload
        details = dict(payload.details)
        tail = details.pop("stderr_tail")
        if tail:
            details["stderr_tail_ref"] = await self.store.put_blob(tail.encode("utf-8", "replace"),
                                                                   "text/plain; charset=utf-8")
        return payload.model_copy(update={"details": details})

    async def _raw_blob(self, raw: Any, inline: dict[str, tuple[bytes, str]] | None = None) -> str:
        """A runtime's raw message as a blob: small ones go into ``inline`` (committed with their event), big
        ones (or all, without ``inline``) are written now. JSON that can't be canonicalized (a 64-bit int, say)
        is kept as plain JSON."""
        try:
            data = canonical_json(raw)
        except CanonicalizationError:
            data = json.dumps(raw, ensure_ascii=False, default=str).encode()
        ref = sha256_hex(data)
        if inline is not None and len(data) <= INLINE_BLOB_MAX:
            inline[ref] = (data, "application/json")
            return ref
        return await self.store.put_blob(data, "application/json")

    def _accept(self, worker: WorkerProcess, params: RuntimeEventParams) -> TaskRun | None:
        """The run an event belongs to, or None (counted) if it is for an unknown or already ended task."""
        run = self._runs.get(params.task_id) or self._recent.get(params.task_id)
        if run is None or run.worker is not worker:
            self.stats.unknown_task_events += 1
            log.warning("%s: event %s for unknown task %r dropped", worker.spec.name, params.event.type,
                        params.task_id)
            return None
        if params.n < run.next_n:  # sent again (a retried notification): it was handled already
            self.stats.duplicate_events += 1
            log.warning("task %s: event ordinal %d again (expected %d); the repeat is dropped", run.task_id,
                        params.n, run.next_n)
            return None
        if params.n != run.next_n:
            self.stats.ordinal_gaps += 1
            log.warning("task %s: event ordinal %d, expected %d", run.task_id, params.n, run.next_n)
        run.next_n = params.n + 1
        if params.event.type in TERMINAL_EVENT_TYPES:
            run.released.set()
        if run.ended:
            run.late_events += 1
            self.stats.late_events += 1
            return None
        runtime, current = params.event.runtime, run.runtime
        if (runtime.runtime_session_id or runtime.model) and (
                runtime.name, runtime.model, runtime.runtime_session_id) != (
                current.name, current.model, current.runtime_session_id):  # copy only on change: hot path
            run.runtime = runtime.model_copy(update={"raw_ref": None})
        return run

    async def _tool_requested(self, run: TaskRun, requested: ToolCallRequested) -> None:
        input_value = requested.input or {}
        input_hash = canonical_hash(input_value)  # ours, not the worker's word for it
        key = (requested.tool_call_id, requested.attempt, input_hash)
        if key in run.requests_seen:  # the same request again (a replayed notification): it is handled already
            self.stats.duplicate_events += 1
            log.warning("task %s: tool call %s (attempt %d) requested again; not run twice", run.task_id,
                        requested.tool_call_id, requested.attempt)
            return
        run.requests_seen.add(key)
        attempt = run.attempts.get(requested.tool_call_id, 0) + 1
        run.attempts[requested.tool_call_id] = attempt
        if input_hash != requested.input_hash:
            self.stats.invalid_events += 1
            log.warning("task %s: worker's input_hash for %s was wrong", run.task_id, requested.tool_call_id)
        update: dict[str, Any] = {"attempt": attempt, "input_hash": input_hash}
        if len(canonical_json(input_value)) > INLINE_INPUT_MAX_BYTES:
            update.update(input=None, input_ref=await self.store.put_json_blob(input_value))
        requested = requested.model_copy(update=update)
        if requested.executed_by == ExecutedBy.SUPERVISOR and \
                run.params.interaction_mode != InteractionMode.INTERACTIVE:
            # Nobody is asked: decide here, in the worker's order, and store request and decision in one commit.
            rest = await self._tools.begin(run, requested, input_value, request_stored=False)
            if rest is not None and run.tools_nursery is not None:
                run.tools_nursery.start_soon(rest)
            return
        if not await self._append(run, [(EventType.TOOL_CALL_REQUESTED, requested)]):
            return
        assert run.tools_nursery is not None
        if requested.executed_by == ExecutedBy.RUNTIME:
            run.tools_nursery.start_soon(self._tools.handle_runtime_call, run, requested, input_value)
        else:
            run.tools_nursery.start_soon(self._tools.handle, run, requested, input_value)

    async def _on_worker_exit(self, namespace: str, worker: WorkerProcess, status: ExitStatus) -> None:
        for run in (*self._runs.values(), *self._recent.values()):
            if run.worker is worker:
                run.released.set()
        orphans = [r for r in self._runs.values() if r.worker is worker and not r.ended]
        if not orphans:
            return
        self.stats.worker_crashes += 1
        tail = worker.stderr.text()
        tail_ref = await self.store.put_blob(tail.encode("utf-8"), "text/plain; charset=utf-8") if tail else None
        for run in orphans:
            await self._fail(run, TaskFailureCode.WORKER_CRASHED,
                             f"the worker for namespace {namespace!r} {status.describe()} while the task was running",
                             retryable=True, worker_pid=worker.pid, stderr_tail_ref=tail_ref,
                             **status.to_json_obj())

    # -- appending ------------------------------------------------------------------------------

    async def _append(self, run: TaskRun, items: Sequence[tuple[Any, ...]],
                      blobs: Mapping[str, tuple[bytes, str]] | None = None, *, bulk: bool = False) -> bool:
        """Store events of a running task: (type, payload[, runtime info]) each, with the small blobs they name.
        False once the task has ended. ``bulk``: part of a long stream (see ``EventStore.append``)."""
        if run.ended:
            return False
        try:
            await self.store.append(run.session_id, [
                EventDraft(type=item[0], runtime=(item[2] if len(item) > 2 and item[2] else run.runtime),
                           payload=item[1], trace=run.trace) for item in items], blobs=blobs, bulk=bulk,
                quotas=self.config.quotas)
        except QuotaExceeded as exc:  # nothing of these was stored; the task ends here, once
            await self._over_quota(run, exc)
            return False
        return True

    async def _over_quota(self, run: TaskRun, exc: QuotaExceeded) -> None:
        log.warning("task %s: %s", run.task_id, exc)
        await self._fail_and_stop(run, TaskFailureCode.QUOTA_EXCEEDED, str(exc), retryable=False, **exc.details())

    async def _fail(self, run: TaskRun, code: str, message: str, *, retryable: bool, **details: Any) -> None:
        details = {k: v for k, v in details.items() if v is not None}
        await self._finish(run, EventType.TASK_FAILED, TaskFailed(code=code, message=message, retryable=retryable,
                                                                   details=details))

    async def _finish(self, run: TaskRun, event_type: EventType, payload: Model) -> None:
        """Store the one terminal event with the task's final state, atomically. Idempotent."""
        if run.ended:
            return
        run.ended = True  # before any await: nothing else of this task gets stored from here on
        run.terminal_type = event_type.value
        run.input_stored.set()
        if run.tools_nursery is not None:
            run.tools_nursery.cancel_scope.cancel()  # no tool starts or finishes after the end
        state = TaskState(event_type.value.removeprefix("task."))
        error = payload.to_json_obj() if event_type == EventType.TASK_FAILED else None
        draft = EventDraft(type=event_type, runtime=run.runtime, payload=payload, trace=run.trace)
        update = TaskUpdate(task_id=run.task_id, state=state, error=error)
        stored = False
        try:
            with trio.CancelScope(shield=True):
                try:
                    await self.store.append(run.session_id, [draft], task_update=update)
                    stored = True
                except DatabaseError as exc:  # the disk failed: keep trying; never report an unstored end
                    log.error("task %s: its %s could not be stored (%s); retrying until the store takes "
                              "writes again", run.task_id, event_type, exc)
                    self._nursery.start_soon(self._store_terminal_when_writable, run, draft, update)
        finally:
            self._runs.pop(run.task_id, None)
            self._recent[run.task_id] = run
            while len(self._recent) > RECENT_RUNS_KEPT:
                self._recent.popitem(last=False)
            if stored or not self._nursery_open():
                run.done.set()

    def _nursery_open(self) -> bool:
        return not self._nursery.cancel_scope.cancel_called

    async def _store_terminal_when_writable(self, run: TaskRun, draft: EventDraft, update: TaskUpdate) -> None:
        delay = 0.1
        try:
            while True:
                await trio.sleep(delay)
                delay = min(delay * 2, 5.0)
                try:
                    await self.store.append(run.session_id, [draft], task_update=update)
                    log.info("task %s: its %s is stored now", run.task_id, draft.type)
                    return
                except DatabaseError:
                    continue
                except StoreError:  # closed: the next start fails the task as SUPERVISOR_RESTARTED
                    return
        finally:
            run.done.set()


#: A task whose runtime has sent more events than this is a stream: its plain events are stored as bulk appends
#: (at most the pool's EVENT_BATCH each), which the store's writer commits taking turns with every other write.
STREAM_AFTER_EVENTS = 256
#: While anyone else's write was committed this recently, a stream's events go in parts of SHARE_QUANTUM events,
#: each followed by a pause as long as it took (``Engine._share``).
SHARE_WINDOW_S = 0.1
SHARE_QUANTUM = 32


def _named_blobs(items: Sequence[tuple[Any, ...]],
                 blobs: Mapping[str, tuple[bytes, str]] | None) -> dict[str, tuple[bytes, str]] | None:
    """The small raw blobs these events name (a stream's part is committed with its own events' blobs)."""
    if not blobs:
        return None
    refs = {item[2].raw_ref for item in items if len(item) > 2 and item[2] is not None}
    return {ref: blob for ref, blob in blobs.items() if ref in refs} or None


def _is_stream(run: TaskRun) -> bool:
    return run.next_n > STREAM_AFTER_EVENTS


#: Tool events a worker may send only for runtime-executed calls the policy approved.
_RUNTIME_TOOL_EVENTS = frozenset({EventType.TOOL_CALL_STARTED, EventType.TOOL_OUTPUT_DELTA,
                                  EventType.TOOL_OUTPUT_COMPLETED, EventType.TOOL_CALL_COMPLETED})

_FAILURE_FOR_RPC_ERROR: dict[int, str] = {
    ErrorCode.UNKNOWN_RUNTIME: TaskFailureCode.RUNTIME_UNAVAILABLE,
    ErrorCode.RUNTIME_UNAVAILABLE: TaskFailureCode.RUNTIME_UNAVAILABLE,
    ErrorCode.INVALID_PARAMS: TaskFailureCode.PROTOCOL_ERROR,
    ErrorCode.INVALID_SCENARIO: "INVALID_SCENARIO",
}


def _code_for_rpc(code: int) -> str:
    return _FAILURE_FOR_RPC_ERROR.get(code, TaskFailureCode.RUNTIME_ERROR)
