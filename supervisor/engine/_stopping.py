"""Carrying out a stop, and its receipt: the task's tool calls in flight are ended (and how each ended is read back
from the store), the worker is asked to stop the task and waited for, and what it did (the interrupt, whether the
runtime honoured it, each runtime process ended and checked gone) joins the receipt the task ends with.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import trio

from codesdk.protocol import (
    MAX_STOP_GRACE_S,
    CallCutShort,
    CallEnding,
    CallInFlight,
    CallStage,
    EventType,
    ExecutedBy,
    Model,
    Rpc,
    StopParams,
    StopReceipt,
    TaskStopped,
    ToolCallCompleted,
    ToolCallRequested,
    ToolCallStarted,
    WorkerAnswer,
)

from ..store import StoreReader
from ._deadlines import Expiry
from codesdk.worker.client import RpcError, WorkerError
from ._ports import WorkerLink

log = logging.getLogger("codesdk.supervisor.engine")

#: Seconds a worker has to acknowledge ``runtime.stop`` (a working one does at once; one that does not is not
#: answering: the stop is recorded so, and the worker is left to the pool's watch).
ACK_WAIT_S = 5.0
#: The runtimes' usual grace (``runtime_config.stop_grace_s``; a task may give a longer one), and what the worker
#: needs beyond it: the runtime's SIGTERM grace, the SIGKILL, the check that its processes are gone.
USUAL_GRACE_S, END_MARGIN_S = 5.0, 10.0
#: Seconds a stop waits for the supervisor's own tool runs to unwind once cancelled.
TOOLS_WAIT_S = 10.0

_CALL_TYPES = (EventType.TOOL_CALL_REQUESTED, EventType.APPROVAL_REQUESTED, EventType.TOOL_CALL_APPROVED,
               EventType.TOOL_CALL_STARTED, EventType.TOOL_CALL_COMPLETED, EventType.TOOL_CALL_DENIED)


@dataclass
class StopInProgress:
    """A stop being carried out: from here on the task's events are not stored, its worker's end is awaited."""

    reason: str
    requested_by: str
    started: float = field(default_factory=trio.current_time)
    #: Set when the worker ended the task (its terminal event) or the worker itself ended.
    worker_ended: trio.Event = field(default_factory=trio.Event)
    worker_terminal: tuple[EventType, Model] | None = None
    worker_exit: str | None = None
    #: The deadline that passed, when the supervisor stops the task for it: it then fails ``TASK_TIMEOUT``.
    expiry: Expiry | None = None

    def terminal_arrived(self, event_type: EventType, payload: Model) -> None:
        self.worker_terminal = (event_type, payload)
        self.worker_ended.set()

    def worker_exited(self, how: str) -> None:
        self.worker_exit = how
        self.worker_ended.set()


async def calls_in_flight(store: StoreReader, session_id: str, task_id: str) -> dict[str, tuple[str, CallStage]]:
    """The task's tool calls without an end (completed or denied), as stored: id -> (tool, stage)."""
    stages: dict[str, tuple[str, CallStage]] = {}
    runtime_run: set[str] = set()
    after = 0
    while page := await store.read_types(session_id, _CALL_TYPES, after, 1000, task_id=task_id):
        after = page[-1].seq
        for event in page:
            payload = event.payload
            call = str(getattr(payload, "tool_call_id", ""))
            if isinstance(payload, ToolCallRequested):
                stages[call] = (payload.tool_name, CallStage.DECIDING)
                if payload.executed_by == ExecutedBy.RUNTIME:
                    runtime_run.add(call)
            elif call in stages and event.type == EventType.APPROVAL_REQUESTED:
                stages[call] = (stages[call][0], CallStage.AWAITING_APPROVAL)
            elif call in stages and event.type in (EventType.TOOL_CALL_APPROVED, EventType.TOOL_CALL_STARTED):
                stage = CallStage.RUNNING_IN_RUNTIME if call in runtime_run else CallStage.RUNNING
                stages[call] = (stages[call][0], stage)
            elif event.type in (EventType.TOOL_CALL_COMPLETED, EventType.TOOL_CALL_DENIED):
                stages.pop(call, None)
    return stages


_RUN_TYPES = (EventType.TOOL_CALL_STARTED, EventType.TOOL_CALL_COMPLETED)


async def open_calls(store: StoreReader, session_id: str, task_id: str) -> list[ToolCallStarted]:
    """The task's calls (each attempt) stored as started and not completed, in the order they started."""
    started: dict[tuple[str, int], ToolCallStarted] = {}
    after = 0
    while page := await store.read_types(session_id, _RUN_TYPES, after, 1000, task_id=task_id):
        after = page[-1].seq
        for event in page:
            payload = event.payload
            if isinstance(payload, ToolCallStarted):
                started[(payload.tool_call_id, payload.attempt)] = payload
            elif isinstance(payload, ToolCallCompleted):
                started.pop((payload.tool_call_id, payload.attempt), None)
    return list(started.values())


_CUT_SHORT_PREVIEW = {
    CallCutShort.CANCELLED: "cancelled: the task was stopped while the call ran; its result never came",
    CallCutShort.INTERRUPTED: "interrupted: the task ended while the call ran; its result never came",
    CallCutShort.WORKER_GONE: "interrupted: the worker running the task died while the call ran; its result never "
                              "came",
}


def cut_short_ends(calls: list[ToolCallStarted], how: CallCutShort) -> list[ToolCallCompleted]:
    """The ``tool.call.completed`` that ends each of these calls, cut short by its task's end: an error, saying
    how it ended (the call's own result never came)."""
    return [ToolCallCompleted(
        tool_call_id=call.tool_call_id, runtime_tool_call_id=call.runtime_tool_call_id, attempt=call.attempt,
        input_hash=call.input_hash, tool_name=call.tool_name, is_error=True, executed_by=call.executed_by,
        execution_env=call.execution_env, sandbox=call.sandbox, result_preview=_CUT_SHORT_PREVIEW[how],
        cut_short=how) for call in calls]


def call_endings(before: dict[str, tuple[str, CallStage]], after: dict[str, tuple[str, CallStage]],
                 ) -> tuple[CallInFlight, ...]:
    """How each call in flight when the stop came ended, from where it was then and whether it is still open."""
    endings = {CallStage.DECIDING: CallEnding.NEVER_RUN, CallStage.AWAITING_APPROVAL: CallEnding.NEVER_RUN,
               CallStage.RUNNING: CallEnding.CANCELLED, CallStage.RUNNING_IN_RUNTIME: CallEnding.ENDED_WITH_RUNTIME}
    return tuple(CallInFlight(tool_call_id=call, tool_name=tool, stage=stage,
                              ended=endings[stage] if call in after else CallEnding.COMPLETED)
                 for call, (tool, stage) in before.items())


def end_wait_s(runtime_config: dict[str, object]) -> float:
    """How long a stop waits for the worker to end the task once it has acknowledged the stop."""
    grace = runtime_config.get("stop_grace_s")
    given = float(grace) if isinstance(grace, (int, float)) and not isinstance(grace, bool) else 0.0
    return min(max(given, USUAL_GRACE_S), MAX_STOP_GRACE_S) + END_MARGIN_S


async def stop_in_worker(worker: WorkerLink | None, task_id: str, stop: StopInProgress,
                         end_wait: float) -> StopReceipt:
    """Ask the worker to stop the task (``ACK_WAIT_S``) and wait (``end_wait``) for it to end there: the worker's
    part of the receipt, and what the supervisor saw of the worker."""
    if worker is None:
        return StopReceipt(worker=WorkerAnswer.NOT_STARTED, worker_detail="the task had not reached a worker")
    if not stop.worker_ended.is_set() and not worker.exited.is_set():
        try:
            with trio.fail_after(ACK_WAIT_S):
                await worker.connection.request(Rpc.STOP, StopParams(task_id=task_id, reason=stop.reason))
        except RpcError as exc:  # it does not have the task: it never took it, or has just ended it
            if not stop.worker_ended.is_set():
                return StopReceipt(worker=WorkerAnswer.NOT_STARTED,
                                   worker_detail=f"the worker does not have the task: {exc.message}")
        except trio.TooSlowError:
            if not stop.worker_ended.is_set():
                return StopReceipt(worker=WorkerAnswer.NO_ANSWER, worker_detail=f"the worker did not acknowledge "
                                   f"the stop within {ACK_WAIT_S:.0f} s")
        except WorkerError as exc:
            log.info("stop of %s not delivered: %s", task_id, exc)
    with trio.move_on_after(end_wait):
        await stop.worker_ended.wait()
    if stop.worker_terminal is not None:
        event_type, payload = stop.worker_terminal
        own = payload.receipt if isinstance(payload, TaskStopped) and payload.receipt is not None else StopReceipt()
        ended_as = None if event_type == EventType.TASK_STOPPED else event_type.value
        return own.model_copy(update={"worker": WorkerAnswer.CONFIRMED, "runtime_ended_as": ended_as})
    if stop.worker_exit is not None or worker.exited.is_set():
        return StopReceipt(worker=WorkerAnswer.EXITED, worker_detail=f"the worker {stop.worker_exit or 'exited'}; "
                           "what it left running is ended by the supervisor's sweep of orphaned processes")
    return StopReceipt(worker=WorkerAnswer.NO_ANSWER,
                       worker_detail=f"the worker did not end the task within {end_wait:.0f} s of the stop")
