"""A read-only tool call is stored whole in one commit after the read ran: a failure between the read and that
commit leaves nothing of the call in the log, and its task ends with one failure.

The store's disk fails (through a real SQLite VFS, ``FaultyVFS``) at the one moment that matters: right after the
supervisor ran the read, before its record is committed. The log must never hold a half-recorded read call (a
request, decision or start without its completion); the task fails once, and the namespace runs the next task.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import apsw
import trio

from codesdk.protocol import TERMINAL_EVENT_TYPES, EventType, PermissionMode, ToolCallCompleted
from codesdk.supervisor.engine import Engine, EngineConfig
from codesdk.supervisor.tools import ToolContext, ToolRegistry, ToolResult, ToolsConfig
from codesdk.supervisor.workers.launch import PoolConfig
from codesdk.testing.invariants import check_session
from codesdk.worker.command import TEST_STEPS_ENV
from tests.conftest import SCENARIOS
from tests.reliability.test_crash_points import integrity_ok
from tests.reliability.test_disk_faults import FaultyVFS

_CALL_EVENTS = frozenset({EventType.TOOL_CALL_REQUESTED, EventType.TOOL_CALL_POLICY_EVALUATED,
                          EventType.TOOL_CALL_APPROVED, EventType.TOOL_CALL_STARTED, EventType.TOOL_CALL_COMPLETED})


class DiskFailsAfterTheRead(ToolRegistry):
    """The real tools; after the first ``workspace.read`` has run, the store's disk starts failing."""

    def __init__(self, vfs: FaultyVFS) -> None:
        super().__init__(ToolsConfig())
        self.vfs = vfs
        self.reads: list[ToolResult] = []

    async def execute(self, name: str, input: Any, ctx: ToolContext) -> ToolResult:
        result = await super().execute(name, input, ctx)
        if name == "workspace.read" and not self.reads:
            self.reads.append(result)
            self.vfs.failing = apsw.IOError
        return result


async def test_a_read_whose_commit_fails_leaves_nothing_of_the_call_and_fails_its_task_once(
        tmp_path: Path, faulty: FaultyVFS) -> None:
    data, workspace = tmp_path / "data", tmp_path / "ws"
    workspace.mkdir()
    (workspace / "notes.txt").write_text("read me\n")
    scenario = {"name": "read-then-talk", "steps": [
        {"text": "let me look", "chunk_size": 4},
        {"tool_calls": [{"id": "r1", "name": "workspace.read", "input": {"path": "notes.txt"}}]},
        {"text": "it says: read me", "chunk_size": 4},
        {"complete": {}}]}
    tools = DiskFailsAfterTheRead(faulty)
    pool = PoolConfig(data_dir=data, env={"*": {"CODESDK_SCENARIO_DIR": SCENARIOS, TEST_STEPS_ENV: "1"}})
    with trio.fail_after(60):
        async with Engine.open(EngineConfig(data_dir=data, pool=pool, store_vfs=faulty.vfs_name), tools) as engine:
            session = await engine.create_session(workspace=workspace)
            task = await engine.start_task(session.session_id, "go", permission_mode=PermissionMode.YOLO,
                                           runtime_config={"scenario_inline": scenario})
            while engine.store.write_failure is None:  # the read ran; its one commit failed
                await trio.sleep(0.01)
            assert tools.reads and not tools.reads[0].is_error  # the read itself succeeded
            stored = await engine.store.read(session.session_id)
            assert not [e for e in stored if e.type in _CALL_EVENTS], "a half-recorded read call was stored"
            faulty.failing = None  # the disk recovers: the task's end is stored
            record = await engine.wait_task(task.task_id)
            assert record.state.value == "failed" and record.error is not None
            assert "could not store" in record.error["message"]
            stored = await engine.store.read(session.session_id)
            check_session(stored)
            assert not [e for e in stored if e.type in _CALL_EVENTS]  # nothing of the call, ever
            assert sum(e.type in TERMINAL_EVENT_TYPES for e in stored) == 1
            nxt = await engine.start_task(session.session_id, "again", runtime_config={"scenario": "echo"})
            assert (await engine.wait_task(nxt.task_id)).state.value == "completed"
    integrity_ok(data)


async def test_a_read_that_is_stored_is_stored_whole_and_answered(tmp_path: Path) -> None:
    """Without a fault: the call's five events are consecutive (one commit) and the runtime got the result."""
    data, workspace = tmp_path / "data", tmp_path / "ws"
    workspace.mkdir()
    (workspace / "notes.txt").write_text("read me\n")
    scenario = {"name": "read", "steps": [
        {"tool_calls": [{"id": "r1", "name": "workspace.read", "input": {"path": "notes.txt"}}]},
        {"complete": {}}]}
    pool = PoolConfig(data_dir=data, env={"*": {"CODESDK_SCENARIO_DIR": SCENARIOS, TEST_STEPS_ENV: "1"}})
    with trio.fail_after(60):
        async with Engine.open(EngineConfig(data_dir=data, pool=pool), ToolRegistry(ToolsConfig())) as engine:
            session = await engine.create_session(workspace=workspace)
            task = await engine.start_task(session.session_id, "go", runtime_config={"scenario_inline": scenario})
            assert (await engine.wait_task(task.task_id)).state.value == "completed"
            stored = await engine.store.read(session.session_id)
    check_session(stored)
    call = [e for e in stored if e.type in _CALL_EVENTS]
    assert [e.type for e in call] == [EventType.TOOL_CALL_REQUESTED, EventType.TOOL_CALL_POLICY_EVALUATED,
                                      EventType.TOOL_CALL_APPROVED, EventType.TOOL_CALL_STARTED,
                                      EventType.TOOL_CALL_COMPLETED]
    assert [e.seq for e in call] == list(range(call[0].seq, call[0].seq + 5))
    completed = call[-1].payload
    assert isinstance(completed, ToolCallCompleted) and not completed.is_error
