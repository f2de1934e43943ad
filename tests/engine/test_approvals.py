"""Approvals at the engine: a decision reaches the call that waits for it, whenever it is made.

An approval is listed (and streamed as ``approval.requested``) from the moment it is recorded, a little before its
call starts to wait for the decision: an app that answers at once, or a second supervisor's API, may decide in
between. Before the fix that decision woke nobody and the call waited for the approval's timeout (15 minutes).
Trio's clock stands still here: a call that waits for a timeout never ends, and the real-time guard says so."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio.testing

from codesdk.protocol import (
    ApprovalState,
    EventType,
    ExecutedBy,
    Method,
    PermissionMode,
    ToolCallRequested,
    canonical_hash,
)
from codesdk.supervisor.engine._runs import TaskRun
from codesdk.supervisor.store import ApprovalRecord
from codesdk.supervisor.tools import ApprovalRequest

from tests.engine.doubles import engine_with_doubles, running_task
from tests.waits import real_time_limit


@pytest.mark.parametrize("allow", [True, False], ids=["approved", "denied"])
async def test_a_decision_made_before_the_call_waits_is_not_lost(
        tmp_path: Path, still_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch, allow: bool) -> None:
    with real_time_limit("the runtime's answer after an early decision", seconds=60):
        async with engine_with_doubles(tmp_path) as (engine, workers):
            broker = engine.approvals
            waits = broker.wait
            decided: list[ApprovalRecord] = []

            async def decided_first(run: TaskRun, record: ApprovalRecord, request: ApprovalRequest,
                                    ) -> ApprovalRecord:
                decided.append(await broker.decide(record.approval_id, allow, "user", "answered at once"))
                return await waits(run, record, request)

            monkeypatch.setattr(broker, "wait", decided_first)
            _, task_id, worker = await running_task(engine, workers, permission_mode=PermissionMode.ASK,
                                                    durable_approvals=True)
            tool_input: dict[str, Any] = {"path": "a.txt", "content": "a"}
            await worker.emit(task_id, EventType.TOOL_CALL_REQUESTED, ToolCallRequested(
                tool_call_id="call_1", input_hash=canonical_hash(tool_input), tool_name="workspace.write",
                input=tool_input, executed_by=ExecutedBy.SUPERVISOR))
            answer = Method.SEND_TOOL_RESULT if allow else Method.SEND_TOOL_DENIED
            await worker.connection.wait_for(answer)
    assert [record.decided_by for record in decided] == ["user"]
    assert decided[0].state == (ApprovalState.APPROVED if allow else ApprovalState.DENIED)
