"""On PostgreSQL, through a real engine: a namespace variable reaches its worker's environment and nothing else (not
the store's tables, a support bundle, the supervisor's log or the data dir); a quarantine follows its namespace."""

from __future__ import annotations

import logging
import os
import tarfile
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import psycopg
import pytest
import trio

from codesdk.supervisor.bundle import sources_from_engine, write_bundle
from codesdk.supervisor.engine import Engine
from codesdk.supervisor.namespaces import SecretKey

MakeEngine = Callable[..., AbstractAsyncContextManager[Engine]]

SECRET = "canary-pg-variable-never-shown-5309"


def _database_text(url: str) -> str:
    """Every row of every table of the database, as text."""
    with psycopg.connect(url, autocommit=True) as conn:
        tables = [row[0] for row in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() ORDER BY tablename")]
        assert "events" in tables and "namespace_variables" in tables
        return "\n".join(str(row[0]) for table in tables
                         for row in conn.execute(f'SELECT t::text FROM "{table}" AS t'))


def _files_holding(root: Path, needle: bytes) -> list[Path]:
    found = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink() and path.suffix != ".sock":
            try:
                if needle in path.read_bytes():
                    found.append(path)
            except OSError:
                continue
    return found


async def test_a_variable_in_postgresql_shows_nowhere_but_in_its_worker(
        make_engine: MakeEngine, postgres_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    data = tmp_path / "data"
    with trio.fail_after(90):
        async with make_engine(data_dir=data, store=postgres_url, secret_key=SecretKey(os.urandom(32))) as engine:
            await trio.to_thread.run_sync(engine.pool.namespace_env.update, "user:alice", {"API_KEY": SECRET})
            await engine.pool.env_changed("user:alice")
            session = await engine.create_session(namespace="user:alice")
            task = await engine.start_task(session.session_id, "hi", runtime_config={"scenario": "echo"})
            await engine.wait_task(task.task_id)
            worker = engine.pool.worker_of("user:alice")
            assert worker is not None and worker.spec.env["API_KEY"] == SECRET  # it did reach the worker
            bundle = tmp_path / "bundle.tar"
            await write_bundle(await sources_from_engine(engine, session.session_id), bundle)
    with tarfile.open(bundle) as archive:
        for member in archive.getmembers():
            handle = archive.extractfile(member)
            assert handle is None or SECRET.encode() not in handle.read(), member.name
    database = await trio.to_thread.run_sync(_database_text, postgres_url)
    assert session.session_id in database and task.task_id in database  # the run is there...
    assert SECRET not in database  # ...its variable is not
    assert SECRET not in caplog.text
    assert _files_holding(data, SECRET.encode()) == []


async def test_a_quarantine_follows_its_namespace_to_another_supervisor(
        make_engine: MakeEngine, postgres_url: str, tmp_path: Path) -> None:
    """Recorded in the database: a supervisor taking the namespace over (here: after the first one stopped) refuses
    its tasks too, until an operator lifts it there."""
    from codesdk.protocol import EventType
    from codesdk.supervisor.workers.launch import WorkerPolicy
    from tests.e2e.conftest import of_type, run_task
    from tests.waits import until

    key = SecretKey(os.urandom(32))
    policy = WorkerPolicy(max_restarts=2, restart_window_s=300, quarantine_s=3600)
    with trio.fail_after(120):
        async with make_engine(data_dir=tmp_path / "a", store=postgres_url, secret_key=key,
                               worker_policy=policy) as first:
            for _ in range(2):
                await run_task(first, namespace="user:alice", runtime_config={"scenario": "crash-exit"})
            shared = first.pool.config.quarantines
            assert shared is not None
            await until("the quarantine to be shared",
                        lambda: shared.current("user:alice") is not None)
        async with make_engine(data_dir=tmp_path / "b", store=postgres_url, secret_key=key,
                               worker_policy=policy) as second:
            [listed] = [w for w in await second.pool.status_with_shared() if w["namespace"] == "user:alice"]
            assert listed["state"] == "quarantined" and "2 crashes" in str(listed["quarantine_reason"])
            _, record, events = await run_task(second, namespace="user:alice", runtime_config={"scenario": "echo"})
            failed = of_type(events, EventType.TASK_FAILED)[0]
            assert record.error is not None and "is quarantined" in failed.message and "2 crashes" in failed.message
            assert await second.pool.lift_shared_quarantine("user:alice")
            _, record, _ = await run_task(second, namespace="user:alice", runtime_config={"scenario": "echo"})
            assert record.error is None


async def test_a_supervisor_with_another_key_fails_the_task_saying_so(
        make_engine: MakeEngine, postgres_url: str, tmp_path: Path) -> None:
    from codesdk.protocol import EventType
    from tests.e2e.conftest import of_type, run_task

    with trio.fail_after(90):
        first_key, second_key = SecretKey(os.urandom(32)), SecretKey(os.urandom(32))
        async with make_engine(data_dir=tmp_path / "a", store=postgres_url, secret_key=first_key) as first:
            await trio.to_thread.run_sync(first.pool.namespace_env.update, "user:alice", {"API_KEY": SECRET})
        async with make_engine(data_dir=tmp_path / "b", store=postgres_url, secret_key=second_key) as second:
            _, record, events = await run_task(second, namespace="user:alice", runtime_config={"scenario": "echo"})
    failed = of_type(events, EventType.TASK_FAILED)[0]
    assert record.error is not None and "operator must check the deployment's secret key" in failed.message
    assert SECRET not in failed.message  # nor the key ids or what the operator is to do: those are in the log
    assert first_key.key_id not in failed.message and second_key.key_id not in failed.message
