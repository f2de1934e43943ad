"""Steering's rules in a session's stored events (``check_session``): an appended input lies inside its task, is
reported once, a queued one is stored with its task's end and carried, in order, by the next task's input."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from codesdk.protocol import NormalizedEvent
from codesdk.testing import InvariantError
from codesdk.testing.invariants import check_session

_T0 = datetime(2026, 11, 29, tzinfo=UTC)
Body = tuple[str, str, dict[str, Any]]


def _log(*bodies: Body) -> list[NormalizedEvent]:
    """session.created, then ``(task id, type, payload)`` events."""
    out = [NormalizedEvent.model_validate({"seq": 1, "time": _T0.isoformat(), "type": "session.created",
                                           "trace": {"session_id": "s"}, "runtime": {"name": "scripted"},
                                           "payload": {"runtime": "scripted", "namespace": "default"}})]
    for seq, (task, event_type, payload) in enumerate(bodies, 2):
        out.append(NormalizedEvent.model_validate({
            "seq": seq, "time": (_T0 + timedelta(seconds=seq)).isoformat(), "type": event_type,
            "trace": {"session_id": "s", "task_id": task}, "runtime": {"name": "scripted"}, "payload": payload}))
    return out


def _start(task: str, *carried: str) -> list[Body]:
    return [(task, "task.started", {"task_id": task}),
            (task, "model.input", {"input_ref": "sha256:0", "input_hash": "sha256:0", "message_count": 1,
                                   "carried_inputs": list(carried)})]


def _input(task: str, input_id: str, delivery: str = "mid_turn") -> Body:
    return (task, "model.input.appended", {"input_id": input_id, "text": "more", "input_hash": "sha256:1",
                                           "delivery": delivery})


def _end(task: str) -> Body:
    return (task, "task.completed", {})


def test_delivered_and_carried_inputs_pass() -> None:
    check_session(_log(*_start("t1"), _input("t1", "a"), _input("t1", "b", "queued"), _input("t1", "c", "queued"),
                       _end("t1"), *_start("t2", "b", "c"), _end("t2")))


def test_an_input_reported_twice_is_caught() -> None:
    with pytest.raises(InvariantError, match="'a' appended twice"):
        check_session(_log(*_start("t1"), _input("t1", "a"), _input("t1", "a"), _end("t1")))


def test_an_input_outside_its_task_is_caught() -> None:
    with pytest.raises(InvariantError, match="outside that task's lifetime"):
        check_session(_log(*_start("t1"), _end("t1"), _input("t1", "a")))


def test_a_queued_input_not_stored_with_its_tasks_end_is_caught() -> None:
    with pytest.raises(InvariantError, match="queued but not stored with its task's end"):
        check_session(_log(*_start("t1"), _input("t1", "a", "queued"),
                           ("t1", "model.output.completed", {"block_id": "b", "text": "x"}), _end("t1")))


def test_a_queued_input_the_next_task_does_not_carry_is_caught() -> None:
    with pytest.raises(InvariantError, match=r"carries inputs \[\], not \['a'\]"):
        check_session(_log(*_start("t1"), _input("t1", "a", "queued"), _end("t1"), *_start("t2"), _end("t2")))
