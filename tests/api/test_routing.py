"""Approval routing through the service (scripted runtime): a request nobody can answer gets the operator's fallback
at once — denied with the reason, or a shorter wait — while one a client follows (or a webhook takes) waits for its
decision; a request still pending after ``escalate_after_s`` is escalated exactly once."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import trio

from codesdk import AsyncClient
from codesdk.protocol import NormalizedEvent
from codesdk.protocol.api import Routing
from codesdk.supervisor.cli.decisions import cmd_approvals, routing_note
from codesdk.supervisor.cli.front import build_parser
from codesdk.supervisor.engine import APPROVAL_KIND, QuestionPolicy, RoutingPolicy, Unattended
from codesdk.testing.invariants import check_session

from tests.api.conftest import Api, serve_test_api
from tests.conftest import MakeEngine
from tests.waits import until

ALICE = "user:alice"


@asynccontextmanager
async def _served(make_engine: MakeEngine, tmp_path: Path, policy: RoutingPolicy) -> AsyncIterator[Api]:
    async with serve_test_api(make_engine, tmp_path, routing=policy) as api:
        yield api


async def _start(api: Api, session_id: str, scenario: str = "write-or-deny") -> dict[str, Any]:
    r = await api.client.post(f"/v1/sessions/{session_id}/tasks", headers=api.auth(api.alice), json={
        "prompt": "a widget", "interaction_mode": "interactive", "runtime_config": {"scenario": scenario}})
    assert r.status_code == 202, r.text
    return dict(r.json())


async def _listed(api: Api, what: str, state: str = "pending") -> list[dict[str, Any]]:
    """The approvals or questions in ``state``, once there is one."""
    while not (rows := (await api.client.get(f"/v1/{what}?state={state}",
                                             headers=api.auth(api.alice))).json()[what]):
        await trio.sleep(0.05)
    return list(rows)


async def _given_whole_timeout(api: Api, what: str, opened: datetime, seconds: float) -> dict[str, Any]:
    """The one pending approval or question once the wait has seen someone who can answer: no fallback in its
    routing and its stored deadline moved to ``seconds`` after it opened (the two are read one by one)."""
    while True:
        [now] = await _listed(api, what)
        if "fallback" not in now["routing"] and \
                datetime.fromisoformat(now["expires_at"]) - opened == timedelta(seconds=seconds):
            return now
        await trio.sleep(0.05)


async def _events(api: Api, session_id: str) -> list[dict[str, Any]]:
    r = await api.client.get(f"/v1/sessions/{session_id}/events", headers=api.auth(api.alice))
    events = list(r.json()["events"])
    check_session([NormalizedEvent.model_validate(e) for e in events])
    return events


@asynccontextmanager
async def _following(api: Api, session_id: str) -> AsyncIterator[None]:
    """A client following the session's events over the API for the block (counted by the service once open)."""
    async with trio.open_nursery() as nursery:
        async def follow(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            async with api.client.stream("GET", f"/v1/sessions/{session_id}/events/stream",
                                         headers=api.auth(api.alice)) as response:
                assert response.status_code == 200
                task_status.started()
                async for _ in response.aiter_lines():
                    pass

        await nursery.start(follow)
        await until("the stream to be counted", lambda: api.engine.audience.streams(ALICE) == 1)
        yield
        nursery.cancel_scope.cancel()


async def test_nobody_following_denies_at_once_with_the_reason(make_engine: MakeEngine, tmp_path: Path) -> None:
    policy = RoutingPolicy(Unattended.DENY, attach_grace_s=0.1)
    async with _served(make_engine, tmp_path, policy) as api:
        with trio.fail_after(60):
            session = await api.create_session(api.alice, ALICE)
            task = await _start(api, session["session_id"])
            assert (await api.ended(api.alice, task["task_id"]))["state"] == "completed"
            [denied] = await _listed(api, "approvals", "denied")
            assert denied["decided_by"] == "codesdk" and "routing" not in denied
            reason = denied["decision_reason"]
            assert "nobody could answer this approval" in reason and ALICE in reason
            assert "register a webhook for approval.requested" in reason
            events = await _events(api, session["session_id"])
            [refused] = [e for e in events if e["type"] == "tool.call.denied"]
            # recorded as unanswered (the policy's reason, "but" nobody could answer), not as an approver's failure
            assert refused["payload"]["reason"] == f"permission mode 'ask' needs approval for write tools, but {reason}"
            said = [e["payload"]["text"] for e in events if e["type"] == "model.output.completed"]
            assert said[-1] == f"Understood, I did not write the file: {refused['payload']['reason']}"


async def test_nobody_following_waits_only_the_shorter_deadline(make_engine: MakeEngine, tmp_path: Path) -> None:
    policy = RoutingPolicy(Unattended.WAIT, unattended_wait_s=1.0, attach_grace_s=0.1)
    async with _served(make_engine, tmp_path, policy) as api:
        with trio.fail_after(60):
            session = await api.create_session(api.alice, ALICE)
            task = await _start(api, session["session_id"])
            [pending] = await _listed(api, "approvals")
            routing = pending["routing"]
            assert (routing["answerable"], routing["streams"], routing["webhook"], routing["fallback"]) == \
                (False, 0, False, "wait")
            waits = datetime.fromisoformat(pending["expires_at"]) - datetime.fromisoformat(pending["created_at"])
            assert waits.total_seconds() == 1.0  # the fallback's deadline, not the approval timeout's 900 s
            assert (await api.ended(api.alice, task["task_id"]))["state"] == "completed"
            [expired] = await _listed(api, "approvals", "expired")
            assert expired["decision_reason"].startswith("no decision within 1 s (nobody could answer")
            assert expired["expires_at"] == pending["expires_at"]  # nobody came: the shorter deadline held
            await _events(api, session["session_id"])


async def test_a_followed_namespace_waits_and_a_decision_completes_the_task(make_engine: MakeEngine,
                                                                           tmp_path: Path) -> None:
    policy = RoutingPolicy(Unattended.DENY, attach_grace_s=0.1)
    async with _served(make_engine, tmp_path, policy) as api:
        with trio.fail_after(60):
            session = await api.create_session(api.alice, ALICE)
            async with _following(api, session["session_id"]):
                task = await _start(api, session["session_id"])
                [pending] = await _listed(api, "approvals")
                assert pending["routing"] == {"answerable": True, "streams": 1, "consoles": 0, "webhook": False}
                r = await api.client.post(f"/v1/approvals/{pending['approval_id']}", headers=api.auth(api.alice),
                                          json={"allow": True})
                assert r.status_code == 200 and r.json()["state"] == "approved", r.text
                assert (await api.ended(api.alice, task["task_id"]))["state"] == "completed"
            await until("the closed stream to be let go", lambda: api.engine.audience.streams(ALICE) == 0)
            events = await _events(api, session["session_id"])
            assert any(e["type"] == "tool.call.completed" for e in events)


async def test_a_pending_approval_is_escalated_exactly_once(make_engine: MakeEngine, tmp_path: Path) -> None:
    policy = RoutingPolicy(Unattended.DENY, escalate_after_s=0.2, attach_grace_s=0.1)
    async with _served(make_engine, tmp_path, policy) as api:
        with trio.fail_after(60):
            session = await api.create_session(api.alice, ALICE)
            async with _following(api, session["session_id"]):
                task = await _start(api, session["session_id"])
                [pending] = await _listed(api, "approvals")
                escalates = datetime.fromisoformat(pending["routing"]["escalates_at"])
                assert (escalates - datetime.fromisoformat(pending["created_at"])).total_seconds() == 0.2
                while not [e for e in await _events(api, session["session_id"]) if e["type"] == "approval.escalated"]:
                    await trio.sleep(0.05)
                await api.client.post(f"/v1/approvals/{pending['approval_id']}", headers=api.auth(api.alice),
                                      json={"allow": False, "reason": "not today"})
                await api.ended(api.alice, task["task_id"])
            events = await _events(api, session["session_id"])
            [escalated] = [e for e in events if e["type"] == "approval.escalated"]
            assert escalated["payload"]["approval_id"] == pending["approval_id"]
            assert escalated["payload"]["tool_name"] == "workspace.write"
            assert escalated["payload"]["pending_s"] >= 0.2
            assert escalated["trace"]["task_id"] == task["task_id"]


async def test_a_webhook_taking_the_kind_counts_as_someone(make_engine: MakeEngine, tmp_path: Path) -> None:
    asked: list[tuple[str, str]] = []

    def webhooks(namespace: str, kind: str) -> bool:
        asked.append((namespace, kind))
        return namespace == ALICE and kind == APPROVAL_KIND

    async with _served(make_engine, tmp_path, RoutingPolicy(Unattended.DENY, attach_grace_s=0.1)) as api:
        api.engine.audience.webhooks = webhooks
        with trio.fail_after(60):
            session = await api.create_session(api.alice, ALICE)
            task = await _start(api, session["session_id"])
            [pending] = await _listed(api, "approvals")
            assert pending["routing"] == {"answerable": True, "streams": 0, "consoles": 0, "webhook": True}
            assert (ALICE, APPROVAL_KIND) in asked
            async with AsyncClient(socket=api.socket, token=api.alice) as client:  # the typed answer has it too
                [typed] = await client.approvals()
            assert typed.routing is not None and typed.routing.webhook and typed.routing.fallback is None
            await api.client.post(f"/v1/approvals/{pending['approval_id']}", headers=api.auth(api.alice),
                                  json={"allow": True})
            assert (await api.ended(api.alice, task["task_id"]))["state"] == "completed"


async def test_a_question_nobody_can_answer_is_declined_at_once(make_engine: MakeEngine, tmp_path: Path) -> None:
    async with _served(make_engine, tmp_path, RoutingPolicy(Unattended.DENY, attach_grace_s=0.1)) as api:
        with trio.fail_after(60):
            session = await api.create_session(api.alice, ALICE)
            task = await _start(api, session["session_id"], "ask-user")
            await api.ended(api.alice, task["task_id"])
            [declined] = await _listed(api, "questions", "declined")
            assert declined["answered_via"] == "fallback" and declined["answered_by"] == "codesdk"
            assert "nobody could answer this question" in declined["reason"]
            assert "register a webhook for question.requested" in declined["reason"]
            events = await _events(api, session["session_id"])
            [answered] = [e for e in events if e["type"] == "question.answered"]
            assert answered["payload"]["declined"] and answered["payload"]["reason"] == declined["reason"]


async def test_a_pending_question_is_escalated_once_then_answered(make_engine: MakeEngine, tmp_path: Path) -> None:
    policy = RoutingPolicy(Unattended.DENY, escalate_after_s=0.2, attach_grace_s=0.1)
    async with _served(make_engine, tmp_path, policy) as api:
        with trio.fail_after(60):
            session = await api.create_session(api.alice, ALICE)
            async with _following(api, session["session_id"]):
                task = await _start(api, session["session_id"], "ask-user")
                [pending] = await _listed(api, "questions")
                assert pending["routing"]["answerable"] and pending["routing"]["escalates_at"]
                while not [e for e in await _events(api, session["session_id"]) if e["type"] == "question.escalated"]:
                    await trio.sleep(0.05)
                r = await api.client.post(f"/v1/questions/{pending['question_id']}", headers=api.auth(api.alice),
                                          json={"answers": {"colour": "red", "name": "Widget"}})
                assert r.status_code == 200, r.text
                assert (await api.ended(api.alice, task["task_id"]))["state"] == "completed"
            events = await _events(api, session["session_id"])
            [escalated] = [e for e in events if e["type"] == "question.escalated"]
            assert escalated["payload"]["question_id"] == pending["question_id"]
            said = [e["payload"]["text"] for e in events if e["type"] == "model.output.completed"]
            assert said[-1] == "Colour red, name Widget."


async def test_codesdk_approvals_says_who_could_answer(make_engine: MakeEngine, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    policy = RoutingPolicy(Unattended.WAIT, unattended_wait_s=600, escalate_after_s=300, attach_grace_s=0.1)
    async with _served(make_engine, tmp_path, policy) as api:
        with trio.fail_after(60):
            session = await api.create_session(api.alice, ALICE)
            task = await _start(api, session["session_id"])
            [pending] = await _listed(api, "approvals")
            url = ["--url", f"unix:{api.socket}", "--token", api.alice]
            assert await cmd_approvals(build_parser().parse_args(["approvals", *url])) == 0
            line = capsys.readouterr().out
            expires = datetime.fromisoformat(pending["expires_at"]).strftime("%H:%M:%SZ")
            escalates = datetime.fromisoformat(pending["routing"]["escalates_at"]).strftime("%H:%M:%SZ")
            assert line.startswith(pending["approval_id"])
            assert (f"[nobody can answer: attach a client (an event stream of the namespace, or the console) or "
                    f"register a webhook; "
                    f"fallback wait, expires {expires}; escalates {escalates}]") in line
            await api.client.post(f"/v1/tasks/{task['task_id']}/stop", headers=api.auth(api.alice), json={})
            await api.ended(api.alice, task["task_id"])


async def test_someone_attaching_late_gives_the_request_its_whole_timeout(make_engine: MakeEngine,
                                                                          tmp_path: Path) -> None:
    policy = RoutingPolicy(Unattended.WAIT, unattended_wait_s=3.0, escalate_after_s=4.0, attach_grace_s=0.1)
    async with _served(make_engine, tmp_path, policy) as api:
        api.engine.approvals.timeout_s = 6.0
        with trio.fail_after(60):
            session = await api.create_session(api.alice, ALICE)
            task = await _start(api, session["session_id"])
            [pending] = await _listed(api, "approvals")
            assert pending["routing"]["fallback"] == "wait"  # nobody when it opened: the shorter deadline
            opened = datetime.fromisoformat(pending["created_at"])
            assert datetime.fromisoformat(pending["expires_at"]) - opened == timedelta(seconds=3)
            async with _following(api, session["session_id"]):
                now = await _given_whole_timeout(api, "approvals", opened, 6)
                assert now["routing"]["answerable"] and now["routing"]["streams"] == 1
                assert datetime.fromisoformat(now["expires_at"]) - opened == timedelta(seconds=6)  # stored too
                assert (await api.ended(api.alice, task["task_id"]))["state"] == "completed"
            [expired] = await _listed(api, "approvals", "expired")
            assert expired["decision_reason"] == "no decision within 6 s"  # someone could: the whole timeout
            assert datetime.fromisoformat(expired["expires_at"]) - opened == timedelta(seconds=6)
            events = await _events(api, session["session_id"])
            # escalated once, by the whole timeout's route (the shorter one ended before it was due), saying so
            [escalated] = [e for e in events if e["type"] == "approval.escalated"]
            assert escalated["payload"]["expires_at"] == expired["expires_at"]


async def test_a_console_polling_counts_for_every_namespace_of_its_admin(make_engine: MakeEngine,
                                                                        tmp_path: Path) -> None:
    policy = RoutingPolicy(Unattended.DENY, attach_grace_s=0.1)
    async with _served(make_engine, tmp_path, policy) as api:
        with trio.fail_after(60):
            login = await api.client.post("/console/session", json={"token": api.admin})
            assert login.status_code == 201, login.text
            csrf = login.json()["csrf_token"]
            polled = await api.client.get("/v1/approvals")  # the console's poll, by its cookie alone
            assert polled.status_code == 200
            assert api.engine.audience.consoles(ALICE) == api.engine.audience.consoles("user:bob") == 1
            session = await api.create_session(api.alice, ALICE)
            task = await _start(api, session["session_id"])
            [pending] = await _listed(api, "approvals")
            assert pending["state"] == "pending"  # not denied: the admin's console is open
            assert pending["routing"] == {"answerable": True, "streams": 0, "consoles": 1, "webhook": False}
            r = await api.client.post(f"/v1/approvals/{pending['approval_id']}", json={"allow": True},
                                      headers={"X-CSRF-Token": csrf})
            assert r.status_code == 200 and r.json()["state"] == "approved", r.text
            assert (await api.ended(api.alice, task["task_id"]))["state"] == "completed"
            assert (await api.client.delete("/console/session", headers={"X-CSRF-Token": csrf})).status_code == 204
            assert api.engine.audience.consoles(ALICE) == 0  # logged out: nobody


async def test_a_tenants_console_counts_only_for_its_namespace(make_engine: MakeEngine, tmp_path: Path) -> None:
    async with _served(make_engine, tmp_path, RoutingPolicy(Unattended.DENY)) as api:
        login = await api.client.post("/console/session", json={"token": api.bob})
        assert login.status_code == 201, login.text
        assert api.engine.audience.consoles("user:bob") == 1 and api.engine.audience.consoles(ALICE) == 0
        assert not api.engine.audience.reachable(ALICE, APPROVAL_KIND)
        api.tokens.revoke("bob")
        assert api.engine.audience.consoles("user:bob") == 0  # its token revoked: its console is nobody


def test_the_cli_says_escalated_once_it_was() -> None:
    at = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    routing = Routing(answerable=True, streams=1, escalates_at=at)
    assert routing_note(routing, at, now=at - timedelta(seconds=1)).endswith("; escalates 03:04:05Z]")
    assert routing_note(routing, at, now=at).endswith("; escalated 03:04:05Z]")
    assert "1 console(s) open" in routing_note(Routing(answerable=True, consoles=1), at, now=at)


async def test_a_question_someone_can_answer_later_gets_its_whole_timeout(make_engine: MakeEngine,
                                                                          tmp_path: Path) -> None:
    policy = RoutingPolicy(Unattended.WAIT, unattended_wait_s=3.0, attach_grace_s=0.1)
    async with _served(make_engine, tmp_path, policy) as api:
        api.engine.questions.policy = QuestionPolicy(timeout_s=60)
        with trio.fail_after(60):
            session = await api.create_session(api.alice, ALICE)
            task = await _start(api, session["session_id"], "ask-user")
            [pending] = await _listed(api, "questions")
            assert pending["routing"]["fallback"] == "wait"
            opened = datetime.fromisoformat(pending["created_at"])
            async with _following(api, session["session_id"]):
                now = await _given_whole_timeout(api, "questions", opened, 60)
                assert datetime.fromisoformat(now["expires_at"]) - opened == timedelta(seconds=60)
                await trio.sleep(3.5)  # past the shorter deadline: the question is still pending
                [still] = await _listed(api, "questions")
                assert still["question_id"] == pending["question_id"]
                r = await api.client.post(f"/v1/questions/{pending['question_id']}", headers=api.auth(api.alice),
                                          json={"answers": {"colour": "red", "name": "Widget"}})
                assert r.status_code == 200, r.text
                assert (await api.ended(api.alice, task["task_id"]))["state"] == "completed"
