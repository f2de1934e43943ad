"""Budgets through the HTTP API and both clients, with a real scripted worker: a session over its token budget pauses
(its task ends ``task.stopped`` reason ``budget_reached``), refuses new tasks 409 until raised, and a raise with
``continue`` runs the next task to completion; bad limits are 422 naming the field, another tenant's session 404, a
raise of a budget not paused 409; the namespace's monthly budget (admin) refuses new tasks 402 once spent."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from codesdk import AsyncClient, Client, Conflict, Forbidden, InvalidRequest, NotFound
from codesdk.client import PaymentRequired
from codesdk.protocol import BUDGET_REACHED_REASON, EventType, TaskStopped
from codesdk.testing.invariants import check_session

from tests.api.conftest import Api


async def test_a_session_over_its_budget_pauses_and_a_raise_with_continue_goes_on(api: Api) -> None:
    with trio.fail_after(60):
        async with AsyncClient(socket=api.socket, token=api.alice) as client:
            session = await client.create_session(namespace="user:alice", budget={"tokens": 10})
            events = [e async for e in client.run(session.session_id, "hi", runtime_config={"scenario": "echo"})]
            assert [e.type for e in events][-2:] == [EventType.BUDGET_REACHED, EventType.TASK_STOPPED], events
            stopped = events[-1].payload
            assert isinstance(stopped, TaskStopped) and stopped.reason == BUDGET_REACHED_REASON
            assert stopped.receipt is not None
            budget = await client.session_budget(session.session_id)
            assert budget.raise_pending and budget.paused is not None and budget.spent.tokens == 19
            listed = await client.list_sessions(namespace="user:alice")
            assert listed.sessions[0].budget is not None and listed.sessions[0].budget.paused is not None
            with pytest.raises(Conflict) as paused:
                await client.start_task(session.session_id, "more")
            assert paused.value.code == "budget_paused" and "raise it first" in paused.value.message
            raised = await client.raise_budget(session.session_id, {"tokens": 1000}, continue_=True)
            assert raised.task is not None and not raised.raise_pending and raised.limits.tokens == 1000
            assert (await api.ended(api.alice, raised.task.task_id))["state"] == "completed"
            check_session(await client.events(session.session_id, limit=1000))
            with pytest.raises(Conflict) as not_paused:
                await client.raise_budget(session.session_id, {"tokens": 2000})
            assert not_paused.value.code == "budget_not_paused"


async def test_the_blocking_client_sets_and_reads_a_budget(api: Api) -> None:
    def use_sync_client() -> None:
        with Client(socket=api.socket, token=api.alice) as client:
            session = client.create_session(namespace="user:alice")
            assert client.session_budget(session.session_id).limits.tokens is None
            changed = client.set_session_budget(session.session_id, {"cost_usd": 2.5, "tool_calls": 3})
            assert (changed.limits.cost_usd, changed.limits.tool_calls) == (2.5, 3)
            assert client.get_session(session.session_id).budget is not None
            with pytest.raises(InvalidRequest, match="tool_calls"):
                client.set_session_budget(session.session_id, {"tool_calls": -1})
            with pytest.raises(ValueError, match="'tokens' must be a finite number"):
                client.set_session_budget(session.session_id, {"tokens": float("nan")})
            with pytest.raises(Conflict, match="not paused"):
                client.raise_budget(session.session_id, {"tokens": 5}, continue_=True)

    with trio.fail_after(60):
        await trio.to_thread.run_sync(use_sync_client)


BAD: list[dict[str, Any]] = [{"tokens": -1}, {"tokens": "5"}, {"cost_usd": "1"}, {"cost_usd": -0.5},
                             {"tool_calls": 1.5}, {"tool_calls": True}, {"tokns": 5}]


async def test_bad_limits_are_refused_422_naming_the_field(api: Api) -> None:
    session = await api.create_session(api.alice, "user:alice")
    sid = session["session_id"]
    for bad in BAD:
        for method, path, body in (("POST", "/v1/sessions", {"namespace": "user:alice", "budget": bad}),
                                   ("POST", f"/v1/sessions/{sid}/tasks", {"prompt": "x", "budget": bad}),
                                   ("PUT", f"/v1/sessions/{sid}/budget", {"limits": bad})):
            r = await api.client.request(method, path, headers=api.auth(api.alice), json=body)
            assert r.status_code == 422, (method, path, bad, r.text)
            assert next(iter(bad)) in r.json()["error"]["message"], (bad, r.text)
    assert await api.engine.store.list_active_tasks() == []


async def test_another_tenants_budget_is_not_found_and_an_unpaused_one_cannot_be_raised(api: Api) -> None:
    session = await api.create_session(api.alice, "user:alice")
    path = f"/v1/sessions/{session['session_id']}/budget"
    for method, sub, body in (("GET", "", None), ("PUT", "", {"limits": {"tokens": 5}}),
                              ("POST", "/raise", {"limits": {"tokens": 5}})):
        r = await api.client.request(method, path + sub, headers=api.auth(api.bob), json=body)
        assert r.status_code == 404, r.text
    r = await api.client.post(path + "/raise", headers=api.auth(api.alice), json={"continue": True})
    assert r.status_code == 409 and r.json()["error"]["code"] == "budget_not_paused", r.text
    async with AsyncClient(socket=api.socket, token=api.bob) as bob:
        with pytest.raises(NotFound):
            await bob.session_budget(session["session_id"])


async def test_a_namespace_past_its_monthly_budget_refuses_new_tasks_402(api: Api) -> None:
    with trio.fail_after(60):
        async with AsyncClient(socket=api.socket, token=api.admin) as admin, \
                AsyncClient(socket=api.socket, token=api.alice) as alice:
            set_to = await admin.set_namespace_budget("user:alice", 0.0)
            assert set_to.monthly_usd == 0.0 and set_to.spent.cost_usd == 0.0
            session = await alice.create_session(namespace="user:alice")
            with pytest.raises(PaymentRequired) as refused:
                await alice.start_task(session.session_id, "x")
            assert refused.value.code == "monthly_budget_spent"
            assert refused.value.details["limit_usd"] == 0.0 and refused.value.details["resets_at"].endswith("Z")
            with pytest.raises(Forbidden):  # a tenant may not read it
                await alice.namespace_budget("user:alice")
            cleared = await admin.set_namespace_budget("user:alice", None)
            assert cleared.monthly_usd is None
            await alice.start_task(session.session_id, "x")
            r = await api.client.put("/v1/namespaces/user:alice/budget", headers=api.auth(api.admin),
                                     json={"monthly_usd": -1})
            assert r.status_code == 422 and "monthly_usd" in r.json()["error"]["message"], r.text
