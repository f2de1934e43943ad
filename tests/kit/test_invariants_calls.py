"""The stored tool-call graph's end: a task that has ended leaves no call open — every ``tool.call.started`` has
exactly one ``tool.call.completed`` (``check_task`` / ``check_session``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from codesdk.protocol import NormalizedEvent, canonical_hash
from codesdk.testing import InvariantError
from codesdk.testing.invariants import check_session, check_task

_T0 = datetime(2026, 11, 28, tzinfo=UTC)
_CALL: dict[str, Any] = {"tool_call_id": "c1", "input_hash": canonical_hash({}), "tool_name": "workspace.exec"}


def _log(*bodies: tuple[str, dict[str, Any]]) -> list[NormalizedEvent]:
    """A session's stored events: session.created, then one task's ``bodies``."""
    out = [NormalizedEvent.model_validate({"seq": 1, "time": _T0.isoformat(), "type": "session.created",
                                           "trace": {"session_id": "s"}, "runtime": {"name": "scripted"},
                                           "payload": {"runtime": "scripted", "namespace": "default"}})]
    for seq, (event_type, payload) in enumerate(bodies, 2):
        out.append(NormalizedEvent.model_validate({
            "seq": seq, "time": (_T0 + timedelta(seconds=seq)).isoformat(), "type": event_type,
            "trace": {"session_id": "s", "task_id": "t"}, "runtime": {"name": "scripted"}, "payload": payload}))
    return out


_RAN: list[tuple[str, dict[str, Any]]] = [("task.started", {"task_id": "t"}),
        ("model.input", {"input_ref": "sha256:0", "input_hash": "sha256:0", "message_count": 1}),
        ("tool.call.requested", _CALL), ("tool.call.approved", {"tool_call_id": "c1", "input_hash": _CALL["input_hash"], "source": "codesdk"}),
        ("tool.call.started", _CALL)]
_DONE: tuple[str, dict[str, Any]] = ("tool.call.completed", {**_CALL, "is_error": True, "cut_short": "cancelled"})
_STOPPED: tuple[str, dict[str, Any]] = ("task.stopped", {"reason": "enough"})


def test_an_ended_task_that_leaves_a_started_call_open_is_caught() -> None:
    with pytest.raises(InvariantError, match=r"tool call 'c1' \(attempt 1\) started and never completed"):
        check_session(_log(*_RAN, _STOPPED))
    with pytest.raises(InvariantError, match="never completed"):
        check_task(_log(*_RAN, _STOPPED)[1:])


def test_a_call_completed_twice_is_caught() -> None:
    with pytest.raises(InvariantError, match=r"completed 2 times"):
        check_session(_log(*_RAN, _DONE, _DONE, _STOPPED))


def test_a_call_ended_with_its_task_passes_and_a_running_task_may_have_one_open() -> None:
    check_session(_log(*_RAN, _DONE, _STOPPED))
    check_session(_log(*_RAN))  # still running: its call may still be running too
