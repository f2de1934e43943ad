"""Worker pool behaviour end to end: crashes, isolation, restarts, idle shutdown."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import psutil
import pytest
import trio

from codesdk.testing.invariants import check_session
from codesdk.protocol import EventType, TaskFailed, TaskFailedEvent, TaskStoppedEvent
from codesdk.supervisor.engine import session_events
from codesdk.supervisor.store import TaskState
from codesdk.supervisor.workers.launch import WorkerPolicy

from tests.conftest import MakeEngine
from tests.e2e.conftest import of_type, run_task, wait_for_event, worker_of


async def test_worker_killed_mid_task_fails_it_once_and_the_next_task_works(make_engine: MakeEngine) -> None:
    with trio.fail_after(60):
        async with make_engine() as engine:
            session = await engine.create_session()
            task = await engine.start_task(session.session_id, "x", runtime_config={"scenario": "hang"})
            await wait_for_event(EventType.MODEL_OUTPUT_COMPLETED, engine, session.session_id)
            worker = engine.pool.worker_of("default")
            assert worker is not None
            old_pid = worker.pid
            os.kill(old_pid, signal.SIGKILL)
            record = await engine.wait_task(task.task_id)
            assert record.state == TaskState.FAILED
            events = await session_events(engine.store, session.session_id)
            check_session(events)
            failed = [e for e in events if e.type == EventType.TASK_FAILED]
            assert len(failed) == 1 and events[-1].type == EventType.TASK_FAILED
            payload = failed[0].payload
            assert isinstance(payload, TaskFailed)
            assert (payload.code, payload.retryable) == ("WORKER_CRASHED", True)
            assert payload.details["signal"] == "SIGKILL" and payload.details["worker_pid"] == old_pid
            # The next task in that namespace gets a fresh worker.
            _, record2, _ = await run_task(engine, session_id=session.session_id, runtime_config={"scenario": "echo"})
            assert record2.state == TaskState.COMPLETED and record2.worker_pid not in (None, old_pid)


async def test_crash_with_exit_code_keeps_the_stderr_tail(make_engine: MakeEngine) -> None:
    with trio.fail_after(60):
        async with make_engine() as engine:
            _, _, events = await run_task(engine, runtime_config={"scenario": "crash-exit"})
            failed = of_type(events, EventType.TASK_FAILED)[0]
            assert failed.code == "WORKER_CRASHED" and failed.details["exit_code"] == 3
            tail = (await engine.store.get_blob(failed.details["stderr_tail_ref"])).decode()
            assert "crashing on purpose" in tail
            # Everything the runtime emitted before dying was stored before the failure.
            assert [p.text for p in of_type(events, EventType.MODEL_OUTPUT_COMPLETED)] == ["About to crash."]


async def test_namespaces_get_their_own_home_and_no_supervisor_env(make_engine: MakeEngine,
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    monkeypatch.setenv("CODESDK_TEST_CANARY", "leaked-secret")
    with trio.fail_after(60):
        async with make_engine(worker_env={"user:alice": {"ALICE_ONLY": "1"}}) as engine:
            homes = {}
            for namespace in ("user:alice", "ci:job-7"):
                session = await engine.create_session(namespace=namespace)
                task = await engine.start_task(session.session_id, "x", runtime_config={"scenario": "hang"})
                await wait_for_event(EventType.MODEL_OUTPUT_COMPLETED, engine, session.session_id)
                worker = worker_of(engine, namespace)
                env = psutil.Process(worker.pid).environ()
                homes[namespace] = env["HOME"]
                assert "CODESDK_TEST_CANARY" not in env
                assert set(env) <= {"HOME", "XDG_CONFIG_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME",
                                    "TMPDIR", "PATH", "LANG", "LC_ALL", "CODESDK_SCENARIO_DIR", "ALICE_ONLY",
                                    "CODESDK_SCRIPTED_TEST_STEPS"}
                assert ("ALICE_ONLY" in env) == (namespace == "user:alice")
                assert env["TMPDIR"].startswith(str(Path(env["HOME"]).parent))
                assert (Path(env["HOME"]).parent.stat().st_mode & 0o777) == 0o700
                await engine.stop_task(task.task_id)
            assert homes["user:alice"] != homes["ci:job-7"]
            assert homes["user:alice"].endswith("namespaces/user.alice/home")
            pids = {worker_of(engine, ns).pid for ns in homes}
            assert len(pids) == 2


async def test_too_many_crashes_quarantine_the_namespace(make_engine: MakeEngine) -> None:
    with trio.fail_after(60):
        async with make_engine(worker_policy=WorkerPolicy(max_restarts=2, restart_window_s=300)) as engine:
            for _ in range(2):
                _, record, _ = await run_task(engine, runtime_config={"scenario": "crash-exit"})
                assert record.error is not None and record.error["code"] == "WORKER_CRASHED"
            _, record, events = await run_task(engine, runtime_config={"scenario": "echo"})
            assert record.state == TaskState.FAILED
            failed = of_type(events, EventType.TASK_FAILED)[0]
            assert failed.code == "WORKER_UNAVAILABLE" and "is quarantined" in failed.message
            status = {s["namespace"]: s for s in engine.pool.status()}["default"]
            assert status["state"] == "failing" and status["recent_crashes"] == 2
            # Other namespaces are unaffected.
            _, other, _ = await run_task(engine, namespace="user:bob", runtime_config={"scenario": "echo"})
            assert other.state == TaskState.COMPLETED


async def test_idle_worker_is_shut_down_and_replaced_on_demand(make_engine: MakeEngine) -> None:
    with trio.fail_after(60):
        async with make_engine(worker_policy=WorkerPolicy(idle_timeout_s=0.2)) as engine:
            _, first, _ = await run_task(engine, runtime_config={"scenario": "echo"})
            worker = worker_of(engine)
            status = await worker.wait_exit()
            assert status.exit_code == 0
            _, second, _ = await run_task(engine, runtime_config={"scenario": "echo"})
            assert second.state == TaskState.COMPLETED and second.worker_pid != first.worker_pid
            assert {s["namespace"]: s for s in engine.pool.status()}["default"]["recent_crashes"] == 0


@pytest.mark.parametrize("scenario", ["malformed-line", "oversized-line"])
async def test_bad_lines_from_a_worker_are_recorded_not_stored(make_engine: MakeEngine,
                                                               scenario: str) -> None:
    with trio.fail_after(60):
        async with make_engine() as engine:
            _, record, events = await run_task(engine, runtime_config={"scenario": scenario})
            worker = worker_of(engine)
            assert worker.connection.stats.violations == 1
    assert record.state == TaskState.COMPLETED
    assert [p.text for p in of_type(events, EventType.MODEL_OUTPUT_COMPLETED)] == ["before", "after"]


async def test_closing_the_supervisor_stops_tasks_and_reaps_workers(make_engine: MakeEngine) -> None:
    with trio.fail_after(60):
        async with make_engine() as engine:
            session = await engine.create_session()
            task = await engine.start_task(session.session_id, "x", runtime_config={"scenario": "hang"})
            await wait_for_event(EventType.MODEL_OUTPUT_COMPLETED, engine, session.session_id)
            pid = worker_of(engine).pid
        async with make_engine() as engine:
            record = await engine.store.get_task(task.task_id)
            events = await session_events(engine.store, session.session_id)
    assert record.state == TaskState.STOPPED
    last = events[-1]
    assert isinstance(last, TaskStoppedEvent) and last.payload.reason == "supervisor shutting down"
    assert not psutil.pid_exists(pid)


async def test_cancelling_the_supervisor_from_outside_reaps_its_workers(make_engine: MakeEngine) -> None:
    pids: list[int] = []
    with trio.move_on_after(30) as guard:  # a hang in teardown would trip this, not the assertion below
        with trio.move_on_after(2) as cancelled:
            async with make_engine() as engine:
                session = await engine.create_session()
                await engine.start_task(session.session_id, "x", runtime_config={"scenario": "hang"})
                await wait_for_event(EventType.MODEL_OUTPUT_COMPLETED, engine, session.session_id)
                pids.append(worker_of(engine).pid)
                await trio.sleep_forever()
    assert cancelled.cancelled_caught and not guard.cancelled_caught
    assert pids and not psutil.pid_exists(pids[0])


async def test_a_task_left_running_by_a_dead_supervisor_is_failed_on_restart(make_engine: MakeEngine) -> None:
    with trio.fail_after(60):
        with trio.move_on_after(2):  # the supervisor is torn down from outside: its store goes first
            async with make_engine() as engine:
                session = await engine.create_session()
                task = await engine.start_task(session.session_id, "x", runtime_config={"scenario": "hang"})
                await wait_for_event(EventType.MODEL_OUTPUT_COMPLETED, engine, session.session_id)
                await trio.sleep_forever()
        async with make_engine() as engine:
            record = await engine.store.get_task(task.task_id)
            events = await session_events(engine.store, session.session_id)
            check_session(events)
            last = events[-1]
            assert record.state == TaskState.FAILED
            assert isinstance(last, TaskFailedEvent) and last.payload.code == "SUPERVISOR_RESTARTED"
            _, next_task, _ = await run_task(engine, session_id=session.session_id,
                                             runtime_config={"scenario": "echo"})
            assert next_task.state == TaskState.COMPLETED
