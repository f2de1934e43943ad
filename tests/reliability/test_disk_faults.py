"""A disk that fails under the store — full, or I/O errors — injected through a real SQLite VFS.

The promise: a write that did not reach the disk is never acknowledged (the caller gets an error naming the
cause and the fix, subscribers see nothing), the failure is reported (``write_failure``, ``/readyz``), seq stays
gap-free, and once the disk recovers the store carries on without a restart and without damage.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import apsw
import pytest
import trio

from codesdk.protocol import TERMINAL_EVENT_TYPES, EventType, RuntimeInfo
from codesdk.supervisor.engine import Engine, EngineConfig
from codesdk.supervisor.store import DatabaseError, EventDraft, EventStore
from codesdk.supervisor.tools import ToolRegistry, ToolsConfig
from codesdk.supervisor.workers.launch import PoolConfig
from codesdk.worker.command import TEST_STEPS_ENV
from tests.asgi import asgi_get as _get
from tests.conftest import SCENARIOS
from tests.e2e.conftest import wait_for_event
from tests.reliability.test_crash_points import integrity_ok

_names = itertools.count()


class FaultyVFS(apsw.VFS):
    """Passes everything to the default VFS, except writes and syncs while ``failing`` is set."""

    def __init__(self) -> None:
        self.vfs_name = f"faulty{next(_names)}"
        self.failing: type[apsw.Error] | None = None
        self.injected = 0
        super().__init__(self.vfs_name, "")

    def xOpen(self, name: Any, flags: list[int]) -> apsw.VFSFile:
        return FaultyFile(self, name, flags)


class FaultyFile(apsw.VFSFile):
    def __init__(self, vfs: FaultyVFS, name: Any, flags: list[int]) -> None:
        self._vfs = vfs
        super().__init__("", name, flags)

    def _maybe_fail(self) -> None:
        if self._vfs.failing is not None:
            self._vfs.injected += 1
            raise self._vfs.failing("injected fault")

    def xWrite(self, data: bytes, offset: int) -> None:
        self._maybe_fail()
        super().xWrite(data, offset)

    def xSync(self, flags: int) -> None:
        self._maybe_fail()
        super().xSync(flags)


def _draft(i: int) -> EventDraft:
    return EventDraft(type=EventType.SESSION_CREATED, runtime=RuntimeInfo(name="scripted"),
                      payload={"contract_version": "1.0", "runtime": "scripted", "namespace": "default",
                               "metadata": {"i": i}})


@pytest.mark.parametrize(("fault", "hint"), [(apsw.FullError, "the disk is full"),
                                             (apsw.IOError, "an I/O error occurred")])
async def test_a_failing_disk_is_never_acknowledged_and_the_store_recovers(
        tmp_path: Path, faulty: FaultyVFS, fault: type[apsw.Error], hint: str) -> None:
    async with EventStore.open(tmp_path, vfs=faulty.vfs_name) as store:
        sid = (await store.create_session(runtime="scripted", namespace="default")).session_id
        handed: list[int] = []

        async def follow() -> None:
            async with store.subscribe(sid) as events:
                async for event in events:
                    handed.append(event.seq)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(follow)
            acknowledged = [e.seq for e in await store.append(sid, [_draft(0), _draft(1)])]
            faulty.failing = fault
            for i in range(3):
                with pytest.raises(DatabaseError, match=hint) as failed:
                    await store.append(sid, [_draft(10 + i)])
                assert "free space" in str(failed.value) or "check the disk" in str(failed.value)
            assert faulty.injected > 0
            assert store.write_failure is not None and hint in store.write_failure
            assert await store.last_seq(sid) == 2  # nothing half-stored
            with pytest.raises(DatabaseError, match=hint):  # the probe (readiness, watchdog) is a real write
                await store.ping()
            faulty.failing = None
            await store.ping()  # and it alone tells that the disk is back
            assert store.write_failure is None
            acknowledged += [e.seq for e in await store.append(sid, [_draft(20)])]
            assert store.write_failure is None
            await trio.sleep(0.2)
            nursery.cancel_scope.cancel()
        assert acknowledged == [1, 2, 3]  # gap-free: the failed appends took no seq
        assert handed == acknowledged  # subscribers saw exactly what was acknowledged
    integrity_ok(tmp_path)
    async with EventStore.open(tmp_path) as store:  # and after a restart, exactly that is there
        assert [e.seq for e in await store.read(sid)] == [1, 2, 3]


async def test_the_engine_stops_a_task_whose_events_cannot_be_stored_and_readyz_says_why(
        tmp_path: Path, faulty: FaultyVFS) -> None:
    from codesdk.supervisor.api import TokenAuth
    from codesdk.supervisor.api.server import create_app

    data = tmp_path / "data"
    pool = PoolConfig(data_dir=data, env={"*": {"CODESDK_SCENARIO_DIR": SCENARIOS, TEST_STEPS_ENV: "1"}})
    config = EngineConfig(data_dir=data, pool=pool, store_vfs=faulty.vfs_name)
    with trio.fail_after(60):
        async with Engine.open(config, ToolRegistry(ToolsConfig())) as engine:
            session = await engine.create_session()
            task = await engine.start_task(session.session_id, "x", runtime_config={"scenario": "slow-stream"})
            await wait_for_event(EventType.MODEL_OUTPUT_DELTA, engine, session.session_id)
            acknowledged = await engine.store.last_seq(session.session_id)
            faulty.failing = apsw.FullError
            with trio.fail_after(20):
                while engine.store.write_failure is None:
                    await trio.sleep(0.02)
            app = create_app(engine, TokenAuth.bootstrap(tmp_path / "auth"))
            status, body = await _get(app, "/readyz")
            assert status == 503 and b"store_failing" in body and b"disk is full" in body
            assert await engine.store.last_seq(session.session_id) == acknowledged
            faulty.failing = None  # the disk recovers: the task's end is stored, the next task runs
            record = await engine.wait_task(task.task_id)
            assert record.state.value == "failed" and record.error is not None
            assert "could not store" in record.error["message"]
            stored = await engine.store.read(session.session_id)
            assert [e.seq for e in stored] == list(range(1, len(stored) + 1))
            assert sum(e.type in TERMINAL_EVENT_TYPES for e in stored) == 1
            nxt = await engine.start_task(session.session_id, "again", runtime_config={"scenario": "echo"})
            assert (await engine.wait_task(nxt.task_id)).state.value == "completed"
            status, _ = await _get(app, "/readyz")
            assert status == 200
    integrity_ok(tmp_path / "data")
