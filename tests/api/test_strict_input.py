"""Issue 33 (items 5, 7, 9): request bodies and queries are validated strictly (a JSON boolean is a boolean, an
integer an integer), a runtime no worker offers is refused before a session is stored, and GET /v1/runtimes
answers for the caller's own namespace."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from codesdk import AsyncClient, Client
from codesdk.client import NamespaceInfo

from tests.api.conftest import Api
from tests.api.test_approvals import _pending, _start, _wait_done


@pytest.mark.parametrize("allow", ["yes", "1", 1, 0, "true", None, [True]])
async def test_a_decision_is_a_json_boolean(api: Api, allow: Any) -> None:
    with trio.fail_after(30):
        session = await api.create_session(api.alice, "user:alice")
        task = await _start(api, api.alice, session["session_id"])
        [approval] = await _pending(api, api.alice)
        r = await api.client.post(f"/v1/approvals/{approval['approval_id']}", headers=api.auth(api.alice),
                                  json={"allow": allow})
        assert r.status_code == 422, r.text
        assert "allow" in r.json()["error"]["message"]
        [still] = await _pending(api, api.alice)
        assert still["state"] == "pending"
        denied = await api.client.post(f"/v1/approvals/{approval['approval_id']}", headers=api.auth(api.alice),
                                       json={"allow": False})
        assert denied.status_code == 200 and denied.json()["state"] == "denied"
        await _wait_done(api, api.alice, task["task_id"])


@pytest.mark.parametrize("path", [
    "/v1/sessions/{sid}/events?limit=1e2", "/v1/sessions/{sid}/events?after_seq=%205",
    "/v1/sessions/{sid}/events?limit=1_0", "/v1/sessions/{sid}/events?limit=5.0",
    "/v1/sessions/{sid}/events/stream?until_terminal=yes", "/v1/sessions/{sid}/events/stream?until_terminal=1",
    "/v1/sessions?limit=+5", "/v1/sessions?offset=0x1", "/v1/sessions?bogus=1",
    "/v1/approvals?bogus=1", "/v1/runtimes?namespace=user:alice&bogus=1",
])
async def test_queries_are_strict(api: Api, path: str) -> None:
    with trio.fail_after(30):
        session = await api.create_session(api.alice, "user:alice")
        r = await api.client.get(path.format(sid=session["session_id"]), headers=api.auth(api.alice))
        assert r.status_code == 422, r.text
        assert r.json()["error"]["message"].startswith("query field")


async def test_well_formed_queries_still_pass(api: Api) -> None:
    with trio.fail_after(30):
        session = await api.create_session(api.alice, "user:alice")
        sid = session["session_id"]
        for path in (f"/v1/sessions/{sid}/events?limit=5&after_seq=0", "/v1/sessions?limit=3&offset=0",
                     "/v1/approvals?state=all"):
            r = await api.client.get(path, headers=api.auth(api.alice))
            assert r.status_code == 200, (path, r.text)
        async with api.client.stream("GET", f"/v1/sessions/{sid}/events/stream?until_terminal=true&after_seq=0",
                                     headers=api.auth(api.alice)) as r:
            assert r.status_code == 200


@pytest.mark.parametrize("body", [
    {"prompt": "x", "max_input_tokens": "5"}, {"prompt": "x", "max_input_tokens": 5.0},
    {"prompt": "x", "max_input_tokens": True}, {"prompt": 5}, {"prompt": "x", "runtime_config": []},
    {"prompt": "x", "permission_mode": 1},
])
async def test_task_bodies_are_strict(api: Api, body: dict[str, Any]) -> None:
    with trio.fail_after(30):
        session = await api.create_session(api.alice, "user:alice")
        r = await api.client.post(f"/v1/sessions/{session['session_id']}/tasks", headers=api.auth(api.alice),
                                  json=body)
        assert r.status_code == 422, r.text


async def test_the_clients_refuse_a_non_boolean_decision(api: Api) -> None:
    with trio.fail_after(30):
        async with AsyncClient(socket=api.socket, token=api.alice) as client:
            with pytest.raises(TypeError, match="allow must be True or False"):
                await client.decide("apr_x", allow="yes")  # type: ignore[arg-type]
        with Client(socket=api.socket, token=api.alice) as sync, pytest.raises(TypeError, match="allow must be"):
            await trio.to_thread.run_sync(lambda: sync.decide("apr_x", allow=1))  # type: ignore[arg-type]
        async with AsyncClient(socket=api.socket, token=api.alice) as client:
            with pytest.raises(TypeError, match="interactive must be True or False"):
                await client.start_task("ses_x", "hi", interactive="no")  # type: ignore[arg-type]
            with pytest.raises(TypeError, match="until_terminal must be True or False"):
                [e async for e in client.stream("ses_x", until_terminal="yes")]  # type: ignore[arg-type]


async def test_runtimes_default_to_the_callers_namespace(api: Api) -> None:
    with trio.fail_after(60):
        r = await api.client.get("/v1/runtimes", headers=api.auth(api.alice))
        assert r.status_code == 200, r.text
        assert r.json()["namespace"] == "user:alice" and r.json()["runtimes"]
        carol = api.tokens.add_principal("carol", ["user:c1", "user:c2"])
        r = await api.client.get("/v1/runtimes", headers=api.auth(carol))
        assert r.status_code == 422, r.text
        message = r.json()["error"]["message"]
        assert "?namespace=" in message and "user:c1" in message and "user:c2" in message


async def test_an_unknown_runtime_is_refused_before_a_session_is_stored(api: Api) -> None:
    with trio.fail_after(60):
        r = await api.client.post("/v1/sessions", headers=api.auth(api.alice),
                                  json={"namespace": "user:alice", "runtime": "nope"})
        assert r.status_code == 422, r.text
        message = r.json()["error"]["message"]
        assert "nope" in message and "scripted" in message
        listed = await api.client.get("/v1/sessions", headers=api.auth(api.alice))
        assert listed.json()["sessions"] == []
        session = await api.create_session(api.alice, "user:alice")
        r = await api.client.post(f"/v1/sessions/{session['session_id']}/tasks", headers=api.auth(api.alice),
                                  json={"prompt": "x", "runtime": "nope"})
        assert r.status_code == 422, r.text
        assert "nope" in r.json()["error"]["message"]


@pytest.mark.parametrize("config, said", [
    ({"scenario": "nope"}, "runtime_config.scenario 'nope' is not one scripted has"),
    ({"bogus": 1}, "runtime_config has a key scripted does not take: 'bogus'"),
])
async def test_a_runtime_config_the_runtime_does_not_take_is_refused_before_a_task_is_stored(
        api: Api, config: dict[str, object], said: str) -> None:
    with trio.fail_after(60):
        session = await api.create_session(api.alice, "user:alice")
        r = await api.client.post(f"/v1/sessions/{session['session_id']}/tasks", headers=api.auth(api.alice),
                                  json={"prompt": "x", "runtime_config": config})
        assert r.status_code == 422, r.text
        assert r.json()["error"]["code"] == "invalid_runtime_config" and said in r.json()["error"]["message"]
        events = await api.client.get(f"/v1/sessions/{session['session_id']}/events", headers=api.auth(api.alice))
        assert [e["type"] for e in events.json()["events"]] == ["session.created"], events.text
        async with AsyncClient(socket=api.socket, token=api.alice) as client:
            (scripted,) = [o for o in await client.runtimes() if o.name == "scripted"]
        assert "echo" in scripted.capabilities.config_choices["scenario"]
        assert "scenario" in (scripted.capabilities.config_keys or ())


async def test_namespaces_lists_those_the_token_sees(api: Api) -> None:
    with trio.fail_after(30):
        await api.create_session(api.alice, "user:alice")
        await api.create_session(api.bob, "user:bob")
        r = await api.client.get("/v1/namespaces", headers=api.auth(api.alice))
        assert r.status_code == 200, r.text
        assert r.json()["namespaces"] == [{"namespace": "user:alice", "sessions": 1}]
        everything = await api.client.get("/v1/namespaces", headers=api.auth(api.admin))
        rows = {row["namespace"]: row["sessions"] for row in everything.json()["namespaces"]}
        assert rows["user:alice"] == 1 and rows["user:bob"] == 1
        assert (await api.client.get("/v1/namespaces?x=1", headers=api.auth(api.alice))).status_code == 422
        async with AsyncClient(socket=api.socket, token=api.bob) as client:
            assert await client.namespaces() == [NamespaceInfo(namespace="user:bob", sessions=1)]


async def test_nothing_new_starts_while_the_service_drains(api: Api) -> None:
    """Once the drain (SIGTERM) begins, new sessions and tasks are refused 503 ``shutting_down``, nothing stored:
    the tasks it stopped are the last, and every open stream can be given their ends."""
    with trio.fail_after(30):
        session = await api.create_session(api.alice, "user:alice")
        api.drain.draining = True
        created = await api.client.post("/v1/sessions", headers=api.auth(api.alice), json={"namespace": "user:alice"})
        started = await api.client.post(f"/v1/sessions/{session['session_id']}/tasks", headers=api.auth(api.alice),
                                        json={"prompt": "x"})
        for refused in (created, started):
            assert refused.status_code == 503 and refused.json()["error"]["code"] == "shutting_down", refused.text
            assert refused.headers["retry-after"] == "5"
        assert await api.engine.store.list_tasks(session["session_id"]) == []
        assert len(await api.engine.store.list_sessions(namespace="user:alice")) == 1
