"""Grants through the engine with an embedding's approver (``ApproverAnswer``): a scoped answer decides the
session's later calls, in a non-interactive task too; a task grant ends with its task; an answer that cannot apply
is a denial, never a guess."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from codesdk.protocol import (
    EventType,
    GrantScope,
    InteractionMode,
    PathPattern,
    PermissionMode,
    PolicySource,
    ToolCallDenied,
)
from codesdk.supervisor.engine import ApprovalRequest, Approver, ApproverAnswer, Engine, session_events
from codesdk.supervisor.store import TaskState
from codesdk.testing.invariants import check_session

from tests.conftest import MakeEngine

INTERACTIVE: dict[str, Any] = {"permission_mode": PermissionMode.ASK, "interaction_mode": InteractionMode.INTERACTIVE}


async def _run(engine: Engine, session_id: str, scenario: str = "write-twice", **options: Any) -> None:
    task = await engine.start_task(session_id, "write", runtime_config={"scenario": scenario}, **options)
    assert (await engine.wait_task(task.task_id)).state == TaskState.COMPLETED


async def test_a_session_grant_answers_a_later_non_interactive_task_and_a_task_grant_does_not(
        make_engine: MakeEngine, tmp_path: Path) -> None:
    asked: list[str] = []

    def answering(scope: GrantScope) -> Approver:
        async def approver(request: ApprovalRequest) -> ApproverAnswer:
            asked.append(str(request.input.get("path")))
            return ApproverAnswer(allow=True, reason="ok", scope=scope)
        return approver

    with trio.fail_after(60):
        async with make_engine() as engine:
            for scope, expected in ((GrantScope.TASK, "denied"), (GrantScope.SESSION, "approved")):
                (ws := tmp_path / scope.value).mkdir()
                session = await engine.create_session(workspace=ws)
                await _run(engine, session.session_id, approver=answering(scope), **INTERACTIVE)
                # the next task runs unattended: only a session grant answers for it
                await _run(engine, session.session_id, "write-or-deny", permission_mode=PermissionMode.ASK)
                events = await session_events(engine.store, session.session_id)
                check_session(events)
                decisions = [e.type for e in events if e.type in (EventType.TOOL_CALL_APPROVED,
                                                                  EventType.TOOL_CALL_DENIED)]
                assert decisions[-1] == (EventType.TOOL_CALL_APPROVED if expected == "approved"
                                         else EventType.TOOL_CALL_DENIED)
                assert (ws / "notes.txt").exists() == (expected == "approved")
    assert asked == ["first.txt", "first.txt"]  # each first write asked; the second of each task was not


async def test_an_approvers_answer_that_cannot_apply_is_a_denial(make_engine: MakeEngine, tmp_path: Path) -> None:
    async def muddled(request: ApprovalRequest) -> ApproverAnswer:
        # a rule for the write, but an edited input the tool would refuse (path must be text)
        return ApproverAnswer(allow=True, scope=GrantScope.RULE, pattern=PathPattern(prefix="src"),
                              input={"path": 3})

    with trio.fail_after(60):
        async with make_engine() as engine:
            (ws := tmp_path / "ws").mkdir()
            session = await engine.create_session(workspace=ws)
            await _run(engine, session.session_id, "write-or-deny", approver=muddled, **INTERACTIVE)
            events = await session_events(engine.store, session.session_id)
    check_session(events)
    [denied] = [e.payload for e in events if isinstance(e.payload, ToolCallDenied)]
    assert denied.source == PolicySource.CODESDK and "approval failed: input.path" in denied.reason
    assert not [e for e in events if e.type == EventType.GRANT_CREATED]
    assert not (ws / "notes.txt").exists()
