"""Each question a runtime asked is answered exactly once, and nothing answers a question never asked; once its task
has ended, every question has its answer (``check_task`` / ``check_session``)."""

from __future__ import annotations

from typing import Any

import pytest

from codesdk.testing import InvariantError
from codesdk.testing.invariants import check_session

from tests.kit.test_invariants_calls import _log

_STARTED: list[tuple[str, dict[str, Any]]] = [
    ("task.started", {"task_id": "t"}),
    ("model.input", {"input_ref": "sha256:0", "input_hash": "sha256:0", "message_count": 1})]
_ASKED: tuple[str, dict[str, Any]] = ("question.requested", {
    "question_id": "qst_1", "source": "scripted", "questions": [{"id": "colour", "text": "Which colour?"}]})
_ANSWERED: tuple[str, dict[str, Any]] = ("question.answered", {
    "question_id": "qst_1", "answers": {"colour": "red"}, "answered_via": "user"})
_ENDED: tuple[str, dict[str, Any]] = ("task.completed", {})


def test_one_answer_per_question_passes_and_a_running_task_may_wait_for_one() -> None:
    check_session(_log(*_STARTED, _ASKED, _ANSWERED, _ENDED))
    check_session(_log(*_STARTED, _ASKED))


def test_a_second_answer_is_caught() -> None:
    with pytest.raises(InvariantError, match="answered 2 times"):
        check_session(_log(*_STARTED, _ASKED, _ANSWERED, _ANSWERED, _ENDED))


def test_an_answer_to_no_question_and_an_ended_task_with_one_open_are_caught() -> None:
    with pytest.raises(InvariantError, match="never asked before"):
        check_session(_log(*_STARTED, _ANSWERED, _ENDED))
    with pytest.raises(InvariantError, match="never answered, yet the task ended"):
        check_session(_log(*_STARTED, _ASKED, _ENDED))
