"""What is particular to the SQLite store (``EventStore``): its rows, its options, its default durability."""

from __future__ import annotations

from pathlib import Path

import apsw
import pytest
import trio

from codesdk.supervisor.store import DB_FILENAME, EventStore

from tests.store.backends import SQLiteBackend
from tests.store.store_helpers import delta, session_created
from tests.store.test_store_contract import reopen_keeps_everything


async def test_reopen_keeps_everything_at_default_durability(data_dir: Path) -> None:
    await reopen_keeps_everything(SQLiteBackend(data_dir, synchronous="FULL"))


async def test_events_rows_have_indexed_columns(data_dir: Path) -> None:
    with trio.fail_after(10):
        async with EventStore.open(data_dir, synchronous="NORMAL") as store:
            await store.create_session("s1", runtime="scripted")
            await store.append("s1", [session_created(), delta("x", session_id="s1", task_id="t9")])
        conn = apsw.Connection(str(data_dir / DB_FILENAME))
        rows = conn.execute("SELECT session_id, seq, task_id, type, body FROM events ORDER BY seq").fetchall()
        conn.close()
        assert [row[:4] for row in rows] == [("s1", 1, None, "session.created"), ("s1", 2, "t9", "model.output.delta")]
        assert '"seq"' not in str(rows[1][4])  # the key column is the one source of seq


async def test_open_rejects_bad_options(data_dir: Path) -> None:
    with trio.fail_after(10):
        with pytest.raises(ValueError, match="synchronous"):
            async with EventStore.open(data_dir, synchronous="OFF"):  # type: ignore[arg-type]
                pass
        with pytest.raises(ValueError, match="max_batch"):
            async with EventStore.open(data_dir, max_batch=0):
                pass
