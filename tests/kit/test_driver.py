"""The test kit's driver (codesdk.testing): a real worker over real pipes, driven as a test would drive one."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import psutil  # type: ignore[import-untyped]
import pytest
import trio

from codesdk.testing import (
    DrivenTask,
    RpcError,
    ToolAnswer,
    WorkerOutputEnded,
    WorkerStartError,
    WorkerTimedOut,
    check_worker_events,
    open_worker,
    run_worker,
)
from codesdk.protocol import ErrorCode, ErrorResponse, EventType, ModelOutputCompleted, ToolCallRequested


def _texts(events: list) -> list[str]:  # type: ignore[type-arg]
    return [e.event.payload.text for e in events if isinstance(e.event.payload, ModelOutputCompleted)]


async def test_a_task_streams_valid_events_and_the_wire_is_clean() -> None:
    with trio.fail_after(60):
        async with open_worker() as worker:
            assert "scripted" in {runtime.name for runtime in worker.info.runtimes}
            task = await worker.start_task("hello kit", scenario="echo")
            assert task.accepted["task_id"] == task.task_id
            events = await task.until_terminal()
    assert events[-1].event.type == EventType.TASK_COMPLETED
    assert any("hello kit" in text for text in _texts(events))
    check_worker_events(worker.received)
    assert worker.wire.count > len(events) and worker.wire.bad_lines() == []


async def test_a_policy_answers_tool_calls_and_a_hand_answer_is_checked_by_the_worker() -> None:
    seen: list[str] = []

    def policy(call: ToolCallRequested) -> ToolAnswer:
        seen.append(call.tool_call_id)
        return ToolAnswer.result({"text": f"<{call.tool_call_id}>"})

    with trio.fail_after(60):
        async with open_worker() as worker:
            events = await (await worker.start_task(scenario="parallel-tools")).until_terminal(answer=policy)
            by_hand = await worker.start_task(scenario="parallel-tools")
            await by_hand.next_event(EventType.TOOL_CALL_REQUESTED)
            await by_hand.next_event(EventType.TOOL_CALL_REQUESTED)
            await by_hand.send_result("call_b", {"text": "B"})
            with pytest.raises(RpcError) as refused:  # answered already (the task still waits for call_a)
                await by_hand.send_result("call_b", {"text": "again"})
            assert refused.value.code == ErrorCode.UNKNOWN_TOOL_CALL
            assert by_hand.pending_tool_calls() == ["call_a"]
            await by_hand.send_result("call_a", {"text": "A"})
            await by_hand.until_terminal()
            denied = await worker.start_task(scenario="write-or-deny")
            call = await denied.next_event(EventType.TOOL_CALL_REQUESTED)
            assert isinstance(call.event.payload, ToolCallRequested)
            await denied.deny(call.event.payload.tool_call_id, "not in this test")
            denied_events = await denied.until_terminal()
    assert sorted(seen) == ["call_a", "call_b"]
    assert any("<call_a>" in text and "<call_b>" in text for text in _texts(events))
    assert any("not in this test" in text for text in _texts(denied_events))


async def test_two_tasks_awaited_at_once_both_see_their_end() -> None:
    """Waits on one driver from two tasks at once: each wakes for the other's events too, and neither misses
    its own end (one waiter used to replace the wake-up the other slept on)."""
    ends: dict[str, EventType] = {}

    async def until_end(task: DrivenTask) -> None:
        ends[task.task_id] = (await task.until_terminal(timeout=60))[-1].event.type

    with trio.fail_after(60):
        async with open_worker() as worker:
            first, second = await worker.start_task(scenario="hang"), await worker.start_task(scenario="hang")
            async with trio.open_nursery() as nursery:
                nursery.start_soon(until_end, first)
                nursery.start_soon(until_end, second)
                await first.next_event()
                await second.next_event()
                await first.stop()
                await second.stop()
    assert ends == {first.task_id: EventType.TASK_STOPPED, second.task_id: EventType.TASK_STOPPED}


async def test_a_policy_that_answers_nothing_is_told_what_to_return() -> None:
    with trio.fail_after(60):
        async with open_worker() as worker:
            task = await worker.start_task(scenario="parallel-tools")
            with pytest.raises(TypeError, match="return a ToolAnswer"):
                await task.until_terminal(answer=lambda call: None)  # type: ignore[arg-type,return-value]


async def test_waits_that_cannot_succeed_fail_saying_what_was_seen() -> None:
    with trio.fail_after(60):
        async with open_worker() as worker:
            hung = await worker.start_task(scenario="hang")
            await hung.next_event(EventType.MODEL_OUTPUT_COMPLETED)
            with pytest.raises(WorkerTimedOut, match=r"no task.completed of task 'task-1' within 0.2 s\n.*"
                                                     r"events of 'task-1' so far"):
                await hung.next_event(EventType.TASK_COMPLETED, timeout=0.2)  # `hang` never sends another event
            await hung.stop("done waiting")
            assert (await hung.until_terminal())[-1].event.type == EventType.TASK_STOPPED
            unanswered = await worker.start_task(scenario="parallel-tools")
            with pytest.raises(WorkerTimedOut, match="tool calls still unanswered: call_a, call_b"):
                await unanswered.until_terminal(timeout=0.5)  # nobody answers: it cannot end
            await unanswered.stop()


async def test_a_worker_that_dies_mid_task_ends_the_wait_with_its_stderr() -> None:
    with trio.fail_after(60):
        async with open_worker() as worker:
            task = await worker.start_task(scenario="crash-exit")
            with pytest.raises(WorkerOutputEnded, match="crashing on purpose"):
                await task.until_terminal()
    check_worker_events(worker.received, ended=False)


async def test_leaving_the_block_reaps_everything_the_worker_started(tmp_path: Path) -> None:
    pidfile = tmp_path / "helper.pid"
    helper = ["sh", "-c", f'echo $$ > "{pidfile}"; exec sleep 1000']
    steps = [{"spawn": helper, "new_session": True}, {"hang": True}]
    with trio.fail_after(60):
        async with open_worker() as worker:
            await worker.start_task(runtime_config={"scenario_inline": {"name": "spawner", "steps": steps}})
            while not pidfile.exists() or not pidfile.read_text().strip():
                await trio.sleep(0.02)
            pid = int(pidfile.read_text())
            assert psutil.pid_exists(pid)
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE \
        and psutil.Process(pid).ppid() != os.getpid()


async def test_a_command_that_is_no_worker_fails_its_handshake_with_its_stderr() -> None:
    with trio.fail_after(60), pytest.raises(WorkerStartError, match="not a worker at all"):
        async with open_worker([sys.executable, "-c", "import sys; sys.stderr.write('not a worker at all')"]):
            pass


def test_the_blocking_driver_runs_a_task_without_trio() -> None:
    with run_worker() as worker:
        task = worker.start_task("from plain code", scenario="hang")
        first = task.next_event()
        assert first.n == 1
        assert task.stop("enough") == {"ok": True}
        events = task.until_terminal()
        assert events[-1].event.type == EventType.TASK_STOPPED
        echo = worker.start_task("again", scenario="echo")
        assert any("again" in text for text in _texts(echo.until_terminal()))


def test_the_blocking_driver_also_sends_hostile_lines_and_follows_the_worker_to_its_end() -> None:
    with run_worker() as worker:
        worker.send_raw(b"not json\n")
        answer = worker.answer_to(None)
        assert isinstance(answer, ErrorResponse) and answer.error.code == ErrorCode.PARSE_ERROR
        worker.request("runtime.startTask", {
            "runtime": "scripted", "task_id": "raw-1", "session": {"session_id": "s-raw"},
            "messages": [{"role": "user", "blocks": [{"type": "text", "text": "by hand"}]}],
            "runtime_config": {"scenario": "echo"}})
        events = worker.task("raw-1").until_terminal()
        assert events[-1].event.type == EventType.TASK_COMPLETED
        worker.close_input()  # stdin's end is the supervisor's: the worker ends
        assert worker.until_output_ends()[-1] == events[-1]
        assert worker.wait_exit().exit_code == 0
        assert worker.violations == []  # the parse error's id-less answer is the answer to our line, not a fault
