"""A tool call cut short by a stop is ended in the log alike on every runtime: the supervisor stores its
``tool.call.completed`` (``is_error``, ``cut_short: cancelled``) with ``task.stopped`` (issue 33, item 2)."""

from __future__ import annotations

from pathlib import Path

import trio

from codesdk.protocol import CallCutShort, EventType, PermissionMode, ToolCallCompleted
from codesdk.supervisor.engine import session_events
from codesdk.supervisor.store import TaskState
from codesdk.testing.invariants import check_session

from tests.conftest import MakeEngine
from tests.contract.cases import Case, workspace
from tests.waits import until


async def test_a_call_cut_short_by_a_stop_is_completed_as_cancelled(make_engine: MakeEngine, case: Case,
                                                                     tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    sleeper = "import time; open('started', 'w').write('yes'); time.sleep(3600)"
    turn = case.tools(("workspace.exec", {"argv": ["python3", "-c", sleeper]}))
    with trio.fail_after(120):
        async with make_engine(worker_env={"*": case.worker_env()}, exec_allowlist=("python3",)) as engine:
            session = await engine.create_session(runtime=case.runtime, workspace=ws)
            task = await engine.start_task(session.session_id, turn.prompt, runtime_config=turn.runtime_config,
                                           permission_mode=PermissionMode.YOLO)
            await until("the command to start", (ws / "started").exists)
            record = await engine.stop_task(task.task_id, reason="enough")
            events = await session_events(engine.store, session.session_id)
    assert record.state == TaskState.STOPPED
    check_session(events)  # no call left open
    ends = [e.payload for e in events if isinstance(e.payload, ToolCallCompleted)]
    assert [(e.tool_name, e.is_error, e.cut_short) for e in ends] == [
        ("workspace.exec", True, CallCutShort.CANCELLED)]
    assert events[-1].type == EventType.TASK_STOPPED
