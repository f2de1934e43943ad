"""Approval routing with real webhooks: an endpoint that takes ``approval.requested`` in a namespace is someone who can
answer there (so ``--unattended deny`` waits instead of denying), it is sent the approval signed, and an endpoint
that takes ``approval.escalated`` (the second target) is sent the escalation once. A namespace with no such endpoint
and nobody following still gets the fallback at once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import trio
from standardwebhooks import Webhook

from codesdk.supervisor.engine import RoutingPolicy, Unattended

from tests.conftest import MakeEngine
from tests.waits import until
from tests.webhooks.conftest import Hooked, allowing, hooked_api, started
from tests.webhooks.receiver import Receiver

ALICE, BOB = "user:alice", "user:bob"


async def _start_write(api: Hooked, token: str, namespace: str) -> dict[str, Any]:
    """A task whose write needs an approval (interactive, the scripted ``write-or-deny``)."""
    r = await api.client.post("/v1/sessions", json={"namespace": namespace}, headers=api.auth(token))
    assert r.status_code == 201, r.text
    r = await api.client.post(f"/v1/sessions/{r.json()['session_id']}/tasks", headers=api.auth(token), json={
        "prompt": "a widget", "interaction_mode": "interactive", "runtime_config": {"scenario": "write-or-deny"}})
    assert r.status_code == 202, r.text
    return dict(r.json())


async def _ended(api: Hooked, token: str, task_id: str) -> dict[str, Any]:
    while (task := (await api.client.get(f"/v1/tasks/{task_id}", headers=api.auth(token))).json())["state"] not in (
            "completed", "failed", "stopped"):
        await trio.sleep(0.05)
    return dict(task)


def _payloads(receiver: Receiver, secret: str) -> list[dict[str, Any]]:
    """What the receiver got, each signature checked by the independent implementation."""
    for got in receiver.received:
        Webhook(secret).verify(got.body, got.headers)
    return [json.loads(got.body) for got in receiver.received]


async def test_a_registered_webhook_is_asked_and_the_escalation_reaches_the_second_target(
        make_engine: MakeEngine, tmp_path: Path, nursery: trio.Nursery) -> None:
    asked = await started(nursery, Receiver())
    on_call = await started(nursery, Receiver())
    policy = RoutingPolicy(Unattended.DENY, escalate_after_s=0.2, attach_grace_s=0.1)
    async with hooked_api(make_engine, tmp_path, allowing(asked, on_call), routing=policy) as api:
        with trio.fail_after(60):
            first = await api.register(api.alice, asked.url, ["approval.requested"])
            second = await api.register(api.alice, on_call.url, ["approval.escalated"])
            task = await _start_write(api, api.alice, ALICE)
            await until("the approval at the first target", lambda: asked.received)
            [requested] = _payloads(asked, first["secret"])
            assert requested["type"] == "approval.requested"
            approval_id = requested["data"]["event"]["payload"]["approval_id"]
            r = await api.client.get("/v1/approvals", headers=api.auth(api.alice))
            [pending] = r.json()["approvals"]  # not denied: the webhook is someone who can answer
            assert pending["approval_id"] == approval_id and pending["routing"]["webhook"] is True
            await until("the escalation at the second target", lambda: on_call.received)
            [escalated] = _payloads(on_call, second["secret"])
            assert escalated["type"] == "approval.escalated"
            assert escalated["data"]["event"]["payload"]["approval_id"] == approval_id
            r = await api.client.post(f"/v1/approvals/{approval_id}", headers=api.auth(api.alice),
                                      json={"allow": True})
            assert r.status_code == 200 and r.json()["state"] == "approved", r.text
            assert (await _ended(api, api.alice, task["task_id"]))["state"] == "completed"
            # once each: the first target was not sent the escalation, nor the second the request
            assert [p["type"] for p in _payloads(asked, first["secret"])] == ["approval.requested"]
            assert [p["type"] for p in _payloads(on_call, second["secret"])] == ["approval.escalated"]


async def test_another_namespace_s_webhook_answers_nothing_here(make_engine: MakeEngine, tmp_path: Path,
                                                                nursery: trio.Nursery) -> None:
    alice_s = await started(nursery, Receiver())
    policy = RoutingPolicy(Unattended.DENY, attach_grace_s=0.1)
    async with hooked_api(make_engine, tmp_path, allowing(alice_s), routing=policy) as api:
        with trio.fail_after(60):
            await api.register(api.alice, alice_s.url, ["approval.requested"])
            task = await _start_write(api, api.bob, BOB)
            assert (await _ended(api, api.bob, task["task_id"]))["state"] == "completed"
            r = await api.client.get("/v1/approvals?state=denied", headers=api.auth(api.bob))
            [denied] = r.json()["approvals"]
            assert "nobody could answer this approval" in denied["decision_reason"] and BOB in denied["decision_reason"]
            assert not alice_s.received  # bob's approval went to nobody of alice's
