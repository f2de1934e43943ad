"""The ACP mapping, sans-IO: whatever the service stores, what ``codesdk acp`` says of it is valid ACP, and the
client's answers never allow more than they say."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from codesdk.protocol import (
    ApprovalRequested,
    EventType,
    NormalizedEvent,
    Question,
    QuestionRequested,
    UsageReported,
    answer_problems,
)
from codesdk.supervisor.cli.acp import translate as acp
from codesdk.supervisor.cli.acp.translate import AcpError

from tests.protocol.test_models import normalized_events

from .wire import validator

UPDATE = validator("SessionNotification")
PROMPT_RESULT = validator("PromptResponse")
PERMISSION = validator("RequestPermissionRequest")
ERROR = validator("Error")
INITIALIZE = validator("InitializeResponse")
CONFIG = validator("SetSessionConfigOptionResponse")
ELICITATION = validator("CreateElicitationRequest")

json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=10),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                       max_size=3), max_leaves=10)


def errors(validator_: Any, value: object) -> list[str]:
    return [f"{e.message} at {list(e.absolute_path)}" for e in validator_.iter_errors(value)]


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(normalized_events(), st.booleans(), st.none() | st.just("/srv/ws"), st.none() | st.integers(1, 10**7))
def test_every_event_becomes_valid_session_updates(event: NormalizedEvent, replay: bool, workspace: str | None,
                                                   context_window: int | None) -> None:
    for update in acp.event_updates(event, replay=replay, workspace=workspace, context_window=context_window):
        assert all(location["path"].startswith("/") for location in update.get("locations", []))
        assert not errors(UPDATE, {"sessionId": "ses_x", "update": update})
        assert update["_meta"]["codesdk"]["seq"] == event.seq


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(normalized_events(), st.lists(st.builds(UsageReported), max_size=3))
def test_a_tasks_end_is_a_valid_answer_or_an_acp_error(event: NormalizedEvent, usage: list[UsageReported]) -> None:
    try:
        result = acp.prompt_result(event, usage)
    except AcpError as exc:
        assert event.type == EventType.TASK_FAILED
        assert not errors(ERROR, exc.to_json())
    else:
        assert not errors(PROMPT_RESULT, result)
        stopped = event.type in (EventType.TASK_STOPPED,)
        assert (result["stopReason"] == "cancelled") >= stopped


@st.composite
def approvals(draw: st.DrawFn) -> NormalizedEvent:
    return NormalizedEvent(seq=draw(st.integers(1, 2**40)), time=datetime.now(UTC),
                           type=EventType.APPROVAL_REQUESTED, trace={"session_id": "s", "task_id": "t"},
                           runtime={"name": "scripted"}, payload=draw(st.builds(ApprovalRequested)))


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(approvals(), st.none() | st.dictionaries(st.text(max_size=8), json_values, max_size=4))
def test_an_approval_is_a_valid_permission_request(event: NormalizedEvent, tool_input: dict[str, Any] | None) -> None:
    assert not errors(PERMISSION, acp.permission_request("ses_x", event, tool_input))


@given(json_values)
def test_only_a_selected_allow_option_allows(answer: object) -> None:
    decision = acp.decision_of(answer)
    chosen = answer.get("outcome") if isinstance(answer, dict) else None
    selected = chosen.get("optionId") if isinstance(chosen, dict) and chosen.get("outcome") == "selected" else None
    assert decision.allow == (selected in ("allow_once", "allow_session"))
    assert decision.scope == ("session" if selected == "allow_session" else "once")


def test_the_offered_options_are_once_always_and_reject() -> None:
    kinds = {o["optionId"]: o["kind"] for o in acp.PERMISSION_OPTIONS}
    assert kinds == {"allow_once": "allow_once", "allow_session": "allow_always", "reject_once": "reject_once"}
    for option_id in kinds:
        decision = acp.decision_of({"outcome": {"outcome": "selected", "optionId": option_id}})
        assert decision.allow == option_id.startswith("allow")


@given(json_values)
def test_a_prompt_is_text_or_an_invalid_params_error(blocks: object) -> None:
    try:
        text = acp.prompt_text(blocks)
    except AcpError as exc:
        assert exc.code == acp.ErrorCode.INVALID_PARAMS
    else:
        assert text.strip()


def test_prompt_text_takes_text_resources_and_links() -> None:
    text = acp.prompt_text([{"type": "text", "text": "fix it"},
                            {"type": "resource", "resource": {"uri": "file:///a.py", "text": "x = 1"}},
                            {"type": "resource_link", "uri": "file:///b.py", "name": "b.py"}])
    assert "fix it" in text and "x = 1" in text and "file:///b.py" in text
    with pytest.raises(AcpError, match="image"):
        acp.prompt_text([{"type": "image", "data": "", "mimeType": "image/png"}])


@given(json_values)
def test_a_requested_version_is_a_whole_number_or_none(value: object) -> None:
    version = acp.requested_version(value)
    assert version is None or (isinstance(version, int) and version >= 0)


def test_initialize_and_config_options_are_valid() -> None:
    for needs_token in (True, False):
        assert not errors(INITIALIZE, acp.initialize_result(needs_token=needs_token))
    assert acp.initialize_result(needs_token=False)["protocolVersion"] == acp.PROTOCOL_VERSION == 1
    assert not errors(CONFIG, {"configOptions": acp.config_options("ask", "scripted", ["claude", "scripted"])})


@given(st.sampled_from(["ask", "auto", "yolo"]), st.none() | st.text(min_size=1, max_size=20),
       st.none() | st.text(max_size=20), st.lists(st.text(min_size=1, max_size=20), max_size=4))
def test_the_model_option_is_valid_and_names_the_choice(mode: str, model: str | None, default: str | None,
                                                        known: list[str]) -> None:
    options = acp.config_options(mode, "codex", ["codex"], model, default, True, known)
    assert not errors(CONFIG, {"configOptions": options})
    [chosen] = [o for o in options if o["id"] == "model"]
    assert chosen["currentValue"] in [o["value"] for o in chosen["options"]]
    assert "model" not in [o["id"] for o in acp.config_options(mode, "scripted", [], takes_model=False)]


def test_refusals_map_to_acp_codes() -> None:
    assert acp.error_for_status(401, "unauthorized", "no").code == acp.ErrorCode.AUTH_REQUIRED == -32000
    for status in (403, 404):  # another tenant's session: not found, never forbidden
        assert acp.error_for_status(status, "not_found", "no").code == acp.ErrorCode.RESOURCE_NOT_FOUND == -32002
    assert acp.error_for_status(422, "invalid", "no").code == acp.ErrorCode.INVALID_PARAMS
    assert acp.error_for_status(503, "unavailable", "no").code == acp.ErrorCode.INTERNAL_ERROR


def test_a_failed_task_for_want_of_a_login_is_auth_required() -> None:
    event = NormalizedEvent(seq=9, time=datetime.now(UTC), type=EventType.TASK_FAILED,
                            trace={"session_id": "s", "task_id": "t"}, runtime={"name": "claude"},
                            payload={"code": "AUTH_REQUIRED", "message": "log in"})
    with pytest.raises(AcpError) as refused:
        acp.prompt_result(event)
    assert refused.value.code == acp.ErrorCode.AUTH_REQUIRED


@st.composite
def questions(draw: st.DrawFn) -> NormalizedEvent:
    return NormalizedEvent(seq=draw(st.integers(1, 2**40)), time=datetime.now(UTC),
                           type=EventType.QUESTION_REQUESTED, trace={"session_id": "s", "task_id": "t"},
                           runtime={"name": "scripted"}, payload=draw(st.builds(QuestionRequested)))


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(questions())
def test_every_question_is_a_valid_form(event: NormalizedEvent) -> None:
    request = acp.elicitation_request("ses_x", event)
    assert not errors(ELICITATION, request)
    assert request["mode"] == "form"


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(questions(), json_values)
def test_a_forms_answer_reaches_the_runtime_only_when_it_fits(event: NormalizedEvent, answer: object) -> None:
    asked: tuple[Question, ...] = event.payload.questions  # type: ignore[attr-defined]
    reply = acp.reply_of(answer, asked)
    if not reply.decline:
        assert isinstance(answer, dict) and answer.get("action") == "accept"
        assert not answer_problems(asked, reply.answers)


def test_a_choice_is_a_closed_set_and_several_choices_an_array() -> None:
    one = Question(id="c", text="Which?", options=({"label": "red"}, {"label": "blue"}))  # type: ignore[arg-type]
    many = Question(id="m", options=({"label": "a"},), multi_select=True)  # type: ignore[arg-type]
    assert [o["const"] for o in acp.question_property(one)["oneOf"]] == ["red", "blue"]
    assert acp.question_property(many)["items"] == {"type": "string", "enum": ["a"]}
    assert acp.reply_of({"action": "accept", "content": {"c": "green"}}, [one]).decline
    assert acp.reply_of({"action": "accept", "content": {"c": "red"}}, [one]).answers == {"c": "red"}
    assert acp.reply_of({"action": "cancel"}, [one]).reason == "cancelled in the ACP client"


def test_locations_are_absolute_inside_the_workspace() -> None:
    assert acp.tool_locations({"path": "src/a.py"}, "/srv/ws") == [{"path": "/srv/ws/src/a.py"}]
    assert acp.tool_locations({"path": "src/a.py"}, None) == []  # relative to nothing known: not shown
    assert acp.tool_locations({"path": "/etc/x"}, "/srv/ws") == [{"path": "/etc/x"}]
    assert acp.tool_locations({"command": "ls"}, "/srv/ws") == []


@given(st.lists(st.text(max_size=30), max_size=5), st.lists(st.text(max_size=10), max_size=5))
def test_a_prompt_is_whole_where_the_transcript_has_it(texts: list[str], previews: list[str]) -> None:
    prompts = acp.PromptTexts(texts)
    for preview in previews:
        assert prompts.whole(preview).startswith(preview)


def test_prompts_are_matched_in_order() -> None:
    long = "x" * 300
    prompts = acp.PromptTexts(["first", long, long + " again"])
    assert [prompts.whole("first"), prompts.whole(long[:200]), prompts.whole(long[:200]), prompts.whole("gone")] == \
        ["first", long, long + " again", "gone"]
