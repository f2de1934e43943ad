"""A task start that fails after the task's row exists still ends the task, with exactly one terminal event, and
leaves the session free for the next task (``Engine._abandon``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from codesdk.testing.invariants import check_session
from codesdk.protocol import EventType, TaskFailureCode
from codesdk.supervisor.engine import session_events
from codesdk.supervisor.store import DatabaseError, TaskState

from tests.engine.doubles import engine_with_doubles


async def test_a_start_that_fails_after_its_row_exists_ends_the_task_once(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    with trio.fail_after(30):
        async with engine_with_doubles(tmp_path) as (engine, _):
            session = await engine.create_session()
            real_append = engine.store.append
            failures = [DatabaseError("the disk failed while storing task.started")]

            async def append_failing_once(*args: Any, **kwargs: Any) -> Any:
                if failures:
                    raise failures.pop()
                return await real_append(*args, **kwargs)

            monkeypatch.setattr(engine.store, "append", append_failing_once)
            with pytest.raises(DatabaseError):
                await engine.start_task(session.session_id, "x")
            monkeypatch.setattr(engine.store, "append", real_append)
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


async def test_an_input_that_cannot_be_stored_fails_the_task_once_and_frees_the_session(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The input is compiled once the worker is known; a store that fails then fails the task (retryable)."""
    with trio.fail_after(30):
        async with engine_with_doubles(tmp_path) as (engine, _):
            session = await engine.create_session()
            real_put_blob = engine.store.put_blob

            async def failing_put_blob(*args: Any, **kwargs: Any) -> str:
                raise DatabaseError("the disk failed while storing the compiled input")

            monkeypatch.setattr(engine.store, "put_blob", failing_put_blob)
            task = await engine.start_task(session.session_id, "x")
            record = await engine.wait_task(task.task_id)
            monkeypatch.setattr(engine.store, "put_blob", real_put_blob)
            assert record.state == TaskState.FAILED and record.error is not None
            assert record.error["code"] == TaskFailureCode.INTERNAL and record.error["retryable"]
            assert "could not be compiled" in record.error["message"]
            again = await engine.start_task(session.session_id, "y")  # the session is not wedged
            assert engine.active_task(session.session_id) == again.task_id
            events = await session_events(engine.store, session.session_id)
    check_session(events)
    assert [e.type for e in events if e.trace.task_id == task.task_id] == [EventType.TASK_STARTED,
                                                                           EventType.TASK_FAILED]
