"""Namespace variables over the API: admin only, values never returned, applied to the next worker."""

from __future__ import annotations

import json

import trio

from codesdk import AsyncClient, Forbidden, InvalidRequest

from tests.api.conftest import Api

SECRET = "canary-api-env-value-0815"


async def test_admin_sets_lists_and_unsets_without_ever_seeing_a_value(api: Api) -> None:
    with trio.fail_after(30):
        async with AsyncClient(socket=api.socket, token=api.admin) as admin:
            listed = await admin.update_namespace_env("user:alice", set={"API_KEY": SECRET, "MODE": "x"})
            assert [v.name for v in listed] == ["API_KEY", "MODE"]
            assert all(v.fingerprint.startswith("hmac-sha256:") for v in listed)
            again = await admin.namespace_env("user:alice")
            assert again == listed and SECRET not in json.dumps([v.model_dump() for v in again])
            after = await admin.update_namespace_env("user:alice", unset=["MODE"])
            assert [v.name for v in after] == ["API_KEY"]
            raw = await api.client.get("/v1/namespaces/user:alice/env", headers=api.auth(api.admin))
            assert SECRET not in raw.text


async def test_tenants_may_neither_read_nor_write_variables(api: Api) -> None:
    with trio.fail_after(30):
        async with AsyncClient(socket=api.socket, token=api.alice) as alice:
            for call in (alice.namespace_env("user:alice"),
                         alice.update_namespace_env("user:alice", set={"API_KEY": SECRET})):
                try:
                    await call
                except Forbidden as exc:
                    assert "admin token" in exc.message
                else:
                    raise AssertionError("a tenant reached the variables")
        assert api.engine.pool.namespace_env.values("user:alice") == {}


async def test_bad_variables_and_namespaces_are_clear_422s(api: Api) -> None:
    with trio.fail_after(30):
        async with AsyncClient(socket=api.socket, token=api.admin) as admin:
            for namespace, body, text in (("user:alice", {"HOME": "/etc"}, "set by CodeSDK"),
                                          ("user:alice", {"A B": "x"}, "invalid variable name"),
                                          ("user:a..b", {"K": "v"}, "invalid namespace")):
                try:
                    await admin.update_namespace_env(namespace, set=body)
                except InvalidRequest as exc:
                    assert text in exc.message
                else:
                    raise AssertionError(f"{body} was accepted")
            r = await api.client.patch("/v1/namespaces/user:alice/env", headers=api.auth(api.admin),
                                       json={"set": {"K": 5}})
            assert r.status_code == 422


async def test_the_next_task_runs_on_a_worker_with_the_variables(api: Api) -> None:
    with trio.fail_after(60):
        session = await api.create_session(api.alice, "user:alice")
        task = await api.run_task(api.alice, session["session_id"])
        await api.engine.wait_task(task["task_id"])
        old = api.engine.pool.worker_of("user:alice")
        async with AsyncClient(socket=api.socket, token=api.admin) as admin:
            await admin.update_namespace_env("user:alice", set={"API_KEY": SECRET})
        assert old is not None
        await old.exited.wait()  # the idle worker was restarted at once
        task = await api.run_task(api.alice, session["session_id"])
        await api.engine.wait_task(task["task_id"])
        new = api.engine.pool.worker_of("user:alice")
        assert new is not None and new.spec.env["API_KEY"] == SECRET
