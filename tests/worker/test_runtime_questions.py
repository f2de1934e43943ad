"""The runtimes' questions in CodeSDK's terms and back (Codex's requestUserInput and elicitations, Claude Code's
AskUserQuestion), and Codex's permission request as an approval: driven in this process with a recording TaskIO."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from codesdk.protocol import EventType, QuestionRequested, StartTaskParams, ToolCallRequested, value_problem
from codesdk.worker.adapters._questions import form_answer
from codesdk.worker.adapters.base import QuestionAnswer, RuntimeInput
from codesdk.worker.adapters.claude.questions import ask_user_input, ask_user_questions
from codesdk.worker.adapters.codex import questions as codex
from codesdk.worker.adapters.codex.adapter import CodexTask
from codesdk.worker.adapters.codex.launch import CodexSettings

USER_INPUT = {"threadId": "t", "turnId": "u", "itemId": "i", "isBlocking": True, "questions": [
    {"id": "colour", "header": "Colour", "question": "Which colour?", "isOther": True, "isSecret": False,
     "options": [{"label": "red", "description": "warm"}, {"label": "blue", "description": "calm"}]},
    {"id": "token", "header": "Token", "question": "Your token?", "isOther": False, "isSecret": True,
     "options": None}]}


def test_codex_user_input_round_trip() -> None:
    colour, token = codex.user_input_questions(USER_INPUT)
    assert [o.label for o in colour.options] == ["red", "blue"] and colour.allow_other and not colour.secret
    assert token.secret and not token.options and value_problem(colour, "green") is None  # isOther: any text
    answer = QuestionAnswer(answers={"colour": "red", "token": "s3cret"})
    assert codex.user_input_answer(answer) == {"answers": {"colour": {"answers": ["red"]},
                                                           "token": {"answers": ["s3cret"]}}}
    assert codex.user_input_answer(QuestionAnswer(declined=True, reason="no")) == {"answers": {}}


def test_a_codex_elicitation_form_is_one_question_per_property() -> None:
    params = {"serverName": "tickets", "mode": "form", "message": "File a ticket", "requestedSchema": {
        "type": "object", "required": ["title", "priority"], "properties": {
            "title": {"type": "string", "title": "Title", "minLength": 3},
            "priority": {"type": "string", "oneOf": [{"const": "p1", "title": "Urgent"}, {"const": "p2"}]},
            "count": {"type": "integer", "minimum": 1, "default": 1},
            "notify": {"type": "boolean"}}}}
    title, priority, count, notify = codex.elicitation_questions(params)
    assert title.required and not count.required and count.default == 1
    assert value_problem(title, "ab") == "must be at least 3 characters"
    assert value_problem(priority, "p3") is not None and value_problem(priority, "p1") is None
    assert value_problem(count, 0) == "must be at least 1" and value_problem(notify, "yes") is not None
    assert form_answer(QuestionAnswer(answers={"title": "abc", "priority": "p1"})) == {
        "action": "accept", "content": {"title": "abc", "priority": "p1"}}
    assert form_answer(QuestionAnswer(declined=True)) == {"action": "decline"}


def test_claude_ask_user_question_is_answered_in_its_input() -> None:
    tool_input = {"questions": [
        {"question": "Which colour?", "header": "Colour", "multiSelect": False,
         "options": [{"label": "red", "description": "warm"}, {"label": "blue", "description": "calm"}]},
        {"question": "Which sizes?", "header": "Sizes", "multiSelect": True,
         "options": [{"label": "S", "description": ""}, {"label": "L", "description": ""}]}]}
    colour, sizes = ask_user_questions(tool_input)
    assert (colour.id, sizes.id, sizes.multi_select) == ("q1", "q2", True)
    allowed = ask_user_input(tool_input, [colour, sizes], QuestionAnswer(answers={"q1": "a custom one",
                                                                                  "q2": ["S", "L"]}))
    assert allowed == {**tool_input, "answers": {"Which colour?": "a custom one", "Which sizes?": "S, L"}}


class _Io:
    """A TaskIO that records events and answers each tool call (approve or deny) as it is asked."""

    def __init__(self, approve: bool) -> None:
        self.events: list[tuple[EventType, Any]] = []
        self.approve = approve
        self.task: CodexTask | None = None

    async def emit(self, event_type: EventType, payload: Any, raw: Any = None) -> None:
        self.events.append((event_type, payload))
        assert self.task is not None
        if isinstance(payload, ToolCallRequested):
            if self.approve:
                self.task.send_tool_approved(payload.tool_call_id, "fine")
            else:
                self.task.send_tool_denied(payload.tool_call_id, "no")
        elif isinstance(payload, QuestionRequested):
            self.task.send_answer(payload.question_id, QuestionAnswer(answers={"colour": "blue"}))

    async def flush(self) -> None:
        pass

    async def write_raw(self, data: bytes) -> None:
        pass

    def set_runtime_session_id(self, runtime_session_id: str) -> None:
        pass

    def set_model(self, model: str) -> None:
        pass


def _codex_task(io: _Io, tmp_path: Path) -> CodexTask:
    params = StartTaskParams(runtime="codex", session={"session_id": "s"}, task_id="t", workspace=str(tmp_path),
                             messages=({"role": "user", "blocks": [{"type": "text", "text": "hi"}]},))
    task = CodexTask(params, io, RuntimeInput.rebuilt(params), Path("/bin/true"), CodexSettings.from_config({}))
    io.task = task
    return task


PERMISSIONS = {"threadId": "t", "turnId": "u", "itemId": "perm-1", "startedAtMs": 1, "cwd": "/w",
               "reason": "needs the network", "permissions": {"network": {"enabled": True}}}


async def test_codex_permission_request_is_an_approval_granted_for_the_turn_or_not_at_all(tmp_path: Path) -> None:
    with trio.fail_after(10):
        granted = await _codex_task(io := _Io(approve=True), tmp_path)._answer("item/permissions/requestApproval",
                                                                             PERMISSIONS)
        denied = await _codex_task(_Io(approve=False), tmp_path)._answer("item/permissions/requestApproval",
                                                                         PERMISSIONS)
    assert granted == {"permissions": {"network": {"enabled": True}}, "scope": "turn"}
    assert denied == {"permissions": {}, "scope": "turn"}
    [(kind, requested)] = io.events
    assert kind == EventType.TOOL_CALL_REQUESTED and requested.tool_name == "requestPermissions"
    assert requested.executed_by == "runtime" and requested.input["reason"] == "needs the network"


async def test_codex_user_input_is_asked_and_answered(tmp_path: Path) -> None:
    with trio.fail_after(10):
        io = _Io(approve=True)
        answer = await _codex_task(io, tmp_path)._answer("item/tool/requestUserInput", USER_INPUT)
        url = await _codex_task(_Io(approve=True), tmp_path)._answer("mcpServer/elicitation/request", {
            "mode": "url", "message": "Sign in", "url": "https://example.com", "elicitationId": "e"})
    [(kind, asked)] = io.events
    assert kind == EventType.QUESTION_REQUESTED and asked.source == "codex.request_user_input"
    assert answer == {"answers": {"colour": {"answers": ["blue"]}}}
    assert url == {"action": "decline"}


def test_a_claude_elicitation_form_is_asked_and_a_url_is_not() -> None:
    from codesdk.worker.adapters.claude.questions import elicitation_questions

    request = {"subtype": "elicitation", "mcp_server_name": "tickets", "message": "File a ticket", "mode": "form",
               "requested_schema": {"type": "object", "required": ["title"],
                                    "properties": {"title": {"type": "string", "title": "Title"}}}}
    [title] = elicitation_questions(request)
    assert title.required and title.header == "Title" and value_problem(title, 3) == "must be text"
    assert form_answer(QuestionAnswer(answers={"title": "t"})) == {"action": "accept", "content": {"title": "t"}}
    with pytest.raises(ValueError, match="cannot show it"):
        elicitation_questions({"mode": "url", "url": "https://example.com"})
