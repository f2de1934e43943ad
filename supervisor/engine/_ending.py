"""How a task ends: its one terminal event, stored with its final state, and then nothing more of it."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from codesdk.protocol import (
    CallCutShort,
    EventType,
    Model,
    Rpc,
    StopParams,
    TaskFailed,
    TaskFailureCode,
)

from ..store import (
    DatabaseError,
    EventDraft,
    InvalidTransition,
    QuotaExceeded,
    Recorder,
    StoreError,
    TaskState,
    TaskUpdate,
)
from codesdk.worker.client import WorkerError
from ._ports import WorkerLink
from ._runs import RunTable, TaskRun
from ._steering import carried
from ._stopping import cut_short_ends, open_calls

log = logging.getLogger("codesdk.supervisor.engine")

#: Seconds to wait for a worker to accept runtime.startTask / runtime.stop.
REQUEST_TIMEOUT_S = 30.0
#: Seconds between retries of a terminal event the disk refused, at first; doubled up to the maximum.
TERMINAL_RETRY_S, TERMINAL_RETRY_MAX_S = 0.1, 5.0
#: Seconds a task's end waits for its appends under way to settle before it reads which of its calls are open.
APPENDS_WAIT_S = 10.0


def cut_short_by(event_type: EventType, payload: Model) -> CallCutShort:
    """How a task's end ends the calls it leaves running: a stop cancels them, a worker's death takes them with
    it, any other end interrupts them."""
    if event_type == EventType.TASK_STOPPED:
        return CallCutShort.CANCELLED
    if isinstance(payload, TaskFailed) and payload.code == TaskFailureCode.TASK_TIMEOUT:
        return CallCutShort.CANCELLED  # stopped at its deadline, as a stop would
    if isinstance(payload, TaskFailed) and payload.code == TaskFailureCode.WORKER_CRASHED:
        return CallCutShort.WORKER_GONE
    return CallCutShort.INTERRUPTED


class TaskEnder:
    """Ends tasks, each exactly once. Runs in the engine's nursery what outlives the call: telling a worker to
    stop, and storing a terminal event the disk refused once it takes writes again."""

    def __init__(self, store: Recorder, runs: RunTable, nursery: trio.Nursery) -> None:
        self._store = store
        self._runs = runs
        self._nursery = nursery
        #: The ``question.answered`` events that close a task's open questions, stored with its terminal event
        #: (``QuestionBroker.close_for_end``; set by the engine).
        self.question_ends: Callable[[TaskRun], Awaitable[list[EventDraft]]] | None = None

    async def finish(self, run: TaskRun, event_type: EventType, payload: Model) -> None:
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
        run.telemetry.ended(state.value, str(payload.code) if isinstance(payload, TaskFailed) else "")
        update = TaskUpdate(task_id=run.task_id, state=state, error=error)
        stored = False
        try:
            with trio.CancelScope(shield=True):
                drafts = [*await self._call_ends(run, cut_short_by(event_type, payload)), *carried(run),
                          *await self._question_ends(run),
                          EventDraft(type=event_type, runtime=run.runtime, payload=payload, trace=run.trace)]
                try:
                    await self._store.append(run.session_id, drafts, task_update=update)
                    stored = True
                    if run.switched_from is not None and event_type != EventType.TASK_FAILED:
                        await self._keep_switch(run)
                except InvalidTransition:  # ended elsewhere: a supervisor that took the namespace over failed it
                    log.warning("task %s was ended elsewhere before its %s could be stored", run.task_id, event_type)
                    stored = True
                except DatabaseError as exc:  # the disk failed: keep trying; never report an unstored end
                    log.error("task %s: its %s could not be stored (%s); retrying until the store takes "
                              "writes again", run.task_id, event_type, exc)
                    self._nursery.start_soon(self._store_when_writable, run, drafts, update)
        finally:
            self._runs.end(run)
            if stored or self._nursery.cancel_scope.cancel_called:
                run.done.set()

    async def _call_ends(self, run: TaskRun, how: CallCutShort) -> list[EventDraft]:
        """A ``tool.call.completed`` for each call of the task stored as started and not completed, stored with its
        terminal event: an approved call is started → completed exactly once, however its task ends."""
        with trio.move_on_after(APPENDS_WAIT_S):  # an append under way may be the call's own completion
            while run.appending:
                await run.appends_settled.park()
        try:
            calls = await open_calls(self._store, run.session_id, run.task_id)
        except StoreError as exc:  # the end is stored all the same; the calls stay open in the log
            log.error("task %s: which of its tool calls are open could not be read: %s", run.task_id, exc)
            return []
        return [EventDraft(type=EventType.TOOL_CALL_COMPLETED, runtime=run.runtime, payload=end, trace=run.trace)
                for end in cut_short_ends(calls, how)]

    async def _question_ends(self, run: TaskRun) -> list[EventDraft]:
        if self.question_ends is None:
            return []
        try:
            return await self.question_ends(run)
        except StoreError as exc:  # the end is stored all the same; the questions stay open in the log
            log.error("task %s: its open questions could not be closed: %s", run.task_id, exc)
            return []

    async def _keep_switch(self, run: TaskRun) -> None:
        """A task that moved its session to another runtime ended well there: the session is that runtime's now,
        with the runtime's own session id (a failed one leaves the session where it was)."""
        try:
            run.session = await self._store.update_session(run.session_id, runtime=run.params.runtime,
                                                           runtime_session_id=run.runtime.runtime_session_id)
        except StoreError as exc:  # the move is lost, not the task: the session stays on its runtime
            log.error("task %s: the session's move to %s could not be stored: %s", run.task_id,
                      run.params.runtime, exc)

    async def fail(self, run: TaskRun, code: str, message: str, *, retryable: bool, **details: Any) -> None:
        details = {k: v for k, v in details.items() if v is not None}
        await self.finish(run, EventType.TASK_FAILED, TaskFailed(code=code, message=message, retryable=retryable,
                                                                  details=details))

    async def fail_and_stop(self, run: TaskRun, code: str, message: str, *, retryable: bool,
                            **details: Any) -> None:
        """End a task the supervisor cannot carry on with, and tell its worker to stop it."""
        worker = run.worker
        await self.fail(run, code, message, retryable=retryable, **details)
        if worker is not None:
            self.tell_worker_stop(worker, run.task_id, message)

    async def lost_events(self, run: TaskRun, exc: DatabaseError) -> None:
        """Events of this task could not be stored (the disk failed): the task cannot complete truthfully.

        Its terminal event is stored as soon as the disk takes writes again; until then (or if the process
        dies first) the task stays running in the store and the next start fails it as SUPERVISOR_RESTARTED.
        """
        if run.ended:
            return
        log.error("task %s: events could not be stored (%s); stopping the task", run.task_id, exc)
        await self.fail_and_stop(run, TaskFailureCode.INTERNAL,
                                 f"the supervisor could not store the task's events: {exc}", retryable=True)

    async def over_quota(self, run: TaskRun, exc: QuotaExceeded) -> None:
        """The task's next events would pass a quota (none of them was stored): it ends here."""
        await self.fail_and_stop(run, TaskFailureCode.QUOTA_EXCEEDED, str(exc), retryable=False, **exc.details())

    def tell_worker_stop(self, worker: WorkerLink, task_id: str, reason: str) -> None:
        """Ask the worker to stop the task, in the background (best effort: the task has ended here)."""
        self._nursery.start_soon(self._request_stop, worker, task_id, reason)

    async def _request_stop(self, worker: WorkerLink, task_id: str, reason: str) -> None:
        with trio.move_on_after(REQUEST_TIMEOUT_S):
            try:
                await worker.connection.request(Rpc.STOP, StopParams(task_id=task_id, reason=reason))
            except WorkerError as exc:
                log.info("stop of %s not delivered: %s", task_id, exc)

    async def _store_when_writable(self, run: TaskRun, drafts: list[EventDraft], update: TaskUpdate) -> None:
        delay = TERMINAL_RETRY_S
        try:
            while True:
                await trio.sleep(delay)
                delay = min(delay * 2, TERMINAL_RETRY_MAX_S)
                try:
                    await self._store.append(run.session_id, drafts, task_update=update)
                    log.info("task %s: its %s is stored now", run.task_id, drafts[-1].type)
                    return
                except DatabaseError:
                    continue
                except StoreError:  # closed: the next start fails the task as SUPERVISOR_RESTARTED
                    return
        finally:
            run.done.set()
