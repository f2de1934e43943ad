"""A frozen worker is treated as crashed: killed with its tree, its tasks failed once, counted toward quarantine,
and its namespace served by a new worker (docs/reliability.md, "Frozen worker").

The worker is a real process, frozen with SIGSTOP (ended by its pid) mid-task in the scripted ``hang`` scenario.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import psutil
import trio

from codesdk.protocol import (
    CallCutShort,
    EventType,
    PermissionMode,
    Rpc,
    TaskStopped,
    ToolCallCompleted,
    WorkerAnswer,
)
from codesdk.supervisor.engine import Engine, session_events
from codesdk.supervisor.store import EventDraft, TaskState
from codesdk.supervisor.workers.launch import WorkerPolicy
from codesdk.testing.invariants import check_session
from codesdk.worker.client import WorkerProcess
from tests.conftest import MakeEngine
from tests.waits import until


async def _frozen_mid_task(engine: Engine) -> tuple[str, str, WorkerProcess]:
    """(session, task, worker): a task running in the ``hang`` scenario, its worker then SIGSTOPped."""
    session = await engine.create_session()
    task = await engine.start_task(session.session_id, "x", runtime_config={"scenario": "hang"})
    while (await engine.store.get_task(task.task_id)).state != TaskState.RUNNING:
        await trio.sleep(0.02)
    worker = engine.pool.worker_of("default")
    assert worker is not None
    os.kill(worker.pid, signal.SIGSTOP)
    return session.session_id, task.task_id, worker


def _status(engine: Engine) -> dict[str, object]:
    (slot,) = [s for s in engine.pool.status() if s["namespace"] == "default"]
    return slot


async def test_a_worker_that_does_not_answer_a_stop_is_killed_and_replaced(make_engine: MakeEngine,
                                                                           tmp_path: Path) -> None:
    with trio.fail_after(90):
        async with make_engine() as engine:
            sid, task_id, frozen = await _frozen_mid_task(engine)
            pid = frozen.pid
            try:
                record = await engine.stop_task(task_id)
                assert record.state == TaskState.STOPPED
                stopped = [e.payload for e in await session_events(engine.store, sid)
                           if e.type == EventType.TASK_STOPPED]
                assert isinstance(stopped[0], TaskStopped) and stopped[0].receipt is not None
                assert stopped[0].receipt.worker == WorkerAnswer.NO_ANSWER
                assert "killed" in stopped[0].receipt.worker_detail, stopped[0].receipt.worker_detail
                # The frozen worker is gone (SIGKILLed: it cannot act on SIGTERM) and counted as a crash.
                with trio.fail_after(30):
                    while engine.pool.worker_of("default") is not None and \
                            engine.pool.worker_of("default").pid == pid:  # type: ignore[union-attr]
                        await trio.sleep(0.05)
                assert _status(engine)["recent_crashes"] == 1
                # The session's next task runs on a new worker, at once.
                nxt = await engine.start_task(sid, "again", runtime_config={"scenario": "echo"})
                assert (await engine.wait_task(nxt.task_id)).state == TaskState.COMPLETED
                assert engine.pool.worker_of("default") is not None
                assert engine.pool.worker_of("default").pid != pid  # type: ignore[union-attr]
                check_session(await session_events(engine.store, sid))
            finally:
                if not frozen.exited.is_set():  # not reaped yet: the pid is still the frozen worker's
                    os.kill(pid, signal.SIGKILL)


async def test_a_worker_frozen_mid_task_without_a_stop_is_found_by_its_liveness_ping(make_engine: MakeEngine,
                                                                                   tmp_path: Path) -> None:
    policy = WorkerPolicy(liveness_interval_s=0.2, liveness_timeout_s=1.0)
    with trio.fail_after(90):
        async with make_engine(worker_policy=policy) as engine:
            sid, task_id, frozen = await _frozen_mid_task(engine)
            try:
                record = await engine.wait_task(task_id)  # no stop: the ping finds the worker frozen
                assert record.state == TaskState.FAILED and record.error is not None
                assert record.error["code"] == "WORKER_CRASHED" and record.error["retryable"] is True
                assert frozen.exit_status is not None and frozen.exit_status.signal == signal.SIGKILL
                assert _status(engine)["recent_crashes"] == 1
                assert "liveness ping" in str(_status(engine)["last_error"])
                nxt = await engine.start_task(sid, "again", runtime_config={"scenario": "echo"})
                assert (await engine.wait_task(nxt.task_id)).state == TaskState.COMPLETED
                assert engine.pool.worker_of("default").pid != frozen.pid  # type: ignore[union-attr]
                check_session(await session_events(engine.store, sid))
            finally:
                if not frozen.exited.is_set():
                    os.kill(frozen.pid, signal.SIGKILL)


async def test_a_worker_frozen_during_an_exec_is_killed_and_the_exec_ended_with_it(make_engine: MakeEngine,
                                                                                  tmp_path: Path) -> None:
    """The supervisor runs the task's command; the worker freezes meanwhile. The ping finds it: the task fails
    WORKER_CRASHED, the command is cut short (its end stored: ``cut_short: worker_gone``) and its process ended."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    marker = f"codesdk-frozen-exec-{tmp_path.name}"
    sleeper = "import time; open('started', 'w').write('yes'); time.sleep(3600)"
    call = {"id": "c1", "name": "workspace.exec", "input": {"argv": ["python3", "-c", sleeper, marker]}}
    config = {"scenario_inline": {"name": "exec", "steps": [{"tool_calls": [call]}, {"text": "done"}]}}

    def running() -> list[int]:
        """The command's live processes (the sandbox has its own pids: found by its argv)."""
        found = []
        for process in psutil.process_iter(["cmdline", "status"]):
            if (process.info["cmdline"] or [])[-1:] == [marker] and process.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(process.pid)
        return found

    policy = WorkerPolicy(liveness_interval_s=0.2, liveness_timeout_s=1.0)
    with trio.fail_after(90):
        async with make_engine(exec_allowlist=("python3",), worker_policy=policy) as engine:
            session = await engine.create_session(workspace=workspace)
            task = await engine.start_task(session.session_id, "run it", runtime_config=config,
                                           permission_mode=PermissionMode.YOLO)
            await until("the command to run", lambda: (workspace / "started").exists() and running())
            frozen = engine.pool.worker_of("default")
            assert frozen is not None
            os.kill(frozen.pid, signal.SIGSTOP)
            try:
                record = await engine.wait_task(task.task_id)
                assert record.error is not None and record.error["code"] == "WORKER_CRASHED"
                await until("the command to end", lambda: not running())
                events = await session_events(engine.store, session.session_id)
            finally:
                if not frozen.exited.is_set():
                    os.kill(frozen.pid, signal.SIGKILL)
    check_session(events)
    ends = [e.payload for e in events if isinstance(e.payload, ToolCallCompleted)]
    assert [(e.tool_call_id, e.is_error, e.cut_short) for e in ends] == [("c1", True, CallCutShort.WORKER_GONE)]


async def test_a_live_worker_is_not_killed_while_the_store_is_slow(make_engine: MakeEngine) -> None:
    """While the supervisor is busy handing a worker's events to a stalled store (a PostgreSQL failover), the
    worker's answers wait unread behind them: its silence is the supervisor's, and the worker lives on."""
    policy = WorkerPolicy(liveness_interval_s=0.05, liveness_timeout_s=0.1)
    with trio.fail_after(90):
        async with make_engine(worker_policy=policy) as engine:
            session = await engine.create_session()
            warm = await engine.start_task(session.session_id, "warm", runtime_config={"scenario": "echo"})
            assert (await engine.wait_task(warm.task_id)).state == TaskState.COMPLETED
            worker = engine.pool.worker_of("default")
            assert worker is not None
            pings = 0
            request = worker.connection.request

            async def counted(method: object, params: object) -> object:
                nonlocal pings
                if method == Rpc.PING:
                    pings += 1
                return await request(method, params)  # type: ignore[call-overload]

            worker.connection.request = counted  # type: ignore[method-assign,assignment]
            release = trio.Event()
            append = engine.store.append_events
            stalled = 0

            async def stalling(session_id: str, drafts: list[EventDraft], **kwargs: object) -> object:
                """The worker's own events (the model's output) wait for ``release``; the engine's do not."""
                nonlocal stalled
                if any(d.type == EventType.MODEL_OUTPUT_DELTA for d in drafts):
                    stalled += 1
                    await release.wait()
                return await append(session_id, drafts, **kwargs)  # type: ignore[arg-type]

            engine.store.append_events = stalling  # type: ignore[method-assign,assignment]
            try:
                task = await engine.start_task(session.session_id, "go", runtime_config={"scenario": "flood"})
                await until("the store to stall on the task's events", lambda: stalled > 0)
                seen = pings
                await until("five pings to go unanswered meanwhile", lambda: pings >= seen + 5)
            finally:  # the stalled append is shielded: it must be let go, or the engine never closes
                release.set()
            assert (await engine.wait_task(task.task_id)).state == TaskState.COMPLETED
            assert engine.pool.worker_of("default") is worker and not worker.exited.is_set()
            assert _status(engine)["recent_crashes"] == 0
