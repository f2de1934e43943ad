"""Schema versioning: fresh databases, migrating older ones, refusing newer or foreign ones."""

from __future__ import annotations

import json
from pathlib import Path

import apsw
import pytest
import trio

from codesdk.supervisor.store import (
    DB_FILENAME,
    SCHEMA_VERSION,
    DatabaseError,
    EventStore,
    MigrationFailed,
    SchemaTooNew,
    SessionBusy,
    StoreError,
    TaskState,
)
from codesdk.supervisor.store._schema import MIGRATIONS, migrate

from tests.store.store_helpers import delta, texts


def _connect(data_dir: Path) -> apsw.Connection:
    data_dir.mkdir(parents=True, exist_ok=True)
    return apsw.Connection(str(data_dir / DB_FILENAME))


def _make_v1(data_dir: Path, *, two_active_tasks: bool = False) -> None:
    """A database as the first release left it, with a session, two events and task rows."""
    conn = _connect(data_dir)
    conn.pragma("journal_mode", "WAL")
    assert migrate(conn, str(data_dir / DB_FILENAME), target=1) == 0
    now = "2026-01-01T00:00:00+00:00"
    conn.execute(
        "INSERT INTO sessions(session_id, runtime, namespace, created_at, last_seq) VALUES ('s1', 'scripted', 'default', ?, 2)",
        (now,),
    )
    for seq, text in ((1, "old-1"), (2, "old-2")):
        body = {
            "schema_version": 1,
            "time": "2026-01-01T00:00:00Z",
            "type": "model.output.delta",
            "trace": {"session_id": "s1"},
            "runtime": {"name": "scripted"},
            "payload": {"block_id": "b", "delta": text},
        }
        conn.execute(
            "INSERT INTO events(session_id, seq, type, time, schema_version, body) VALUES ('s1', ?, ?, ?, 1, ?)",
            (seq, "model.output.delta", now, json.dumps(body)),
        )
    states = ("running", "pending") if two_active_tasks else ("completed", "running")
    for index, state in enumerate(states):
        conn.execute(
            "INSERT INTO tasks(task_id, session_id, state, runtime, created_at) VALUES (?, 's1', ?, 'scripted', ?)",
            (f"t{index}", state, now),
        )
    conn.close()


def _version(data_dir: Path) -> tuple[int, list[int]]:
    conn = _connect(data_dir)
    try:
        history = [row[0] for row in conn.execute("SELECT version FROM schema_migrations ORDER BY version")]
        return int(conn.pragma("user_version")), history
    finally:
        conn.close()


def test_migrations_are_numbered_in_order() -> None:
    assert [m.version for m in MIGRATIONS] == list(range(1, len(MIGRATIONS) + 1))
    assert SCHEMA_VERSION == MIGRATIONS[-1].version >= 2


async def test_fresh_database_is_latest_and_wal(data_dir: Path) -> None:
    with trio.fail_after(10):
        async with EventStore.open(data_dir):
            pass
        assert _version(data_dir) == (SCHEMA_VERSION, list(range(1, SCHEMA_VERSION + 1)))
        conn = _connect(data_dir)
        assert conn.pragma("journal_mode") == "wal"
        conn.close()


async def test_older_database_is_migrated_and_keeps_its_data(data_dir: Path) -> None:
    with trio.fail_after(10):
        _make_v1(data_dir)
        assert _version(data_dir) == (1, [1])
        async with EventStore.open(data_dir, synchronous="NORMAL") as store:
            assert texts(await store.read("s1")) == ["old-1", "old-2"]
            [event] = await store.append("s1", [delta("new")])
            assert event.seq == 3
            assert [t.state for t in await store.list_tasks("s1")] == [TaskState.COMPLETED, TaskState.RUNNING]
            with pytest.raises(SessionBusy):  # the guard migration 2 added
                await store.create_task("s1")
        assert _version(data_dir) == (SCHEMA_VERSION, list(range(1, SCHEMA_VERSION + 1)))


async def test_failed_migration_leaves_the_old_version(data_dir: Path) -> None:
    with trio.fail_after(10):
        _make_v1(data_dir, two_active_tasks=True)  # violates the one-active-task index of migration 2
        with pytest.raises(MigrationFailed, match="schema version 2 .*left at version 1"):
            async with EventStore.open(data_dir):
                pass
        assert _version(data_dir) == (1, [1])
        conn = _connect(data_dir)
        assert conn.execute("SELECT count(*) FROM events").get == 2
        conn.close()


async def test_newer_database_is_refused(data_dir: Path) -> None:
    with trio.fail_after(10):
        async with EventStore.open(data_dir):
            pass
        conn = _connect(data_dir)
        conn.pragma("user_version", SCHEMA_VERSION + 5)
        conn.close()
        with pytest.raises(SchemaTooNew, match=f"schema version {SCHEMA_VERSION + 5}.*upgrade codesdk"):
            async with EventStore.open(data_dir):
                pass


async def test_file_that_is_not_a_database(data_dir: Path) -> None:
    with trio.fail_after(10):
        data_dir.mkdir()
        (data_dir / DB_FILENAME).write_bytes(b"this is not sqlite, just some bytes " * 200)
        with pytest.raises(DatabaseError, match="not a SQLite database"):
            async with EventStore.open(data_dir):
                pass


async def test_foreign_sqlite_database(data_dir: Path) -> None:
    with trio.fail_after(10):
        conn = _connect(data_dir)
        conn.execute("CREATE TABLE other(x)")
        conn.close()
        with pytest.raises(StoreError, match="not a codesdk one"):
            async with EventStore.open(data_dir):
                pass


async def test_data_dir_that_is_a_file(tmp_path: Path) -> None:
    with trio.fail_after(10):
        path = tmp_path / "file"
        path.write_text("x")
        with pytest.raises(StoreError, match="opening the event store"):
            async with EventStore.open(path):
                pass
