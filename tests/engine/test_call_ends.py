"""A tool call cut short by the task's end is ended in the log too: ``tool.call.started`` is followed by exactly one
``tool.call.completed`` (``is_error``, ``cut_short`` saying how) on every path by which a task ends while a call runs
— a stop, the runtime's failure, the worker's death, a supervisor restart, the namespace's lease lost."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from codesdk.protocol import (
    CallCutShort,
    EventType,
    ExecutedBy,
    Method,
    NormalizedEvent,
    PermissionMode,
    TaskFailed,
    ToolCallCompleted,
    ToolCallRequested,
    ToolCallStarted,
    canonical_hash,
)
from codesdk.supervisor.engine import Engine, session_events
from codesdk.supervisor.store import TaskState
from codesdk.testing.invariants import check_session

from tests.engine.doubles import FakeWorker, FakeWorkers, engine_with_doubles, running_task

_INPUT = {"command": "sleep 600"}


async def _call_running(engine: Engine, workers: FakeWorkers) -> tuple[str, str, FakeWorker]:
    """A task whose runtime runs a call of its own (approved) that has started and not finished."""
    sid, task_id, worker = await running_task(engine, workers, permission_mode=PermissionMode.YOLO)
    await worker.emit(task_id, EventType.TOOL_CALL_REQUESTED, ToolCallRequested(
        tool_call_id="call_1", input_hash=canonical_hash(_INPUT), tool_name="Bash", input=_INPUT,
        executed_by=ExecutedBy.RUNTIME))
    await worker.connection.wait_for(Method.SEND_TOOL_APPROVED)
    await worker.emit(task_id, EventType.TOOL_CALL_STARTED, ToolCallStarted(
        tool_call_id="call_1", input_hash=canonical_hash(_INPUT), tool_name="Bash", executed_by=ExecutedBy.RUNTIME,
        execution_env="runtime"))
    while EventType.TOOL_CALL_STARTED not in [e.type for e in await session_events(engine.store, sid)]:
        await trio.sleep(0.01)
    return sid, task_id, worker


def _ends(events: list[NormalizedEvent]) -> list[ToolCallCompleted]:
    return [e.payload for e in events if isinstance(e.payload, ToolCallCompleted)]


def _check(events: list[NormalizedEvent], how: CallCutShort) -> None:
    check_session(events)
    ends = _ends(events)
    assert len(ends) == 1, [e.type.value for e in events]
    assert ends[0].tool_call_id == "call_1" and ends[0].is_error and ends[0].cut_short == how
    assert ends[0].executed_by == ExecutedBy.RUNTIME and ends[0].tool_name == "Bash"
    types = [e.type for e in events]
    assert types.index(EventType.TOOL_CALL_COMPLETED) == len(types) - 2  # right before the terminal event


async def test_a_stop_ends_the_running_call_as_cancelled(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with engine_with_doubles(tmp_path) as (engine, workers):
            sid, task_id, _worker = await _call_running(engine, workers)
            record = await engine.stop_task(task_id)
            events = await session_events(engine.store, sid)
    assert record.state == TaskState.STOPPED
    _check(events, CallCutShort.CANCELLED)


async def test_the_runtimes_failure_ends_the_running_call_as_interrupted(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with engine_with_doubles(tmp_path) as (engine, workers):
            sid, task_id, worker = await _call_running(engine, workers)
            await worker.emit(task_id, EventType.TASK_FAILED, TaskFailed(code="RUNTIME_CRASHED", message="it died"))
            await engine.wait_task(task_id)
            events = await session_events(engine.store, sid)
    _check(events, CallCutShort.INTERRUPTED)


async def test_the_workers_death_ends_the_running_call_as_worker_gone(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with engine_with_doubles(tmp_path) as (engine, workers):
            sid, task_id, worker = await _call_running(engine, workers)
            await worker.exit(-9)
            await engine.wait_task(task_id)
            events = await session_events(engine.store, sid)
    _check(events, CallCutShort.WORKER_GONE)


@pytest.mark.parametrize("how", ["lease-lost", "supervisor-gone"])
async def test_a_call_left_running_by_a_supervisor_that_is_gone_is_ended_when_its_task_is_failed(
        tmp_path: Path, how: str) -> None:
    with trio.fail_after(30):
        async with engine_with_doubles(tmp_path) as (engine, workers):
            sid, task_id, _worker = await _call_running(engine, workers)
            namespace = (await engine.store.get_session(sid)).namespace
            # What a lost lease does (and, for a supervisor killed outright, what is left in the store alike):
            # the run is dropped here without an end; the end is the next holder's to store.
            await engine.leasing._lost(namespace)  # noqa: SLF001
            if how == "lease-lost":  # the namespace's next holder (here ourselves) fails the orphans it finds
                await engine.leasing._fail_orphans(namespace)  # noqa: SLF001
                events = await session_events(engine.store, sid)
        if how == "supervisor-gone":
            async with engine_with_doubles(tmp_path) as (engine, workers):  # restart: recovery fails the orphans
                events = await session_events(engine.store, sid)
    assert events[-1].type == EventType.TASK_FAILED
    _check(events, CallCutShort.INTERRUPTED)
