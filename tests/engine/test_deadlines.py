"""Task deadlines at the engine: a task past ``timeout_s`` or ``idle_timeout_s`` is stopped through the stop's own
path and fails ``TASK_TIMEOUT`` (not retryable) with the stop's receipt; events flowing keep it alive; a call the
supervisor holds (an approval waiting for a human) does not count as idle; bad values and values over the
operator's maximum are refused before anything is stored; the operator's default is applied and stored; a task left
running by a supervisor that is gone fails ``TASK_TIMEOUT`` if its stored deadline passed meanwhile.

Trio's clock stands still here (``MockClock``): time moves only when a test jumps it, so no assertion depends on how
fast the machine is."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from codesdk.protocol import (
    ApprovalState,
    EventType,
    ExecutedBy,
    Method,
    ModelOutputDelta,
    PermissionMode,
    TaskFailed,
    TaskFailureCode,
    TaskStarted,
    ToolCallRequested,
    canonical_hash,
)
from codesdk.supervisor.engine import DeadlineLimits, Engine, InvalidTaskInput, session_events
from codesdk.supervisor.store import TaskState
from codesdk.testing.invariants import check_session

from tests.engine.doubles import FakeWorker, engine_with_doubles, running_task
from tests.waits import real_time_limit


async def _settle() -> None:
    """Let every task that can run do so (a deadline that has passed is acted on)."""
    await trio.testing.wait_all_tasks_blocked()


async def _given_back(engine: Engine, task_id: str) -> None:
    """Wait until the supervisor holds none of the task's calls (the hold ends after the answer is sent, and maybe
    a commit in the store's thread, which ``wait_all_tasks_blocked`` counts as blocked)."""
    run = engine._runs.active(task_id)  # noqa: SLF001 - the clock the deadline watch reads
    assert run is not None
    while run.clock.held:
        await trio.lowlevel.checkpoint()


def _not_stopping(engine: Engine, task_id: str) -> None:
    """Nothing is stopping the task: its deadline watch (which sets the run's stop at once when it acts) has not."""
    run = engine._runs.active(task_id)  # noqa: SLF001 - what the watch decided, before any of the stop's I/O
    assert run is not None and run.stop is None, "the task is being stopped"


async def _delta(worker: FakeWorker, task_id: str) -> None:
    await worker.emit(task_id, EventType.MODEL_OUTPUT_DELTA, ModelOutputDelta(block_id="b1", delta="x"))


async def _failed(engine: Engine, sid: str, task_id: str) -> TaskFailed:
    record = await engine.wait_task(task_id)
    assert record.state == TaskState.FAILED, record
    events = await session_events(engine.store, sid)
    check_session(events)
    assert events[-1].type == EventType.TASK_FAILED
    payload = events[-1].payload
    assert isinstance(payload, TaskFailed)
    return payload


def _check_timed_out(payload: TaskFailed, deadline: str, limit_s: float) -> None:
    assert payload.code == TaskFailureCode.TASK_TIMEOUT and not payload.retryable
    assert payload.details["deadline"] == deadline and payload.details["limit_s"] == limit_s
    assert f"{deadline} = {limit_s:g} s" in payload.message
    assert payload.details["receipt"]["worker"] == "confirmed", payload.details  # the worker ended it on our stop


async def test_a_task_past_its_timeout_is_stopped_and_fails_task_timeout_with_a_receipt(
        tmp_path: Path, still_clock: trio.testing.MockClock) -> None:
    with real_time_limit("the task and its deadline"):
        async with engine_with_doubles(tmp_path) as (engine, workers):
            sid, task_id, worker = await running_task(engine, workers, timeout_s=30)
            await _delta(worker, task_id)  # events flowing do not extend the wall-clock deadline
            still_clock.jump(29)
            await _settle()
            _not_stopping(engine, task_id)
            still_clock.jump(2)
            payload = await _failed(engine, sid, task_id)
            _check_timed_out(payload, "timeout_s", 30)
            (stop,) = await worker.connection.wait_for(Method.STOP)
            assert "timeout_s = 30 s" in stop["reason"]


async def test_a_runtime_silent_past_its_idle_timeout_is_stopped_and_fails_task_timeout(
        tmp_path: Path, still_clock: trio.testing.MockClock) -> None:
    with real_time_limit("the task and its deadline"):
        async with engine_with_doubles(tmp_path) as (engine, workers):
            sid, task_id, worker = await running_task(engine, workers, idle_timeout_s=10)
            await _delta(worker, task_id)  # it emits, then goes silent
            still_clock.jump(11)
            _check_timed_out(await _failed(engine, sid, task_id), "idle_timeout_s", 10)


async def test_events_flowing_keep_a_task_from_its_idle_timeout(tmp_path: Path,
                                                                 still_clock: trio.testing.MockClock) -> None:
    """Five events 6 s apart: 30 s of a task whose idle deadline is 10 s, never idle that long."""
    with real_time_limit("the task and its deadline"):
        async with engine_with_doubles(tmp_path) as (engine, workers):
            sid, task_id, worker = await running_task(engine, workers, idle_timeout_s=10)
            for _ in range(5):
                still_clock.jump(6)
                await _settle()
                _not_stopping(engine, task_id)
                await _delta(worker, task_id)
            assert engine.active_task(sid) == task_id
            still_clock.jump(11)  # then silent: the deadline is still armed
            _check_timed_out(await _failed(engine, sid, task_id), "idle_timeout_s", 10)
            deltas = [e for e in await session_events(engine.store, sid) if e.type == EventType.MODEL_OUTPUT_DELTA]
            assert len(deltas) == 5  # every one was stored: none came after the task had ended


@pytest.mark.parametrize(("tool", "tool_input", "executed_by", "answer", "in_flight"), [
    ("Bash", {"command": "make"}, ExecutedBy.RUNTIME, Method.SEND_TOOL_APPROVED, [("call_1", "running_in_runtime")]),
    ("workspace.write", {"path": "a.txt", "content": "a"}, ExecutedBy.SUPERVISOR, Method.SEND_TOOL_RESULT, []),
], ids=["runtime-runs-it", "supervisor-runs-it"])
async def test_a_call_waiting_for_a_human_does_not_count_as_idle(
        tmp_path: Path, still_clock: trio.testing.MockClock, tool: str, tool_input: dict[str, Any],
        executed_by: ExecutedBy, answer: str, in_flight: list[tuple[str, str]]) -> None:
    """An approval waits 60 s (idle deadline 10 s): the task is not idle — the runtime waits for us. Once the
    answer is sent the idle clock starts again from then."""
    with real_time_limit("the task and its deadline"):
        async with engine_with_doubles(tmp_path) as (engine, workers):
            sid, task_id, worker = await running_task(engine, workers, idle_timeout_s=10,
                                                      permission_mode=PermissionMode.ASK, durable_approvals=True)
            await worker.emit(task_id, EventType.TOOL_CALL_REQUESTED, ToolCallRequested(
                tool_call_id="call_1", input_hash=canonical_hash(tool_input), tool_name=tool, input=tool_input,
                executed_by=executed_by))
            pending = await _pending_approval(engine)
            still_clock.jump(60)
            await _settle()
            _not_stopping(engine, task_id)
            await engine.approvals.decide(pending, True, "user", "go on")
            await worker.connection.wait_for(answer)  # sent only to a task not ended
            await _given_back(engine, task_id)  # its idle clock restarts once the answer is sent: then time moves
            still_clock.jump(6)
            await _settle()
            _not_stopping(engine, task_id)
            still_clock.jump(5)
            payload = await _failed(engine, sid, task_id)
            _check_timed_out(payload, "idle_timeout_s", 10)
            # stopped after the human answered (the call in the runtime's hands, or done), not while it waited
            assert [(c["tool_call_id"], c["stage"]) for c in payload.details["receipt"]["tool_calls"]] == in_flight


async def _pending_approval(engine: Engine) -> str:
    for _ in range(10_000):  # each look is a read of the store: no busy loop
        pending = await engine.store.list_approvals(state=ApprovalState.PENDING)
        if pending:
            return pending[0].approval_id
    raise AssertionError("no approval was asked for")


@pytest.mark.parametrize("field", ["timeout_s", "idle_timeout_s"])
@pytest.mark.parametrize("value", [0, -1, math.nan, math.inf, True, "5"])
async def test_a_deadline_that_is_not_a_positive_finite_number_is_refused(tmp_path: Path, field: str,
                                                                         value: Any) -> None:
    async with engine_with_doubles(tmp_path) as (engine, _workers):
        session = await engine.create_session()
        with pytest.raises(InvalidTaskInput, match=f"{field} must be a finite number of seconds above 0"):
            await engine.start_task(session.session_id, "x", **{field: value})
        assert await engine.store.list_active_tasks() == []


async def test_a_deadline_above_the_operators_maximum_is_refused_and_the_default_applied(tmp_path: Path) -> None:
    limits = DeadlineLimits(timeout_default_s=60, timeout_max_s=600, idle_max_s=120)
    async with engine_with_doubles(tmp_path, deadlines=limits) as (engine, workers):
        session = await engine.create_session()
        with pytest.raises(InvalidTaskInput, match=r"timeout_s 601 s is above this supervisor's maximum of 600 s "
                                                   r"\(its operator's --task-timeout-max\)"):
            await engine.start_task(session.session_id, "x", timeout_s=601)
        with pytest.raises(InvalidTaskInput, match="idle_timeout_s 121 s is above"):
            await engine.start_task(session.session_id, "x", idle_timeout_s=121)
        task = await engine.start_task(session.session_id, "x")
        started = [e.payload for e in await session_events(engine.store, session.session_id)
                   if e.type == EventType.TASK_STARTED]
        assert isinstance(started[0], TaskStarted)
        assert (started[0].timeout_s, started[0].idle_timeout_s) == (60, 120)  # default; the max with no default
        await engine.stop_task(task.task_id)


def test_a_default_above_the_maximum_is_a_configuration_error() -> None:
    with pytest.raises(ValueError, match=r"timeout_default_s \(700 s\) is above timeout_max_s \(600 s\)"):
        DeadlineLimits(timeout_default_s=700, timeout_max_s=600)


@pytest.mark.parametrize(("timeout_s", "code"), [(3600, TaskFailureCode.TASK_TIMEOUT),
                                                  (3 * 3600, TaskFailureCode.SUPERVISOR_RESTARTED)])
async def test_a_task_left_running_by_a_supervisor_that_is_gone_fails_by_its_stored_deadline(
        tmp_path: Path, still_clock: trio.testing.MockClock, timeout_s: float, code: TaskFailureCode) -> None:
    """The supervisor is gone with the task running; the next one starts two hours later: a task whose 1 h
    deadline passed meanwhile fails TASK_TIMEOUT (not retryable), one with time left SUPERVISOR_RESTARTED."""
    with real_time_limit("the task and its deadline"):
        async with engine_with_doubles(tmp_path) as (engine, workers):
            sid, task_id, _worker = await running_task(engine, workers, timeout_s=timeout_s)
            namespace = (await engine.store.get_session(sid)).namespace
            await engine.leasing._lost(namespace)  # noqa: SLF001 - what a killed supervisor leaves in the store
        later = datetime.now(UTC) + timedelta(hours=2)
        async with engine_with_doubles(tmp_path, wall_clock=lambda: later) as (engine, workers):
            record = await engine.store.get_task(task_id)
            events = await session_events(engine.store, sid)
    check_session(events)
    assert record.state == TaskState.FAILED and isinstance(events[-1].payload, TaskFailed)
    payload = events[-1].payload
    assert payload.code == code and payload.retryable == (code == TaskFailureCode.SUPERVISOR_RESTARTED)
    if code == TaskFailureCode.TASK_TIMEOUT:
        assert payload.details["deadline"] == "timeout_s" and payload.details["limit_s"] == timeout_s
        assert "timeout_s = 3600 s" in payload.message
