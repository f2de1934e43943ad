"""Steering: a user's input sent into a running task, and what becomes of it.

The engine sends it to the task's worker (``runtime.sendInput``) and keeps it until the worker reports its delivery
(``model.input.appended``, ``mid_turn``). Whatever the runtime had not taken when the task ends — it steers only at
a model boundary, or not at all — is stored with the task's end as ``queued``: the session's next task opens its
prompt with it (``_compile``). So every input accepted is in the session's log exactly once, whatever the end.
"""

from __future__ import annotations

import logging

import trio

from codesdk.protocol import (
    ErrorCode,
    EventType,
    InputDelivery,
    ModelInputAppended,
    Rpc,
    SendInputParams,
    SendInputResult,
)
from codesdk.worker.client import RpcError, WorkerError

from ..store import EventDraft
from ._errors import InvalidTaskInput, RuntimeUnavailable, TaskNotActive
from ._runs import TaskRun

log = logging.getLogger("codesdk.supervisor.engine")

#: Seconds a worker has to answer ``runtime.sendInput`` (a working one does at once).
SEND_WAIT_S = 10.0


async def send_input(run: TaskRun, params: SendInputParams) -> SendInputResult:
    """Hand ``params`` to the task's worker: ``TaskNotActive`` if the task ended (or its worker no longer has it),
    ``InvalidTaskInput`` for an input id the task has already, ``RuntimeUnavailable`` if the worker does not
    answer. Kept before it is sent: its delivery may come first."""
    worker = run.worker
    if run.ended or run.stop is not None:
        raise TaskNotActive(f"task {run.task_id} is ending: it takes no more input; start a task with it instead")
    if worker is None or not run.input_stored.is_set():
        raise TaskNotActive(f"task {run.task_id} is still starting (its runtime has not taken it yet): send the "
                            "input again once it runs")
    if params.input_id in run.inputs:  # checked and kept with no await between: two sends of one id cannot race
        raise InvalidTaskInput(f"input_id {params.input_id!r} is used already in this session: give a new one")
    run.inputs[params.input_id] = params
    try:
        with trio.fail_after(SEND_WAIT_S):
            return await worker.connection.request(Rpc.SEND_INPUT, params)
    except RpcError as exc:
        run.inputs.pop(params.input_id, None)
        if exc.code == ErrorCode.UNKNOWN_TASK:
            raise TaskNotActive(f"task {run.task_id} has ended: it takes no more input; start a task with it "
                                "instead") from exc
        if exc.code == ErrorCode.INVALID_PARAMS:  # an input id the worker's task had already
            raise InvalidTaskInput(f"the task refused the input: {exc.message}") from exc
        raise RuntimeUnavailable(f"the worker refused the input: {exc.message}") from exc
    except (trio.TooSlowError, WorkerError) as exc:
        run.inputs.pop(params.input_id, None)
        raise RuntimeUnavailable(f"the task's worker did not take the input ({exc or 'no answer'}); send it "
                                 "again") from exc


def reported(run: TaskRun, payload: ModelInputAppended) -> ModelInputAppended | None:
    """The event to store for a worker's report of a delivery, with the text and hash the supervisor sent (not the
    worker's word for them); None (dropped) for an input this task was never sent, or reported before."""
    params = run.inputs.pop(payload.input_id, None)
    if params is None:
        log.warning("task %s: delivery of input %r it was not sent (or reported twice); dropped", run.task_id,
                    payload.input_id)
        return None
    return payload.model_copy(update={"text": params.text(), "input_hash": params.hash()})


def carried(run: TaskRun) -> list[EventDraft]:
    """A ``queued`` ``model.input.appended`` for each input the runtime never took, stored with the task's end:
    the session's next task carries them."""
    left, run.inputs = list(run.inputs.values()), {}
    return [EventDraft(type=EventType.MODEL_INPUT_APPENDED, runtime=run.runtime, trace=run.trace,
                       payload=ModelInputAppended(input_id=p.input_id, text=p.text(), input_hash=p.hash(),
                                                  delivery=InputDelivery.QUEUED)) for p in left]
