"""Isolation levels with real workers: the HOME each session's worker really has (read from its process), whose
worker it is, and what is left of an ephemeral HOME once its session is gone."""

from __future__ import annotations

import os
from pathlib import Path

import psutil
import pytest
import trio

from codesdk.protocol import EventType, IsolationLevel
from codesdk.supervisor.engine import Engine, IsolationRefused
from codesdk.supervisor.ids import new_id
from codesdk.supervisor.namespaces import UidRange
from codesdk.supervisor.engine._lifecycle import check_isolation, placement_of
from codesdk.supervisor.store import SessionRecord

from tests.conftest import MakeEngine
from tests.e2e.conftest import run_task, the_model_input, worker_of

NS = "ci:job-7"


async def _hanging(engine: Engine, session: SessionRecord) -> tuple[str, dict[str, str], int]:
    """Start a task that hangs in the session; (its task id, its worker's environment, its worker's pid)."""
    task = await engine.start_task(session.session_id, "x", runtime_config={"scenario": "hang"})
    async with engine.store.subscribe(session.session_id) as events:  # its own output (a fork has copies of others')
        async for event in events:
            if event.type == EventType.MODEL_OUTPUT_COMPLETED and event.trace.task_id == task.task_id:
                break
    worker = engine.pool.worker_of(session.namespace, placement_of(session))
    assert worker is not None
    environ = psutil.Process(worker.pid).environ()
    told = worker.spec.runtime_env  # the safe view its initialize carried
    assert told is not None and (told.isolation, told.home) == (session.isolation, environ["HOME"])
    return task.task_id, environ, worker.pid


async def test_ephemeral_sessions_each_get_a_home_and_a_worker_of_their_own(make_engine: MakeEngine,
                                                                            tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with trio.fail_after(90):
        async with make_engine() as engine:
            await trio.to_thread.run_sync(lambda: engine.pool.namespace_env.update(NS, {"CI_TOKEN": "stored"}))
            plain = await engine.create_session(namespace=NS)
            _, plain_env, plain_pid = await _hanging(engine, plain)
            login_cache = Path(plain_env["HOME"]) / ".runtime-login"
            login_cache.write_text("the namespace's login")
            homes, pids, tasks = [], [], []
            for _ in range(2):
                session = await engine.create_session(namespace=NS, isolation=IsolationLevel.EPHEMERAL)
                assert session.isolation == IsolationLevel.EPHEMERAL
                task_id, env, pid = await _hanging(engine, session)
                home = Path(env["HOME"])
                assert home == data_dir / "ephemeral" / session.session_id / "home" and home.is_dir()
                assert all(env[name].startswith(str(home.parent)) for name in ("TMPDIR", "XDG_CONFIG_HOME"))
                assert env["CI_TOKEN"] == "stored"  # credentials from the namespace's stored variables ...
                assert os.listdir(home) == []  # ... and nothing of its login cache
                homes.append((session, home))
                pids.append(pid)
                tasks.append(task_id)
            assert len({plain_pid, *pids}) == 3  # never one another's worker, nor the namespace's
            for task_id in [*tasks]:
                await engine.stop_task(task_id)
            for session, home in homes:
                events = [e for e in await engine.store.read(session.session_id, limit=100)]
                assert the_model_input(events).isolation == IsolationLevel.EPHEMERAL
                await engine.delete_session(session.session_id, by="test")
                assert not home.parent.exists()
            assert all(not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
                       for pid in pids)
            assert worker_of(engine, NS).pid == plain_pid and login_cache.exists()  # the namespace's untouched


async def test_a_fork_of_an_ephemeral_session_gets_a_new_empty_home(make_engine: MakeEngine, tmp_path: Path) -> None:
    with trio.fail_after(90):
        async with make_engine() as engine:
            parent, _, _ = await run_task(engine, namespace=NS, runtime_config={"scenario": "echo"},
                                          session_id=(await engine.create_session(
                                              namespace=NS, isolation=IsolationLevel.EPHEMERAL)).session_id)
            parent_home = tmp_path / "data" / "ephemeral" / parent / "home"
            (parent_home / ".credentials").write_text("the parent's runtime logged in")
            fork = await engine.fork_session(parent, by="test")
            assert fork.isolation == IsolationLevel.EPHEMERAL
            _, env, _ = await _hanging(engine, fork)
            assert Path(env["HOME"]) == tmp_path / "data" / "ephemeral" / fork.session_id / "home"
            assert os.listdir(env["HOME"]) == []
            await engine.stop_task((await engine.store.list_tasks(fork.session_id))[-1].task_id)
            await engine.delete_session(fork.session_id, by="test")
            assert (parent_home / ".credentials").exists() and not Path(env["HOME"]).exists()


async def test_ephemeral_homes_of_sessions_gone_are_swept_at_start(make_engine: MakeEngine, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with trio.fail_after(90):
        async with make_engine() as engine:
            kept, _, _ = await run_task(engine, session_id=(await engine.create_session(
                isolation=IsolationLevel.EPHEMERAL)).session_id, runtime_config={"scenario": "echo"})
        stale = data_dir / "ephemeral" / new_id("ses")
        (stale / "home").mkdir(parents=True)
        (stale / "home" / "left").write_text("by a session deleted while the supervisor was down")
        stranger = data_dir / "ephemeral" / "not-a-session"
        stranger.mkdir()
        async with make_engine():
            assert not stale.exists()
            assert (data_dir / "ephemeral" / kept / "home").is_dir() and stranger.is_dir()


async def test_shared_runs_in_the_operators_home_in_a_worker_of_its_own(make_engine: MakeEngine, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    operator = tmp_path / "operator"
    operator.mkdir()
    monkeypatch.setenv("HOME", str(operator))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    with trio.fail_after(90):
        async with make_engine() as engine:
            plain = await engine.create_session()
            _, plain_env, plain_pid = await _hanging(engine, plain)
            shared = await engine.create_session(isolation=IsolationLevel.SHARED)
            task_id, env, pid = await _hanging(engine, shared)
            assert env["HOME"] == str(operator) and env["XDG_CONFIG_HOME"] == str(operator / ".config")
            assert plain_env["HOME"] != str(operator) and pid != plain_pid
            await engine.stop_task(task_id)
            events = await engine.store.read(shared.session_id, limit=100)
            assert the_model_input(events).isolation == IsolationLevel.SHARED
            await engine.pool.session_ended(placement_of(shared))  # not the session's own: left running
            await engine.delete_session(shared.session_id, by="test")
            again = await engine.create_session(isolation=IsolationLevel.SHARED)
            assert (await _hanging(engine, again))[2] == pid and operator.is_dir()  # one shared worker
            with pytest.raises(IsolationRefused, match="only for namespace 'default'"):
                await engine.create_session(namespace="user:alice", isolation=IsolationLevel.SHARED)


def test_shared_is_refused_where_workers_run_as_tenants_uids() -> None:
    with pytest.raises(IsolationRefused, match="worker-uids"):
        check_isolation(IsolationLevel.SHARED, "default", UidRange(200000, 100))
    check_isolation(IsolationLevel.EPHEMERAL, "user:alice", UidRange(200000, 100))
    check_isolation(IsolationLevel.SHARED, "default", None)
