"""Authorization across tenants, and request validation."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from tests.api.conftest import Api

ROUTES = [
    ("GET", "/v1/sessions/{sid}", None),
    ("POST", "/v1/sessions/{sid}/tasks", {"prompt": "hi", "runtime_config": {"scenario": "echo"}}),
    ("GET", "/v1/sessions/{sid}/events", None),
    ("GET", "/v1/sessions/{sid}/events/stream", None),
    ("GET", "/v1/sessions/{sid}/transcript", None),
    ("GET", "/v1/tasks/{tid}", None),
    ("POST", "/v1/tasks/{tid}/input", {"input": "not yours"}),
    ("POST", "/v1/tasks/{tid}/stop", {"reason": "not yours"}),
]


async def _alice_session_with_task(api: Api) -> tuple[str, str]:
    sid = (await api.create_session(api.alice, "user:alice"))["session_id"]
    tid = (await api.run_task(api.alice, sid, "hang"))["task_id"]
    return sid, tid


@pytest.mark.parametrize(("method", "path", "body"), ROUTES, ids=[f"{m} {p}" for m, p, _ in ROUTES])
async def test_other_tenant_gets_404_on_every_route(api: Api, method: str, path: str,
                                                    body: dict[str, Any] | None) -> None:
    with trio.fail_after(15):
        sid, tid = await _alice_session_with_task(api)
        url = path.format(sid=sid, tid=tid)
        r = await api.client.request(method, url, json=body, headers=api.auth(api.bob))
        assert r.status_code == 404, r.text
        assert "alice" not in r.text
        # the same request for an id that doesn't exist looks the same (no existence oracle)
        missing = path.format(sid="ses_0000000000000000", tid="task_0000000000000000")
        r2 = await api.client.request(method, missing, json=body, headers=api.auth(api.bob))
        assert (r2.status_code, r2.json()["error"]["code"]) == (404, r.json()["error"]["code"])
        # and alice's task is untouched by bob
        task = (await api.client.get(f"/v1/tasks/{tid}", headers=api.auth(api.alice))).json()
        assert task["state"] in {"pending", "running"}
        # the owner and the admin see it
        for token in (api.alice, api.admin):
            r = await api.client.get(f"/v1/sessions/{sid}", headers=api.auth(token))
            assert r.status_code == 200
        r = await api.client.post(f"/v1/tasks/{tid}/stop", headers=api.auth(api.alice))
        assert r.status_code == 200


async def test_list_sessions_shows_only_own_namespaces(api: Api) -> None:
    with trio.fail_after(15):
        a = (await api.create_session(api.alice, "user:alice"))["session_id"]
        b = (await api.create_session(api.bob, "user:bob"))["session_id"]
        d = (await api.create_session(api.admin, "default"))["session_id"]

        async def ids(token: str, **params: Any) -> set[str]:
            r = await api.client.get("/v1/sessions", params=params, headers=api.auth(token))
            assert r.status_code == 200, r.text
            return {s["session_id"] for s in r.json()["sessions"]}

        assert await ids(api.alice) == {a}
        assert await ids(api.bob) == {b}
        assert await ids(api.admin) == {a, b, d}
        assert await ids(api.alice, namespace="user:bob") == set()
        assert await ids(api.admin, namespace="user:bob") == {b}


async def test_principal_cannot_create_in_other_namespace_or_pick_workspace(api: Api) -> None:
    with trio.fail_after(10):
        for body in ({"namespace": "user:bob"}, {"namespace": "default"}):
            r = await api.client.post("/v1/sessions", json=body, headers=api.auth(api.alice))
            assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden"
        r = await api.client.post("/v1/sessions", json={"namespace": "user:alice", "workspace": "/etc"},
                                  headers=api.auth(api.alice))
        assert r.status_code == 403 and "workspace" in r.json()["error"]["message"]


@pytest.mark.parametrize(("path", "body", "field"), [
    ("/v1/sessions", {}, "namespace"),
    ("/v1/sessions", {"namespace": 7}, "namespace"),
    ("/v1/sessions", {"namespace": "user:alice", "metadata": "x"}, "metadata"),
    ("/v1/sessions", {"namespace": "user:alice", "colour": "red"}, "colour"),
    ("/v1/sessions", {"namespace": "nobody"}, "namespace"),
    ("/v1/sessions/{sid}/tasks", {}, "prompt"),
    ("/v1/sessions/{sid}/tasks", {"prompt": ""}, "prompt"),
    ("/v1/sessions/{sid}/tasks", {"prompt": "x", "permission_mode": "sometimes"}, "permission_mode"),
    ("/v1/sessions/{sid}/tasks", {"prompt": "x", "runtime_config": [1]}, "runtime_config"),
])
async def test_malformed_bodies_are_422_naming_the_field(api: Api, path: str, body: dict[str, Any],
                                                         field: str) -> None:
    with trio.fail_after(10):
        sid = (await api.create_session(api.alice, "user:alice"))["session_id"]
        r = await api.client.post(path.format(sid=sid), json=body, headers=api.auth(api.alice))
        assert r.status_code == 422, r.text
        error = r.json()["error"]
        assert error["code"] == "invalid_request"
        assert f"'{field}'" in error["message"], error["message"]


async def test_non_json_and_bad_query_are_422(api: Api) -> None:
    with trio.fail_after(10):
        sid = (await api.create_session(api.alice, "user:alice"))["session_id"]
        headers = {**api.auth(api.alice), "content-type": "application/json"}
        r = await api.client.post(f"/v1/sessions/{sid}/tasks", content=b"{not json", headers=headers)
        assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_json"
        r = await api.client.post(f"/v1/sessions/{sid}/tasks", content=b"[1, 2]", headers=headers)
        assert r.status_code == 422 and "JSON object" in r.json()["error"]["message"]
        r = await api.client.get(f"/v1/sessions/{sid}/events", params={"limit": 0}, headers=api.auth(api.alice))
        assert r.status_code == 422 and "'limit'" in r.json()["error"]["message"]
        r = await api.client.get(f"/v1/sessions/{sid}/events", params={"after_seq": "x"},
                                 headers=api.auth(api.alice))
        assert r.status_code == 422 and "'after_seq'" in r.json()["error"]["message"]
        r = await api.client.get(f"/v1/sessions/{sid}/events/stream",
                                 headers={**api.auth(api.alice), "Last-Event-ID": "abc"})
        assert r.status_code == 422 and "Last-Event-ID" in r.json()["error"]["message"]


async def test_unknown_route_and_method_use_error_shape(api: Api) -> None:
    with trio.fail_after(10):
        r = await api.client.get("/v1/nothing", headers=api.auth(api.admin))
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
        r = await api.client.delete("/v1/sessions", headers=api.auth(api.admin))
        assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"


async def test_oversized_body_is_413(api: Api) -> None:
    with trio.fail_after(10):
        sid = (await api.create_session(api.alice, "user:alice"))["session_id"]
        r = await api.client.post(f"/v1/sessions/{sid}/tasks", json={"prompt": "x" * (2 << 20)},
                                  headers=api.auth(api.alice))
        assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"
