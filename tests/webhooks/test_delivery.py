"""Deliveries end to end: an event committed, sent signed to a receiver on 127.0.0.1, retried with the same id,
and a dead endpoint that holds only its own slots."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio
from standardwebhooks import Webhook, WebhookVerificationError

from tests.conftest import MakeEngine
from tests.waits import until
from tests.webhooks.conftest import allowing, hooked_api, started
from tests.webhooks.receiver import Receiver


async def test_a_task_s_end_is_delivered_signed(make_engine: MakeEngine, tmp_path: Path, nursery: trio.Nursery,
                                                store_options: dict[str, Any]) -> None:
    receiver = await started(nursery, Receiver())
    async with hooked_api(make_engine, tmp_path, allowing(receiver), **store_options) as api:
        created = await api.register(api.alice, receiver.url, ["task.completed"])
        webhook, secret = created["webhook"], created["secret"]
        assert webhook["namespace"] == "user:alice" and secret.startswith("whsec_")
        task = await api.run_task(api.alice, "user:alice")
        await until("the delivery", lambda: receiver.received)
        [got] = receiver.received
        Webhook(secret).verify(got.body, got.headers)  # the independent implementation
        payload = json.loads(got.body)
        assert payload["type"] == "task.completed"
        assert payload["data"]["session_id"] == task["session_id"]
        assert payload["data"]["event"]["type"] == "task.completed"
        listed = (await api.client.get(f"/v1/webhooks/{webhook['id']}/deliveries", headers=api.auth(api.alice))
                  ).json()["deliveries"]
        assert [d["id"] for d in listed] == [got.headers["webhook-id"]]
        done = await api.delivered(api.alice, webhook["id"], listed[0]["id"])
        assert done["state"] == "delivered" and [a["status"] for a in done["attempts"]] == [204]
        assert api.service.accepts("user:alice", "task.completed")
        assert not api.service.accepts("user:bob", "task.completed")


async def test_three_failures_then_success_is_one_delivery_with_one_id(
        make_engine: MakeEngine, tmp_path: Path, nursery: trio.Nursery, store_options: dict[str, Any]) -> None:
    receiver = await started(nursery, Receiver(answer=lambda n: 500 if n <= 3 else 200))
    async with hooked_api(make_engine, tmp_path, allowing(receiver), **store_options) as api:
        webhook = (await api.register(api.admin, receiver.url, ["*"]))["webhook"]
        r = await api.client.post(f"/v1/webhooks/{webhook['id']}/test", headers=api.auth(api.admin))
        assert r.status_code == 202, r.text
        delivery = r.json()["delivery"]
        done = await api.delivered(api.admin, webhook["id"], delivery["id"])
    assert done["state"] == "delivered"
    assert [a["status"] for a in done["attempts"]] == [500, 500, 500, 200]
    assert [got.headers["webhook-id"] for got in receiver.received] == [delivery["id"]] * 4
    assert {got.body for got in receiver.received} == {receiver.received[0].body}  # the same message each time
    assert json.loads(receiver.received[0].body)["type"] == "webhook.test"


async def test_a_delivery_is_dead_after_its_attempts_and_can_be_redelivered(
        make_engine: MakeEngine, tmp_path: Path, nursery: trio.Nursery) -> None:
    failing = True
    receiver = await started(nursery, Receiver(answer=lambda n: 503 if failing else 200))
    async with hooked_api(make_engine, tmp_path, allowing(receiver, max_attempts=2)) as api:
        webhook = (await api.register(api.alice, receiver.url, ["task.failed"]))["webhook"]
        delivery = (await api.client.post(f"/v1/webhooks/{webhook['id']}/test", headers=api.auth(api.alice))
                    ).json()["delivery"]
        dead = await api.delivered(api.alice, webhook["id"], delivery["id"])
        assert dead["state"] == "dead" and len(dead["attempts"]) == 2 and "HTTP 503" in dead["last_error"]
        listed = await api.client.get(f"/v1/webhooks/{webhook['id']}/deliveries?state=dead",
                                      headers=api.auth(api.alice))
        assert [d["id"] for d in listed.json()["deliveries"]] == [delivery["id"]]
        failing = False
        r = await api.client.post(f"/v1/webhooks/{webhook['id']}/deliveries/{delivery['id']}/redeliver",
                                  headers=api.auth(api.alice))
        assert r.status_code == 202 and r.json()["delivery"]["state"] == "pending"
        done = await api.delivered(api.alice, webhook["id"], delivery["id"])
    assert done["state"] == "delivered" and len(done["attempts"]) == 3
    assert {got.headers["webhook-id"] for got in receiver.received} == {delivery["id"]}


async def test_a_rotated_secret_signs_beside_the_new_one(make_engine: MakeEngine, tmp_path: Path,
                                                         nursery: trio.Nursery) -> None:
    receiver = await started(nursery, Receiver())
    async with hooked_api(make_engine, tmp_path, allowing(receiver)) as api:
        created = await api.register(api.alice, receiver.url, ["*"])
        webhook_id = created["webhook"]["id"]
        r = await api.client.post(f"/v1/webhooks/{webhook_id}/rotate", headers=api.auth(api.alice))
        assert r.status_code == 200, r.text
        rotated = r.json()
        assert rotated["secret"] != created["secret"] and rotated["previous_valid_until"]
        delivery = (await api.client.post(f"/v1/webhooks/{webhook_id}/test", headers=api.auth(api.alice))
                    ).json()["delivery"]
        await api.delivered(api.alice, webhook_id, delivery["id"])
    [got] = receiver.received
    assert len(got.headers["webhook-signature"].split(" ")) == 2
    for secret in (created["secret"], rotated["secret"]):
        Webhook(secret).verify(got.body, got.headers)


async def test_a_dead_endpoint_does_not_hold_up_another_tenant(make_engine: MakeEngine, tmp_path: Path,
                                                               nursery: trio.Nursery) -> None:
    """Bob's endpoint accepts every request and never answers; while it holds every slot it may have, Alice's task
    runs to its end and her endpoint gets its delivery."""
    dead = await started(nursery, Receiver(answer=lambda n: None))
    alive = await started(nursery, Receiver())
    options = allowing(dead, alive, timeout_s=3600, per_endpoint=2)
    async with hooked_api(make_engine, tmp_path, options) as api:
        bobs = (await api.register(api.bob, dead.url, ["*"]))["webhook"]
        alices = (await api.register(api.alice, alive.url, ["task.completed"]))["webhook"]
        for _ in range(5):
            r = await api.client.post(f"/v1/webhooks/{bobs['id']}/test", headers=api.auth(api.bob))
            assert r.status_code == 202
        await until("bob's endpoint to hold every slot it may", lambda: dead.holding == options.per_endpoint)
        bob_task = await api.run_task(api.bob, "user:bob")
        alice_task = await api.run_task(api.alice, "user:alice")
        await until("alice's delivery", lambda: alive.received)
        for token, task in ((api.alice, alice_task), (api.bob, bob_task)):
            r = await api.client.get(f"/v1/tasks/{task['task_id']}", headers=api.auth(token))
            while r.json()["state"] in ("pending", "running"):
                await trio.sleep(0.05)
                r = await api.client.get(f"/v1/tasks/{task['task_id']}", headers=api.auth(token))
            assert r.json()["state"] == "completed"  # the event path went on: bob's own task too
        # bob's endpoint still holds its first requests, none answered, and got no more than its slots
        assert dead.holding == options.per_endpoint and len(dead.received) == options.per_endpoint
        [got] = alive.received
        assert json.loads(got.body)["data"]["task_id"] == alice_task["task_id"]
        pending = (await api.client.get(f"/v1/webhooks/{bobs['id']}/deliveries?state=pending",
                                        headers=api.auth(api.bob))).json()["deliveries"]
        assert len(pending) == 6 and all(d["attempts"] == 0 for d in pending)  # 5 test-sends + bob's task's end
        assert alices["namespace"] == "user:alice"


async def test_a_rotation_while_one_overlaps_is_refused_unless_it_ends_that_overlap(
        make_engine: MakeEngine, tmp_path: Path, nursery: trio.Nursery, store_options: dict[str, Any]) -> None:
    """No secret that still signs is dropped silently: a second rotation within the overlap is 409, saying how to
    end that overlap; ending it stops exactly the secret rotated out first. At most two secrets sign."""
    receiver = await started(nursery, Receiver())
    async with hooked_api(make_engine, tmp_path, allowing(receiver), **store_options) as api:
        created = await api.register(api.alice, receiver.url, ["*"])
        webhook_id = created["webhook"]["id"]
        rotate = f"/v1/webhooks/{webhook_id}/rotate"
        first = (await api.client.post(rotate, headers=api.auth(api.alice))).json()
        r = await api.client.post(rotate, headers=api.auth(api.alice))
        assert r.status_code == 409 and r.json()["error"]["code"] == "rotation_overlaps", r.text
        assert "end_overlap" in r.text and "--end-overlap" in r.text and first["previous_valid_until"][:16] in r.text

        async def signed_with() -> str:
            delivery = (await api.client.post(f"/v1/webhooks/{webhook_id}/test", headers=api.auth(api.alice))
                        ).json()["delivery"]
            await api.delivered(api.alice, webhook_id, delivery["id"])
            return str(delivery["id"])

        await signed_with()
        for secret in (created["secret"], first["secret"]):  # the refused rotation dropped nothing
            Webhook(secret).verify(receiver.received[-1].body, receiver.received[-1].headers)
        r = await api.client.post(rotate, headers=api.auth(api.alice), json={"end_overlap": True})
        assert r.status_code == 200, r.text
        second = r.json()
        await signed_with()
        got = receiver.received[-1]
        assert len(got.headers["webhook-signature"].split(" ")) == 2
        for secret in (first["secret"], second["secret"]):
            Webhook(secret).verify(got.body, got.headers)
        with pytest.raises(WebhookVerificationError):
            Webhook(created["secret"]).verify(got.body, got.headers)  # the overlap it ended


async def test_a_rotation_after_the_overlap_needs_nothing_more(make_engine: MakeEngine, tmp_path: Path,
                                                                nursery: trio.Nursery) -> None:
    receiver = await started(nursery, Receiver())
    async with hooked_api(make_engine, tmp_path, allowing(receiver, rotation_overlap_s=0)) as api:
        webhook_id = (await api.register(api.alice, receiver.url, ["*"]))["webhook"]["id"]
        for _ in range(3):
            r = await api.client.post(f"/v1/webhooks/{webhook_id}/rotate", headers=api.auth(api.alice))
            assert r.status_code == 200, r.text
