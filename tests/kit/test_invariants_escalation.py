"""An approval or question is escalated at most once, and only while it is pending: after it was asked, before its
decision or answer (``check_session``)."""

from __future__ import annotations

from typing import Any

import pytest

from codesdk.testing import InvariantError
from codesdk.testing.invariants import check_session

from tests.kit.test_invariants_calls import _CALL, _log

_STARTED: list[tuple[str, dict[str, Any]]] = [
    ("task.started", {"task_id": "t"}),
    ("model.input", {"input_ref": "sha256:0", "input_hash": "sha256:0", "message_count": 1})]
_IDS = {"tool_call_id": "c1", "input_hash": _CALL["input_hash"]}
_REQUESTED = ("tool.call.requested", _CALL)
_ASKED_APPROVAL = ("approval.requested", {**_IDS, "approval_id": "apr_1", "tool_name": "workspace.exec",
                                          "tool_class": "dangerous", "reason": "ask", "expires_at": "2026-11-28T01:00:00Z"})
_APPROVAL_ESCALATED = ("approval.escalated", {"approval_id": "apr_1", "tool_call_id": "c1",
                                              "tool_name": "workspace.exec", "pending_s": 30,
                                              "expires_at": "2026-11-28T01:00:00Z"})
_DENIED = ("tool.call.denied", {**_IDS, "source": "user", "reason": "no"})
_ASKED_QUESTION = ("question.requested", {"question_id": "qst_1", "source": "scripted",
                                          "questions": [{"id": "colour", "text": "Which colour?"}]})
_QUESTION_ESCALATED = ("question.escalated", {"question_id": "qst_1", "pending_s": 30,
                                              "expires_at": "2026-11-28T01:00:00Z"})
_ANSWERED = ("question.answered", {"question_id": "qst_1", "answers": {"colour": "red"}, "answered_via": "user"})
_ENDED: tuple[str, dict[str, Any]] = ("task.completed", {})


def test_one_escalation_while_pending_passes() -> None:
    check_session(_log(*_STARTED, _REQUESTED, _ASKED_APPROVAL, _APPROVAL_ESCALATED, _DENIED, _ENDED))
    check_session(_log(*_STARTED, _ASKED_QUESTION, _QUESTION_ESCALATED, _ANSWERED, _ENDED))


@pytest.mark.parametrize(("bodies", "broken"), [
    ([_REQUESTED, _ASKED_APPROVAL, _APPROVAL_ESCALATED, _APPROVAL_ESCALATED, _DENIED], "escalated again"),
    ([_REQUESTED, _ASKED_APPROVAL, _DENIED, _APPROVAL_ESCALATED], "already settled"),
    ([_APPROVAL_ESCALATED], "no such approval was asked"),
    ([_ASKED_QUESTION, _QUESTION_ESCALATED, _QUESTION_ESCALATED, _ANSWERED], "escalated again"),
    ([_ASKED_QUESTION, _ANSWERED, _QUESTION_ESCALATED], "already settled"),
    ([_QUESTION_ESCALATED], "no such question was asked"),
], ids=["approval-twice", "approval-after-decision", "approval-never-asked", "question-twice",
        "question-after-answer", "question-never-asked"])
def test_a_second_late_or_unasked_escalation_is_caught(bodies: list[tuple[str, dict[str, Any]]], broken: str) -> None:
    with pytest.raises(InvariantError, match=broken):
        check_session(_log(*_STARTED, *bodies, _ENDED))
