"""The engine's side of fenced writes on PostgreSQL, with worker doubles: a write refused because the namespace's
lease moved to another supervisor makes the engine let the namespace go as on a lost lease — it says so, ends its
worker, drops its runs there and records nothing more for it."""

from __future__ import annotations

import logging
from pathlib import Path

import psycopg
import pytest
import trio

from codesdk.procs.children import Children
from codesdk.protocol import EventType, ModelOutputDelta
from codesdk.supervisor.engine import Engine, EngineConfig
from codesdk.supervisor.tools import ToolRegistry, ToolsConfig
from codesdk.supervisor.workers.launch import PoolConfig

from tests.engine.doubles import FakeWorkers, running_task
from tests.waits import until

#: Long: no renewal finds the lease lost during the test, so the refused write is what tells the engine.
LEASE_S = 600.0
NAMESPACE = "user:paused"


def take_over(url: str, namespace: str) -> None:
    """Another supervisor takes the namespace over (a new epoch, another holder), as after our lease expired."""
    with psycopg.connect(url) as conn:
        conn.execute("UPDATE namespace_leases SET supervisor_id = 'elsewhere', "
                     "epoch = nextval('namespace_lease_epochs') WHERE namespace = %s", (namespace,))


async def test_a_refused_write_lets_the_namespace_go_and_nothing_more_is_recorded(
        tmp_path: Path, postgres_url: str, children: Children, caplog: pytest.LogCaptureFixture) -> None:
    workers = FakeWorkers()
    config = EngineConfig(data_dir=tmp_path / "a", pool=PoolConfig(data_dir=tmp_path / "a", children=children),
                          store=postgres_url, lease_s=LEASE_S)
    with trio.fail_after(60), caplog.at_level(logging.ERROR, logger="codesdk.supervisor.engine"):
        async with Engine.open(config, ToolRegistry(ToolsConfig()), workers=workers.factory) as engine:
            session_id, task_id, worker = await running_task(engine, workers, namespace=NAMESPACE)
            await worker.emit(task_id, EventType.MODEL_OUTPUT_DELTA, ModelOutputDelta(block_id="b", delta="before"))
            while not any(e.type == EventType.MODEL_OUTPUT_DELTA for e in await engine.store.read(session_id)):
                await trio.sleep(0.01)  # (a condition: the delta stored)
            stored = await engine.store.read(session_id)

            await trio.to_thread.run_sync(take_over, postgres_url, NAMESPACE)
            await worker.emit(task_id, EventType.MODEL_OUTPUT_DELTA, ModelOutputDelta(block_id="b", delta="after"))
            await until("the namespace's worker to be let go", worker.exited.is_set)
            assert NAMESPACE not in (engine.leasing.leases.epochs or {})
            assert engine.active_task(session_id) is None  # dropped here: its end is the new holder's to record
            assert any("a write was refused" in r.getMessage() and NAMESPACE in r.getMessage()
                       for r in caplog.records)
            assert await engine.store.read(session_id) == stored  # nothing more recorded for the namespace
            assert (await engine.store.get_task(task_id)).state == "running"  # not ended by us
