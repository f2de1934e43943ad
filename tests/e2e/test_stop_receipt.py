"""A stop returns, and stores with ``task.stopped``, its receipt: the interrupt, whether the runtime honoured it,
the signals each runtime process got and that it is gone (checked here too, with psutil), the tool calls in flight
and how each ended. Through the real supervisor and worker."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import psutil
import pytest
import trio

from codesdk.testing.invariants import check_session
from codesdk.protocol import (
    CallCutShort,
    CallEnding,
    CallStage,
    EventType,
    InteractionMode,
    NormalizedEvent,
    PermissionMode,
    StopReceipt,
    TaskStopped,
    WorkerAnswer,
)
from codesdk.supervisor.engine import ApprovalRequest, ApproverAnswer, Engine, session_events
from codesdk.supervisor.cli.render import describe_receipt
from codesdk.supervisor.store import TaskState

from tests.conftest import MakeEngine
from tests.waits import until

#: A runtime process that ignores SIGTERM, as does the child it starts in its group; both write their pids.
STUBBORN = """
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(3600)"])
open(sys.argv[1] + ".tmp", "w").write(f"{os.getpid()} {child.pid}")
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(3600)
"""


def _pids(path: Path) -> list[int]:
    return [int(p) for p in path.read_text().split()] if path.exists() else []


async def _stopped(engine: Engine, session_id: str, task_id: str) -> tuple[StopReceipt, list[NormalizedEvent]]:
    events = await session_events(engine.store, session_id)
    check_session(events)
    last = events[-1]
    assert last.trace.task_id == task_id and isinstance(last.payload, TaskStopped)
    assert last.payload.receipt is not None
    return last.payload.receipt, events


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def test_a_runtime_that_ignores_the_interrupt_is_ended_by_force_and_the_receipt_says_so(
        make_engine: MakeEngine, tmp_path: Path) -> None:
    ready = tmp_path / "pids"
    steps: list[dict[str, Any]] = [{"ignore_stop": True}, {"text": "working"},
                                   {"runtime_process": [sys.executable, "-c", STUBBORN, str(ready)]}]
    config = {"scenario_inline": {"name": "stubborn", "steps": steps}, "stop_grace_s": 0.2}
    with trio.fail_after(60):
        async with make_engine() as engine:
            session = await engine.create_session()
            task = await engine.start_task(session.session_id, "work", runtime_config=config)
            await until("the runtime process and its child", lambda: len(_pids(ready)) == 2)
            record = await engine.stop_task(task.task_id, reason="enough")
            receipt, _ = await _stopped(engine, session.session_id, task.task_id)
    assert record.state == TaskState.STOPPED
    assert (receipt.worker, receipt.interrupt_sent, receipt.acknowledged, receipt.forced) == (
        WorkerAnswer.CONFIRMED, True, False, True)
    assert receipt.grace_s == 0.2 and receipt.duration_ms is not None and receipt.worker_ms is not None
    (process,) = receipt.processes
    runtime_pid, child_pid = _pids(ready)
    assert process.pid == runtime_pid and process.name == "scripted runtime process"
    assert (process.term_sent, process.kill_sent, process.exit) == (True, True, "killed by signal SIGKILL")
    assert process.gone and receipt.processes_gone
    assert not _alive(runtime_pid) and not _alive(child_pid)  # what the receipt says, seen from outside
    shown = describe_receipt(receipt)
    assert "runtime did not stop within 0.2 s: cancelled by force" in shown
    assert "SIGTERM, SIGKILL: killed by signal SIGKILL, verified gone" in shown


async def test_a_runtime_that_honours_the_interrupt_acknowledges_it(make_engine: MakeEngine) -> None:
    config = {"scenario": "slow-stream", "stop_grace_s": 30}
    with trio.fail_after(60):
        async with make_engine() as engine:
            session = await engine.create_session()
            task = await engine.start_task(session.session_id, "count", runtime_config=config)
            await wait_for_event(engine, session.session_id, EventType.MODEL_OUTPUT_DELTA)
            await engine.stop_task(task.task_id, reason="enough")
            receipt, _ = await _stopped(engine, session.session_id, task.task_id)
    assert (receipt.worker, receipt.acknowledged, receipt.forced) == (WorkerAnswer.CONFIRMED, True, False)
    assert receipt.processes == () and receipt.processes_gone is None and receipt.tool_calls == ()


async def wait_for_event(engine: Engine, session_id: str, event_type: EventType) -> None:
    async with engine.store.subscribe(session_id) as events:
        async for event in events:
            if event.type == event_type:
                return


@pytest.mark.parametrize("interactive", [True, False], ids=["awaiting_approval", "running"])
async def test_the_calls_in_flight_are_ended_and_the_receipt_says_how(make_engine: MakeEngine, tmp_path: Path,
                                                                      interactive: bool) -> None:
    """A call waiting for its approval is never run (its approval closed); a command the supervisor runs is cut
    short, its process gone."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    pid_file = workspace / "pid"
    marker = f"codesdk-stop-receipt-{tmp_path.name}"  # the sandbox has its own pids: found by its argv
    sleeper = "import sys, time; open('pid', 'w').write('started'); time.sleep(3600)"
    call = {"id": "c1", "name": "workspace.exec", "input": {"argv": ["python3", "-c", sleeper, marker]}}

    def running() -> list[psutil.Process]:
        found = []
        for process in psutil.process_iter(["cmdline"]):
            if (process.info["cmdline"] or [])[-1:] == [marker]:
                found.append(process)
        return [p for p in found if _alive(p.pid)]

    config = {"scenario_inline": {"name": "exec", "steps": [{"tool_calls": [call]}, {"text": "done"}]}}
    asked = trio.Event()

    async def never_decides(request: ApprovalRequest) -> ApproverAnswer:
        asked.set()
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    with trio.fail_after(60):
        async with make_engine(exec_allowlist=("python3",)) as engine:
            session = await engine.create_session(workspace=workspace)
            if interactive:
                task = await engine.start_task(session.session_id, "run it", runtime_config=config,
                                               interaction_mode=InteractionMode.INTERACTIVE, approver=never_decides)
                await asked.wait()
            else:
                task = await engine.start_task(session.session_id, "run it", runtime_config=config,
                                               permission_mode=PermissionMode.YOLO)
                await until("the command to run", lambda: pid_file.exists() and running())
            await engine.stop_task(task.task_id, reason="enough")
            receipt, events = await _stopped(engine, session.session_id, task.task_id)
    (in_flight,) = receipt.tool_calls
    assert (in_flight.tool_call_id, in_flight.tool_name) == ("c1", "workspace.exec")
    if interactive:
        assert (in_flight.stage, in_flight.ended) == (CallStage.AWAITING_APPROVAL, CallEnding.NEVER_RUN)
        assert not pid_file.exists()
    else:
        assert (in_flight.stage, in_flight.ended) == (CallStage.RUNNING, CallEnding.CANCELLED)
        assert running() == []
    ends = [e.payload for e in events if e.type == EventType.TOOL_CALL_COMPLETED]
    if interactive:  # never started: nothing to complete
        assert ends == []
    else:  # started, then cut short: its end is stored with the task's (issue 33, item 2)
        assert [(getattr(e, "is_error", None), getattr(e, "cut_short", None)) for e in ends] == [
            (True, CallCutShort.CANCELLED)]
    assert "calls in flight: workspace.exec " + in_flight.ended.value in describe_receipt(receipt)
