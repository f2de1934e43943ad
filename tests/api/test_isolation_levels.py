"""Isolation levels over the API: chosen when a session is created, shown on it, kept by its forks; an unknown
level is 422 naming the choices, and ``shared`` (the operator's own HOME) is 409 while the service has tenants."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import trio

from codesdk import AsyncClient, Client, Conflict, InvalidRequest, Session
from codesdk.protocol import IsolationLevel

from tests.api.conftest import Api

CLI = [sys.executable, "-m", "codesdk.supervisor.cli.front"]


async def _cli(api: Api, token: str, *args: str) -> subprocess.CompletedProcess[bytes]:
    return await trio.run_process([*CLI, "--url", f"unix:{api.socket}", "--token", token, *args],
                                  stdin=subprocess.DEVNULL, capture_stdout=True, capture_stderr=True, check=False)


async def test_a_session_is_created_with_its_isolation_level_and_shows_it(api: Api) -> None:
    made = await api.client.post("/v1/sessions", headers=api.auth(api.alice),
                                 json={"namespace": "user:alice", "isolation": "ephemeral"})
    assert made.status_code == 201, made.text
    session = made.json()
    assert session["isolation"] == "ephemeral"
    sid = session["session_id"]
    assert (await api.client.get(f"/v1/sessions/{sid}", headers=api.auth(api.alice))).json()["isolation"] == "ephemeral"
    task = await api.ended(api.alice, (await api.run_task(api.alice, sid))["task_id"])
    assert task["state"] == "completed"
    events = (await api.client.get(f"/v1/sessions/{sid}/events?limit=100", headers=api.auth(api.alice))).json()
    (model_input,) = [e for e in events["events"] if e["type"] == "model.input"]
    assert model_input["payload"]["isolation"] == "ephemeral"
    fork = await api.client.post(f"/v1/sessions/{sid}/fork", headers=api.auth(api.alice), json={})
    assert fork.status_code == 201, fork.text
    assert fork.json()["isolation"] == "ephemeral"
    plain = await api.create_session(api.alice, "user:alice")
    assert plain["isolation"] == "namespaced"
    workers = (await api.client.get("/v1/workers", headers=api.auth(api.admin))).json()["workers"]
    assert {(w["namespace"], w["isolation"], w.get("session_id")) for w in workers} >= {
        ("user:alice", "ephemeral", sid)}
    deleted = await api.client.delete(f"/v1/sessions/{sid}", headers=api.auth(api.alice))
    assert deleted.status_code == 200, deleted.text


@pytest.mark.parametrize("level", ["isolated", "", "NAMESPACED", 3])
async def test_an_unknown_level_is_422_naming_the_choices(api: Api, level: object) -> None:
    r = await api.client.post("/v1/sessions", headers=api.auth(api.alice),
                              json={"namespace": "user:alice", "isolation": level})
    assert r.status_code == 422, r.text
    message = r.json()["error"]["message"]
    assert "isolation" in message and all(choice in message for choice in ("shared", "namespaced", "ephemeral"))


async def test_shared_is_refused_while_the_service_has_tenants_and_given_once_it_has_none(api: Api) -> None:
    r = await api.client.post("/v1/sessions", headers=api.auth(api.admin),
                              json={"namespace": "default", "isolation": "shared"})
    assert r.status_code == 409, r.text
    error = r.json()["error"]
    assert error["code"] == "isolation_refused"
    assert "alice" in error["message"] and "multi-user" in error["message"] and "'ephemeral'" in error["message"]
    for name in ("alice", "bob"):
        api.tokens.revoke(name)
    r = await api.client.post("/v1/sessions", headers=api.auth(api.admin),
                              json={"namespace": "default", "isolation": "shared"})
    assert r.status_code == 201, r.text
    assert r.json()["isolation"] == "shared"
    other = await api.client.post("/v1/sessions", headers=api.auth(api.admin),
                                  json={"namespace": "user:carol", "isolation": "shared"})
    assert other.status_code == 409 and "only for namespace 'default'" in other.json()["error"]["message"]


async def test_both_clients_choose_the_level_and_are_told_a_refusal(api: Api) -> None:
    with trio.fail_after(90):
        async with AsyncClient(socket=api.socket, token=api.alice) as client:
            own = await client.create_session(namespace="user:alice", isolation=IsolationLevel.EPHEMERAL)
            assert own.isolation == IsolationLevel.EPHEMERAL
            assert (await client.create_session(namespace="user:alice")).isolation == IsolationLevel.NAMESPACED
            with pytest.raises(InvalidRequest) as unknown:
                await client.create_session(namespace="user:alice", isolation="isolated")
            assert "ephemeral" in str(unknown.value)

        def blocking() -> tuple[Session, str]:
            with Client(socket=api.socket, token=api.admin) as sync_client:
                made = sync_client.create_session(namespace="user:alice", isolation="ephemeral")
                with pytest.raises(Conflict) as refused:
                    sync_client.create_session(isolation="shared")
                return made, refused.value.code

        made, code = await trio.to_thread.run_sync(blocking)
        assert made.isolation == IsolationLevel.EPHEMERAL and code == "isolation_refused"


async def test_the_command_line_through_the_service_chooses_the_level_and_exits_2_on_a_refusal(api: Api) -> None:
    with trio.fail_after(90):
        made = await _cli(api, api.alice, "run", "hello", "--namespace", "user:alice", "--isolation", "ephemeral",
                          "--json", "--non-interactive")
        assert made.returncode == 0, made.stderr.decode()
        session_id = json.loads(made.stdout.decode().splitlines()[0])["trace"]["session_id"]
        async with AsyncClient(socket=api.socket, token=api.alice) as client:
            assert (await client.get_session(session_id)).isolation == IsolationLevel.EPHEMERAL
        refused = await _cli(api, api.admin, "run", "hello", "--isolation", "shared")
        assert refused.returncode == 2 and refused.stdout == b""
        assert "isolation_refused" in refused.stderr.decode() and "multi-user" in refused.stderr.decode()


async def test_a_shared_session_takes_no_task_once_the_service_has_a_tenant(api: Api) -> None:
    for name in ("alice", "bob"):
        api.tokens.revoke(name)
    made = await api.client.post("/v1/sessions", headers=api.auth(api.admin),
                                 json={"namespace": "default", "isolation": "shared"})
    assert made.status_code == 201, made.text
    sid = made.json()["session_id"]
    carol = api.tokens.add_principal("carol", ["default"])
    for token in (api.admin, carol):
        r = await api.client.post(f"/v1/sessions/{sid}/tasks", headers=api.auth(token),
                                  json={"prompt": "hello", "runtime_config": {"scenario": "echo"}})
        assert r.status_code == 409 and r.json()["error"]["code"] == "isolation_refused", r.text
        assert "carol" in r.json()["error"]["message"]
