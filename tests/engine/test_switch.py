"""A task on another runtime moves its session there only once it ends well there: one that fails (the runtime is
not logged in, refuses the task) leaves the session on its runtime, with its runtime session id."""

from __future__ import annotations

from pathlib import Path

import trio

from codesdk.protocol import (
    EventType,
    Method,
    RuntimeEventParams,
    RuntimeInfo,
    TaskCompleted,
    TaskFailed,
    TaskFailureCode,
    WorkerEvent,
)
from codesdk.supervisor.engine import Engine

from tests.engine.doubles import FakeWorker, engine_with_doubles


async def _task_on(engine: Engine, worker: FakeWorker, session_id: str, runtime: str, *, runtime_session_id: str,
                   fails: bool) -> None:
    """A task on ``runtime`` whose runtime names its own session, then fails or completes."""
    before = len([m for m, _ in worker.connection.requests if m == Method.START_TASK])
    task = await engine.start_task(session_id, "go on", runtime=runtime)
    sent = await worker.connection.wait_for(Method.START_TASK, before + 1)
    assert sent[-1]["runtime"] == runtime and sent[-1]["session"].get("runtime_session_id") is None
    end = (EventType.TASK_FAILED, TaskFailed(code=TaskFailureCode.AUTH_REQUIRED, message="log in first")) if fails \
        else (EventType.TASK_COMPLETED, TaskCompleted())
    await worker.emit_batch([RuntimeEventParams(task_id=task.task_id, n=worker.next_n(task.task_id), event=WorkerEvent(
        type=end[0], runtime=RuntimeInfo(name=runtime, runtime_session_id=runtime_session_id), payload=end[1]))])
    await engine.wait_task(task.task_id)


async def test_a_switch_is_kept_only_when_its_task_ends_well(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with engine_with_doubles(tmp_path) as (engine, workers):
            session = await engine.create_session()
            sid = session.session_id
            await engine.store.update_session(sid, runtime_session_id="scripted-own")
            worker = workers.worker(session.namespace)
            await _task_on(engine, worker, sid, "other", runtime_session_id="other-1", fails=True)
            stayed = await engine.store.get_session(sid)
            assert (stayed.runtime, stayed.runtime_session_id) == ("scripted", "scripted-own")
            await _task_on(engine, worker, sid, "other", runtime_session_id="other-2", fails=False)
            moved = await engine.store.get_session(sid)
            assert (moved.runtime, moved.runtime_session_id) == ("other", "other-2")
