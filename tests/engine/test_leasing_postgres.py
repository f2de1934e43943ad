"""The engine's side of namespace leases on PostgreSQL, with worker doubles: a supervisor whose renewals hang lets go
of its namespaces at the deadline, and the task it dropped is failed once when the lease is taken over."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from codesdk.procs.children import Children
from codesdk.protocol import TERMINAL_EVENT_TYPES, TaskFailed
from codesdk.supervisor.engine import Engine, EngineConfig
from codesdk.supervisor.store import DataDirBusy
from codesdk.supervisor.tools import ToolRegistry, ToolsConfig
from codesdk.supervisor.workers.launch import PoolConfig

from tests.waits import until
from tests.engine.doubles import FakeWorkers, running_task

#: Short, so the deadline comes within the test (the waits are for conditions, not for this long).
LEASE_S = 1.0


@asynccontextmanager
async def engine_on(data_dir: Path, url: str, children: Children) -> AsyncIterator[tuple[Engine, FakeWorkers]]:
    """An engine on ``url``; ``children``: the test process's registry, for engines opened side by side."""
    workers = FakeWorkers()
    config = EngineConfig(data_dir=data_dir, pool=PoolConfig(data_dir=data_dir, children=children), store=url,
                          lease_s=LEASE_S)
    async with Engine.open(config, ToolRegistry(ToolsConfig()), workers=workers.factory) as engine:
        yield engine, workers


def hold_table_lock(url: str, table: str) -> Any:
    """A connection whose open transaction holds ``table`` locked, so that every statement on it hangs."""
    import psycopg

    conn = psycopg.connect(url)
    conn.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
    return conn


async def test_renewals_that_hang_still_let_go_at_the_deadline(tmp_path: Path, postgres_url: str,
                                                               children: Children) -> None:
    with trio.fail_after(60):
        async with engine_on(tmp_path / "a", postgres_url, children) as (engine, workers):
            session_id, task_id, worker = await running_task(engine, workers)
            blocker = await trio.to_thread.run_sync(hold_table_lock, postgres_url, "supervisors")
            try:  # every renewal now waits on the lock: neither succeeds nor fails
                await until("the namespace's worker to be let go", worker.exited.is_set)
                assert engine.leasing.leases.failure is not None and "not renewed" in engine.leasing.leases.failure
                assert engine.active_task(session_id) is None  # dropped, nothing stored by us
                assert (await engine.store.get_task(task_id)).state == "running"
            finally:
                await trio.to_thread.run_sync(blocker.close)
            # The database answers again: the lease we let go of expires, is taken over (by us: nobody else is
            # here) and the task we dropped is failed, once.
            await until("the leases to be renewed again", lambda: engine.leasing.leases.failure is None)
            while (await engine.store.get_task(task_id)).state == "running":
                await trio.sleep(0.02)
            events = await engine.store.read(session_id)
            terminals = [e for e in events if e.type in TERMINAL_EVENT_TYPES]
            assert len(terminals) == 1 and isinstance(terminals[0].payload, TaskFailed)
            assert terminals[0].payload.code == "SUPERVISOR_RESTARTED"


async def test_a_data_dir_has_one_supervisor_whatever_the_store(tmp_path: Path, postgres_url: str,
                                                                children: Children) -> None:
    with trio.fail_after(60):
        async with engine_on(tmp_path / "a", postgres_url, children):
            with pytest.raises(DataDirBusy, match="only one supervisor may write it"):
                async with engine_on(tmp_path / "a", postgres_url, children):
                    pass
