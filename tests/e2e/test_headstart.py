"""A worker started ahead of the supervisor (``codesdk run``'s head start) is adopted only when it was launched
exactly as the pool would launch it, and it never outlives anything: not adopted, it is killed and reaped."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest
import trio

from codesdk.protocol import EventType, PermissionMode
from codesdk.supervisor.cli.front import PERMISSION_MODES
from codesdk.supervisor.ids import is_id, new_id
from codesdk.supervisor.namespaces import (
    RUNTIME_AHEAD_ENV,
    Namespace,
    NamespaceEnv,
    NamespaceEnvError,
    build_env,
    prepare_namespace,
)
from codesdk.supervisor.store import DataDirLock, TaskState
from codesdk.supervisor.workers.launch import Headstart, Placement, PoolConfig, PreparedLaunch, prepare_launch
from codesdk.supervisor.workers import pool as pool_module

from tests.conftest import MakeEngine
from tests.waits import wait_for
from tests.worker.harness import REPO
from tests.e2e.conftest import of_type, run_task, worker_of


def _headstart(config: PoolConfig, namespace: str = "default") -> Headstart:
    headstart = Headstart.start(config, namespace)
    assert headstart is not None and headstart.pid is not None
    return headstart


def _gone(pid: int) -> bool:
    """Not running and reaped (a zombie still has its pid)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_DEAD
    except psutil.NoSuchProcess:
        return True


async def test_a_worker_launched_as_the_pool_would_is_adopted_and_serves_the_task(make_engine: MakeEngine) -> None:
    with trio.fail_after(60):
        async with make_engine() as engine:
            headstart = _headstart(engine.pool.config)
            pid = headstart.pid
            engine.pool.offer(headstart)
            _, record, events = await run_task(engine, runtime_config={"scenario": "echo"})
            assert record.state == TaskState.COMPLETED and record.worker_pid == pid
            assert [p.text for p in of_type(events, EventType.MODEL_OUTPUT_COMPLETED)] == ["You said: hello"]
            assert headstart.pid is None  # handed over: nothing left to discard
        assert pid is not None and _gone(pid)


async def test_a_worker_launched_differently_is_killed_and_the_pool_starts_its_own(make_engine: MakeEngine) -> None:
    with trio.fail_after(60):
        async with make_engine() as engine:
            other = dataclasses.replace(engine.pool.config, env={"*": {"NOT_THE_POOLS": "1"}})
            headstart = _headstart(other)
            pid = headstart.pid
            engine.pool.offer(headstart)
            _, record, _ = await run_task(engine, runtime_config={"scenario": "echo"})
            assert record.state == TaskState.COMPLETED and record.worker_pid not in (None, pid)
            assert pid is not None and _gone(pid)
            assert "NOT_THE_POOLS" not in psutil.Process(worker_of(engine).pid).environ()


async def test_a_worker_that_died_before_adoption_is_replaced(make_engine: MakeEngine) -> None:
    with trio.fail_after(60):
        async with make_engine() as engine:
            headstart = _headstart(engine.pool.config)
            pid = headstart.pid
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            wait_for("the worker died", lambda: psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
            engine.pool.offer(headstart)
            _, record, _ = await run_task(engine, runtime_config={"scenario": "echo"})
            assert record.state == TaskState.COMPLETED and record.worker_pid != pid
            assert _gone(pid)


async def test_an_unclaimed_worker_is_discarded_when_the_pool_closes(make_engine: MakeEngine) -> None:
    with trio.fail_after(60):
        async with make_engine() as engine:
            headstart = _headstart(engine.pool.config, "user:never-used")
            pid = headstart.pid
            engine.pool.offer(headstart)
            assert pid is not None and not _gone(pid)
        assert _gone(pid)


async def test_a_start_under_way_when_the_pool_closes_spawns_nothing_and_is_no_failure(
        make_engine: MakeEngine, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """``codesdk run`` refused its session while the prewarm prepared the worker's launch: the pool's close
    discarded the headstart the prewarm was about to adopt. The start must end there, not spawn a worker of its own
    that the close no longer shuts down (it was killed mid-handshake and logged as a failed start)."""
    preparing, discarded = threading.Event(), threading.Event()
    real_prepare = prepare_launch

    def prepare_once_discarded(config: PoolConfig, namespace: Namespace,
                               placement: Placement | None = None) -> PreparedLaunch:
        preparing.set()
        assert discarded.wait(timeout=60)
        return real_prepare(config, namespace, placement)

    with trio.fail_after(60), caplog.at_level(logging.INFO, logger="codesdk.supervisor"):
        async with make_engine() as engine:
            headstart = _headstart(engine.pool.config)
            real_discard = headstart.discard

            def discard() -> None:
                real_discard()
                discarded.set()

            monkeypatch.setattr(headstart, "discard", discard)
            engine.pool.offer(headstart)
            monkeypatch.setattr(pool_module, "prepare_launch", prepare_once_discarded)
            engine.prewarm("default")
            assert await trio.to_thread.run_sync(preparing.wait, 60)
            await engine.pool.aclose()
            while (status := engine.pool.status()[0])["state"] == "starting":
                await trio.sleep(0.01)  # the prewarm's start, if aclose did not wait for it
            assert status["pid"] is None, "a worker runs after the pool closed"
    assert status["workers_started"] == 0 and status["recent_crashes"] == 0 and status["last_error"] is None
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


async def test_an_adopted_worker_is_killed_and_reaped_when_its_supervisor_is_cancelled(
        make_engine: MakeEngine) -> None:
    with trio.fail_after(60):
        with trio.CancelScope() as scope:
            async with make_engine() as engine:
                headstart = _headstart(engine.pool.config)
                pid = headstart.pid
                engine.pool.offer(headstart)
                session = await engine.create_session()
                await engine.start_task(session.session_id, "x", runtime_config={"scenario": "hang"})
                async with engine.store.subscribe(session.session_id) as events:
                    async for event in events:  # the hang scenario says something, then hangs
                        if event.type == EventType.MODEL_OUTPUT_COMPLETED:
                            break
                assert worker_of(engine).pid == pid
                scope.cancel()
                await trio.sleep_forever()
        assert pid is not None and _gone(pid)


# -- the command ---------------------------------------------------------------------------------


def _codesdk(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CODESDK_")}
    return subprocess.run([sys.executable, "-m", "codesdk.supervisor.cli.front", "--data-dir", str(tmp_path / "data"),
                           *args], capture_output=True, text=True, timeout=120, env=env, stdin=subprocess.DEVNULL,
                          cwd=REPO, check=False)


def _workers_under(data_dir: Path) -> list[int]:
    """Processes whose working directory is a namespace's home in ``data_dir`` (where workers run)."""
    homes = str(data_dir / "namespaces")
    found = []
    for process in psutil.process_iter(["cwd"]):
        cwd = process.info.get("cwd")
        if cwd and cwd.startswith(homes):
            found.append(process.pid)
    return found


def test_codesdk_run_adopts_the_worker_it_started_ahead(tmp_path: Path) -> None:
    done = _codesdk(tmp_path, "-v", "run", "hello", "--env", "SOME_KEY=1", "--namespace", "user:alice")
    assert done.returncode == 0, done.stderr
    assert "namespace user:alice: worker pid" in done.stderr and "(started ahead)" in done.stderr
    assert "not adopting" not in done.stderr
    assert not _workers_under(tmp_path / "data")


def test_codesdk_run_makes_the_session_in_the_workspace_it_chose_ahead(tmp_path: Path) -> None:
    done = _codesdk(tmp_path, "run", "hello", "--json")
    assert done.returncode == 0, done.stderr
    created = json.loads(done.stdout.splitlines()[0])
    assert created["type"] == "session.created"
    session_id = created["trace"]["session_id"]
    workspaces = tmp_path / "data" / "workspaces"
    assert [p.name for p in workspaces.iterdir()] == [session_id]
    assert created["payload"]["workspace"] == str((workspaces / session_id).resolve())


def test_codesdk_run_on_a_busy_data_dir_leaves_no_worker_and_no_workspace_behind(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    lock = DataDirLock.acquire(data, "a test holding the data dir")
    try:
        done = _codesdk(tmp_path, "run", "hello", "--json")
    finally:
        lock.release()
    assert done.returncode == 2 and "is in use by a test holding the data dir" in done.stderr, done.stderr
    assert not _workers_under(data)
    assert not any((data / "workspaces").iterdir())  # the one made ahead went with the command


def test_a_session_id_chosen_ahead_must_be_one() -> None:
    assert is_id(new_id("ses"), "ses")
    for bad in ("ses_", "ses_../../etc", "task_" + "0" * 32, "ses_" + "G" * 32, "ses_" + "0" * 33):
        assert not is_id(bad, "ses"), bad


async def test_the_engine_refuses_a_session_id_that_is_not_one(make_engine: MakeEngine) -> None:
    async with make_engine() as engine:
        with pytest.raises(ValueError, match="not a session id"):
            await engine.create_session(session_id="ses_../../elsewhere")
        chosen = new_id("ses")
        session = await engine.create_session(session_id=chosen)
        assert session.session_id == chosen and Path(session.workspace or "").name == chosen


def test_nobody_but_the_command_asks_a_worker_for_a_runtime_ahead(tmp_path: Path) -> None:
    """A tenant's stored variables and an operator's could otherwise make a worker start programs."""
    with pytest.raises(NamespaceEnvError, match=RUNTIME_AHEAD_ENV):
        NamespaceEnv(tmp_path).update("default", {RUNTIME_AHEAD_ENV: "{}"})
    dirs = prepare_namespace(tmp_path, Namespace.parse("default"), None)[0]
    assert RUNTIME_AHEAD_ENV not in build_env(dirs, {RUNTIME_AHEAD_ENV: '{"runtime": "claude"}', "KEEP": "1"})


def test_the_command_front_imports_nothing_heavy() -> None:
    """What runs before the worker is started stays the standard library: that is the head start."""
    probe = ("import sys, json, codesdk.supervisor.cli.front; print(json.dumps(sorted(m for m in sys.modules "
             "if m.split('.')[0] in {'trio', 'pydantic', 'pydantic_core', 'apsw', 'psutil', 'httpx2'} "
             "or m.startswith(('codesdk.protocol', 'codesdk.worker.client', 'codesdk.worker.adapters', 'codesdk.client')))))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, cwd=REPO,
                          check=True)
    assert json.loads(done.stdout) == []


def test_what_the_worker_runs_before_starting_a_runtime_ahead_imports_nothing_heavy() -> None:
    """The worker starts a runtime ahead before it imports trio or the protocol's models: the runtime's own start
    overlaps those imports."""
    probe = ("import sys, json, codesdk.worker.main, codesdk.worker._ahead, codesdk.worker.adapters.claude.launch; "
             "print(json.dumps(sorted(m for m in sys.modules "
             "if m.split('.')[0] in {'trio', 'pydantic', 'pydantic_core', 'psutil', 'httpx2'} "
             "or m.startswith(('codesdk.protocol', 'codesdk.supervisor', 'codesdk.client')))))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, cwd=REPO,
                          check=True)
    assert json.loads(done.stdout) == []


def test_the_commands_permission_modes_are_the_protocols() -> None:
    assert list(PERMISSION_MODES) == [mode.value for mode in PermissionMode]
