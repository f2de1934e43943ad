"""A task start that fails after the task's row exists still ends the task, with exactly one terminal event, and
leaves the session free for the next task (``Engine._abandon``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from codesdk.testing.invariants import check_session
from protocol import EventType, TaskFailureCode
from supervisor.engine._transcript import session_events
from supervisor.store import DatabaseError, TaskState

from .doubles import engine_with_doubles


async def test_a_start_that_fails_after_its_row_exists_ends_the_task_once(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    with trio.fail_after(30):
        async with engine_with_doubles(tmp_path) as (engine, _):
            session = await engine.create_session()
            real_put_blob = engine.store.put_blob

            async def failing_put_blob(*args: Any, **kwargs: Any) -> str:
                raise DatabaseError("the disk failed while storing the compiled input")

            monkeypatch.setattr(engine.store, "put_blob", failing_put_blob)
            with pytest.raises(DatabaseError):
                await engine.start_task(session.session_id, "x")
            monkeypatch.setattr(engine.store, "put_blob", real_put_blob)
            tasks = await engine.store.list_tasks(session.session_id)
            assert [t.state for t in tasks] == [TaskState.FAILED]
            assert tasks[0].error is not None and tasks[0].error["code"] == TaskFailureCode.INTERNAL
            assert "could not be started" in tasks[0].error["message"]
            assert engine.active_task(session.session_id) is None
            again = await engine.start_task(session.session_id, "y")  # the session is not wedged
            assert again.task_id != tasks[0].task_id
            events = await session_events(engine.store, session.session_id)
    first = [e for e in events if e.trace.task_id == tasks[0].task_id]
    assert [e.type for e in first] == [EventType.TASK_STARTED, EventType.TASK_FAILED]
    check_session(events[: events.index(first[-1]) + 1])
