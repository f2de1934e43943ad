"""Deliveries of what is not a session's event: a namespace quarantined by the worker pool, and a namespace whose
lease moved here."""

from __future__ import annotations

import json
from pathlib import Path

import trio
from standardwebhooks import Webhook

from codesdk.supervisor.workers.launch import WorkerPolicy

from tests.conftest import MakeEngine
from tests.waits import until
from tests.webhooks.conftest import allowing, hooked_api, started
from tests.webhooks.receiver import Receiver


async def test_a_quarantine_is_delivered_to_who_wants_it(make_engine: MakeEngine, tmp_path: Path,
                                                         nursery: trio.Nursery) -> None:
    receiver = await started(nursery, Receiver())
    policy = WorkerPolicy(max_restarts=2, restart_window_s=300, quarantine_s=3600)
    async with hooked_api(make_engine, tmp_path, allowing(receiver), worker_policy=policy) as api:
        created = await api.register(api.alice, receiver.url, ["worker.quarantined"])
        await api.register(api.bob, receiver.url, ["task.failed"])  # bob's: neither this kind nor namespace
        for _ in range(2):
            task = await api.run_task(api.alice, "user:alice", scenario="crash-exit")
            while (await api.client.get(f"/v1/tasks/{task['task_id']}", headers=api.auth(api.alice))
                   ).json()["state"] in ("pending", "running"):
                await trio.sleep(0.05)
        await until("the quarantine's delivery", lambda: receiver.received)
    [got] = receiver.received
    Webhook(created["secret"]).verify(got.body, got.headers)
    payload = json.loads(got.body)
    assert payload["type"] == "worker.quarantined"
    assert payload["data"]["namespace"] == "user:alice" and "2 crashes" in payload["data"]["reason"]


async def test_a_moved_lease_is_delivered(make_engine: MakeEngine, tmp_path: Path, nursery: trio.Nursery) -> None:
    receiver = await started(nursery, Receiver())
    async with hooked_api(make_engine, tmp_path, allowing(receiver)) as api:
        await api.register(api.admin, receiver.url, ["lease.moved"])
        assert api.engine.leasing.on_moved is not None
        api.engine.leasing.on_moved("user:alice", 2)  # what a takeover with two orphaned tasks tells it
        await until("the move's delivery", lambda: receiver.received)
    payload = json.loads(receiver.received[0].body)
    assert payload["type"] == "lease.moved"
    assert payload["data"] == {"namespace": "user:alice", "failed_tasks": 2, "supervisor_id": None}
