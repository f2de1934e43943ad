"""Durable approvals over the API: pending, decided once, expiring to a denial, closed after a restart."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio

from codesdk import AsyncClient
from codesdk.testing.invariants import check_session
from codesdk.protocol import EventType, NormalizedEvent, RuntimeCapabilities

from tests.api.conftest import Api

#: The capabilities added for apps to feature-detect by (docs/protocol.md §3.1): each served, whatever its value.
MODELS_AN_APP_READS = ("auth_model", "tool_execution", "permission_model", "state_model", "resume_model",
                       "tool_replay", "mcp_support", "mcp_transports", "cancellation_model", "recommended_isolation",
                       "artifacts", "stop", "parallel_tool_calls", "session_resume", "usage_reporting",
                       "interaction_modes")


async def _pending(api: Api, token: str) -> list[dict[str, Any]]:
    while True:
        r = await api.client.get("/v1/approvals", headers=api.auth(token))
        assert r.status_code == 200, r.text
        if r.json()["approvals"]:
            return list(r.json()["approvals"])
        await trio.sleep(0.05)


async def _start(api: Api, token: str, session_id: str, scenario: str = "write-or-deny") -> dict[str, Any]:
    r = await api.client.post(f"/v1/sessions/{session_id}/tasks", headers=api.auth(token), json={
        "prompt": "write", "interaction_mode": "interactive", "runtime_config": {"scenario": scenario}})
    assert r.status_code == 202, r.text
    return dict(r.json())


async def _wait_done(api: Api, token: str, task_id: str) -> dict[str, Any]:
    while True:
        task = (await api.client.get(f"/v1/tasks/{task_id}", headers=api.auth(token))).json()
        if task["state"] not in ("pending", "running"):
            return dict(task)
        await trio.sleep(0.05)


async def test_approval_round_trip(api: Api) -> None:
    with trio.fail_after(30):
        session = await api.create_session(api.alice, "user:alice")
        task = await _start(api, api.alice, session["session_id"])
        [approval] = await _pending(api, api.alice)
        assert (approval["tool_name"], approval["tool_class"], approval["state"]) == ("workspace.write", "write",
                                                                                      "pending")
        assert approval["input"]["path"] == "notes.txt" and approval["task_id"] == task["task_id"]
        assert (await api.client.get("/v1/approvals", headers=api.auth(api.bob))).json()["approvals"] == []
        hidden = await api.client.post(f"/v1/approvals/{approval['approval_id']}", headers=api.auth(api.bob),
                                       json={"allow": True})
        assert hidden.status_code == 404
        r = await api.client.post(f"/v1/approvals/{approval['approval_id']}", headers=api.auth(api.alice),
                                  json={"allow": True, "reason": "looks fine"})
        assert r.status_code == 200 and r.json()["state"] == "approved"
        again = await api.client.post(f"/v1/approvals/{approval['approval_id']}", headers=api.auth(api.alice),
                                      json={"allow": False})
        assert again.status_code == 409
        done = await _wait_done(api, api.alice, task["task_id"])
        assert done["state"] == "completed"
        events = (await api.client.get(f"/v1/sessions/{session['session_id']}/events",
                                       headers=api.auth(api.alice))).json()["events"]
        user = [e for e in events if e["type"] == "tool.call.policy_evaluated" and e["payload"]["source"] == "user"]
        assert user and user[0]["payload"]["decision"] == "allow" and user[0]["payload"]["reason"] == "looks fine"
        assert any(e["type"] == "tool.call.completed" for e in events)


async def test_denial_reaches_the_runtime(api: Api) -> None:
    with trio.fail_after(30):
        session = await api.create_session(api.alice, "user:alice")
        task = await _start(api, api.alice, session["session_id"])
        [approval] = await _pending(api, api.alice)
        r = await api.client.post(f"/v1/approvals/{approval['approval_id']}", headers=api.auth(api.alice),
                                  json={"allow": False, "reason": "not in prod"})
        assert r.json()["state"] == "denied"
        await _wait_done(api, api.alice, task["task_id"])
        events = (await api.client.get(f"/v1/sessions/{session['session_id']}/events",
                                       headers=api.auth(api.alice))).json()["events"]
        texts = [e["payload"]["text"] for e in events if e["type"] == "model.output.completed"]
        assert texts[-1] == "Understood, I did not write the file: not in prod"


async def test_an_unanswered_approval_expires_to_a_recorded_denial(api: Api) -> None:
    api.engine.approvals.timeout_s = 0.3
    with trio.fail_after(30):
        session = await api.create_session(api.alice, "user:alice")
        task = await _start(api, api.alice, session["session_id"])
        done = await _wait_done(api, api.alice, task["task_id"])
        assert done["state"] == "completed"
        r = await api.client.get("/v1/approvals?state=expired", headers=api.auth(api.alice))
        [expired] = r.json()["approvals"]
        assert expired["decided_by"] == "codesdk" and "no decision within" in expired["decision_reason"]


async def test_stopping_a_task_closes_its_pending_approval(api: Api) -> None:
    with trio.fail_after(30):
        session = await api.create_session(api.alice, "user:alice")
        task = await _start(api, api.alice, session["session_id"])
        [approval] = await _pending(api, api.alice)
        await api.client.post(f"/v1/tasks/{task['task_id']}/stop", headers=api.auth(api.alice), json={})
        while True:
            state = (await api.client.get("/v1/approvals?state=all", headers=api.auth(api.alice))).json()
            if state["approvals"][0]["state"] != "pending":
                break
            await trio.sleep(0.05)
        assert state["approvals"][0]["approval_id"] == approval["approval_id"]
        assert state["approvals"][0]["state"] == "expired"
        assert state["approvals"][0]["decision_reason"] == "the task was stopped before a decision"


async def test_a_pending_approval_is_an_event_before_anyone_decides(api: Api) -> None:
    """A UI following the stream sees the ask (with the id to answer) first, then the decision naming it."""
    with trio.fail_after(30):
        session = await api.create_session(api.alice, "user:alice")
        await _start(api, api.alice, session["session_id"])
        [approval] = await _pending(api, api.alice)
        while True:  # listed as soon as it is opened; its event is stored right after (the stream's order is the point)
            events = (await api.client.get(f"/v1/sessions/{session['session_id']}/events",
                                           headers=api.auth(api.alice))).json()["events"]
            asked = [e for e in events if e["type"] == "approval.requested"]
            if asked:
                break
            await trio.sleep(0.05)
        assert [e["payload"]["approval_id"] for e in asked] == [approval["approval_id"]]
        payload = asked[0]["payload"]
        assert (payload["tool_name"], payload["tool_class"]) == ("workspace.write", "write")
        assert payload["expires_at"] == approval["expires_at"] and "notes.txt" in payload["input_preview"]
        before = [e["type"] for e in events if e["payload"].get("tool_call_id") == payload["tool_call_id"]]
        assert before == ["tool.call.requested", "tool.call.policy_evaluated", "approval.requested"]
        await api.client.post(f"/v1/approvals/{approval['approval_id']}", headers=api.auth(api.alice),
                              json={"allow": False, "reason": "no"})
        r = await api.client.get(f"/v1/sessions/{session['session_id']}/events/stream?until_terminal=true",
                                 headers=api.auth(api.alice))
        after = [e for e in r.text.split("\n") if e.startswith("data: ")]
        decided = [json.loads(line[6:]) for line in after]
        user = [e for e in decided if e["type"] == "tool.call.policy_evaluated" and e["payload"]["source"] == "user"]
        assert user[0]["payload"]["approval_id"] == approval["approval_id"]
        check_session([NormalizedEvent.model_validate(e) for e in decided])


async def test_the_client_answers_approvals_from_the_stream(api: Api) -> None:
    asked: list[str] = []

    async def approver(event: NormalizedEvent) -> tuple[bool, str]:
        asked.append(event.payload.tool_name)  # type: ignore[attr-defined]
        return True, "fine from the stream"

    with trio.fail_after(30):
        async with AsyncClient(socket=api.socket, token=api.alice) as client:
            session = await client.create_session(namespace="user:alice")
            events = [e async for e in client.run(session.session_id, "write", approver=approver,
                                                  runtime_config={"scenario": "write-or-deny"})]
            with pytest.raises(TypeError, match="not an approval.requested"):
                await client.answer(events[-1], allow=True)
    assert asked == ["workspace.write"] and events[-1].type == EventType.TASK_COMPLETED
    approved = [e.payload for e in events if e.type == EventType.TOOL_CALL_APPROVED]
    assert approved[0].reason == "fine from the stream" and approved[0].source == "user"  # type: ignore[attr-defined]



async def test_an_approval_decided_elsewhere_ends_the_prompt_and_the_run_goes_on(api: Api) -> None:
    """The person at ``run``'s approver never answers; someone decides over the API: the approver is cancelled and
    the run streams on to the task's end."""
    cancelled: list[bool] = []

    with trio.fail_after(60):
        async with AsyncClient(socket=api.socket, token=api.alice) as client, \
                AsyncClient(socket=api.socket, token=api.alice) as elsewhere:
            async def never_typing(event: NormalizedEvent) -> tuple[bool, str]:
                await elsewhere.answer(event, allow=True, reason="decided at the desk")
                try:
                    await trio.sleep_forever()
                finally:
                    cancelled.append(True)
                raise AssertionError("unreachable")

            session = await client.create_session(namespace="user:alice")
            events = [e async for e in client.run(session.session_id, "write", approver=never_typing,
                                                  runtime_config={"scenario": "write-or-deny"})]
    assert cancelled == [True] and events[-1].type == EventType.TASK_COMPLETED
    approved = [e.payload for e in events if e.type == EventType.TOOL_CALL_APPROVED]
    assert approved[0].reason == "decided at the desk"  # type: ignore[attr-defined]

async def test_runtimes_and_auth_status_per_namespace(api: Api) -> None:
    with trio.fail_after(30):
        r = await api.client.get("/v1/runtimes?namespace=user:alice", headers=api.auth(api.alice))
        assert r.status_code == 200
        names = {o["name"]: o for o in r.json()["runtimes"]}
        assert names["scripted"]["capabilities"]["parallel_tool_calls"] is True and "claude" in names
        # Every field an app feature-detects by is served for every runtime, as the worker declared it; the
        # clients hand back the same (protocol) model.
        offers = {o.name: o for o in await api.engine.runtimes("user:alice")}
        async with AsyncClient(socket=api.socket, token=api.alice) as client:
            typed = {o.name: o for o in await client.runtimes("user:alice")}
        for name, served in names.items():
            assert set(MODELS_AN_APP_READS) <= set(served["capabilities"]), name
            assert RuntimeCapabilities.model_validate(served["capabilities"]) == offers[name].capabilities
            assert typed[name].capabilities == offers[name].capabilities
        assert names["claude"]["capabilities"]["max_outstanding_tool_calls"] == 1
        hidden = await api.client.get("/v1/runtimes?namespace=user:alice", headers=api.auth(api.bob))
        assert hidden.status_code == 404
        auth = await api.client.get("/v1/namespaces/user:alice/auth/claude", headers=api.auth(api.alice))
        assert auth.status_code == 200 and auth.json()["logged_in"] is False
        assert "codesdk auth login --runtime claude --namespace user:alice" in auth.json()["instructions"]
        other = await api.client.get("/v1/namespaces/user:alice/auth/claude", headers=api.auth(api.bob))
        assert other.status_code == 404
        bad = await api.client.get("/v1/namespaces/user:alice/auth/nope", headers=api.auth(api.alice))
        assert bad.status_code == 404
