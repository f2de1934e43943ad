"""Grants in the invariants checker: a call decided by a grant names one created earlier in its session and not
revoked before, a task grant decides only its task, a revocation happens once; an edited input's hash follows."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from codesdk.protocol import NormalizedEvent, canonical_hash
from codesdk.testing import InvariantError
from codesdk.testing.invariants import check_session

_T0 = datetime(2026, 11, 29, tzinfo=UTC)
_INPUT = {"path": "a.txt", "content": "x"}
_EDITED = {"path": "b.txt", "content": "y"}
Body = tuple[str, dict[str, Any], str | None]  # type, payload, task id (None: the session's own)


def _log(*bodies: Body, forked_from: dict[str, Any] | None = None) -> list[NormalizedEvent]:
    created: dict[str, Any] = {"runtime": "scripted", "namespace": "default"}
    if forked_from is not None:
        created["forked_from"] = forked_from
    out = [NormalizedEvent.model_validate({"seq": 1, "time": _T0.isoformat(), "type": "session.created",
                                           "trace": {"session_id": "s"}, "runtime": {"name": "scripted"},
                                           "payload": created})]
    for seq, (event_type, payload, task) in enumerate(bodies, 2):
        trace = {"session_id": "s", **({"task_id": task} if task else {})}
        out.append(NormalizedEvent.model_validate({
            "seq": seq, "time": (_T0 + timedelta(seconds=seq)).isoformat(), "type": event_type, "trace": trace,
            "runtime": {"name": "scripted"}, "payload": payload}))
    return out


def _task(task: str, *calls: Body) -> list[Body]:
    return [("task.started", {"task_id": task}, task),
            ("model.input", {"input_ref": "sha256:0", "input_hash": "sha256:0", "message_count": 1}, task),
            *calls, ("task.completed", {}, task)]


def _call(task: str, call: str, grant_id: str, rule: str = "grant.session", tool: str = "workspace.write") -> list[Body]:
    ids = {"tool_call_id": call, "input_hash": canonical_hash(_INPUT)}
    return [("tool.call.requested", {**ids, "tool_name": tool, "input": _INPUT}, task),
            ("tool.call.policy_evaluated", {**ids, "source": "user", "decision": "allow", "rule": rule,
                                            "grant_id": grant_id}, task),
            ("tool.call.approved", {**ids, "source": "user"}, task)]


def _grant(task: str, grant_id: str = "g1", scope: str = "session") -> Body:
    return ("grant.created", {"grant_id": grant_id, "scope": scope, "tool_name": "workspace.write",
                              **({"task_id": task} if scope == "task" else {})}, task)


_REVOKE: Body = ("grant.revoked", {"grant_id": "g1", "revoked_by": "api:alice"}, None)


def test_a_live_grant_decides_and_a_revocation_between_tasks_is_the_sessions_own() -> None:
    check_session(_log(*_task("t1", _grant("t1"), *_call("t1", "c1", "g1")), _REVOKE,
                       *_task("t2")))


def test_a_call_decided_by_a_grant_never_created_or_revoked_before_is_caught() -> None:
    with pytest.raises(InvariantError, match="not created earlier"):
        check_session(_log(*_task("t1", *_call("t1", "c1", "g1"), _grant("t1"))))
    with pytest.raises(InvariantError, match="revoked before it"):
        check_session(_log(*_task("t1", _grant("t1")), _REVOKE, *_task("t2", *_call("t2", "c2", "g1"))))


def test_a_task_grant_decides_only_its_own_task() -> None:
    check_session(_log(*_task("t1", _grant("t1", scope="task"), *_call("t1", "c1", "g1", "grant.task"))))
    with pytest.raises(InvariantError, match="task grant"):
        check_session(_log(*_task("t1", _grant("t1", scope="task")),
                           *_task("t2", *_call("t2", "c2", "g1", "grant.task"))))


def test_a_grant_of_another_tool_and_a_second_revocation_are_caught() -> None:
    with pytest.raises(InvariantError, match="of tool 'workspace.write', not 'workspace.exec'"):
        check_session(_log(*_task("t1", _grant("t1"), *_call("t1", "c1", "g1", tool="workspace.exec"))))
    with pytest.raises(InvariantError, match="revoked twice"):
        check_session(_log(*_task("t1", _grant("t1")), _REVOKE, _REVOKE))


def test_a_forks_copied_grants_decide_nothing_in_it() -> None:
    copied = _log(*_task("t1", _grant("t1")), *_task("t2", *_call("t2", "c2", "g1")),
                  forked_from={"session_id": "p", "seq": 5})
    with pytest.raises(InvariantError, match="not created earlier"):
        check_session(copied)


def test_an_edited_input_s_hash_is_what_the_call_carries_after_the_answer() -> None:
    ids = {"tool_call_id": "c1", "input_hash": canonical_hash(_INPUT)}
    edited = canonical_hash(_EDITED)
    answer = ("tool.call.policy_evaluated", {**ids, "source": "user", "decision": "allow", "rule": "user.answer",
                                             "edited_input_hash": edited, "edited_input": _EDITED}, "t1")
    requested = ("tool.call.requested", {**ids, "tool_name": "workspace.write", "input": _INPUT}, "t1")
    follows = [("tool.call.approved", {**ids, "input_hash": edited, "source": "user"}, "t1"),
               ("tool.call.started", {**ids, "input_hash": edited, "tool_name": "workspace.write"}, "t1"),
               ("tool.call.completed", {**ids, "input_hash": edited, "tool_name": "workspace.write"}, "t1")]
    check_session(_log(*_task("t1", requested, answer, *follows)))  # type: ignore[arg-type]
    stale = ("tool.call.started", {**ids, "tool_name": "workspace.write"}, "t1")
    with pytest.raises(InvariantError, match="not the edited input's"):
        check_session(_log(*_task("t1", requested, answer, follows[0], stale, follows[2])))  # type: ignore[arg-type]
