"""Isolation levels over the API: chosen when a session is created, shown on it, kept by its forks; an unknown
level is 422 naming the choices, and ``shared`` (the operator's own HOME) is 409 while the service has tenants."""

from __future__ import annotations

import pytest

from tests.api.conftest import Api


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
