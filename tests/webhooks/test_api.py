"""Registering webhooks through the API, the Python client and the CLI: bad input refused with what to do (422,
exit 2), another tenant's webhooks and deliveries unseen (404)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from codesdk.client import AsyncClient, Client, InvalidRequest, NotFound
from codesdk.supervisor.cli.common import CliError
from codesdk.supervisor.cli.front import build_parser
from codesdk.supervisor.cli.local import refusal_exit_code
from codesdk.supervisor.cli.webhooks import cmd_webhooks
from codesdk.supervisor.egress import EgressPolicy, HostPattern
from codesdk.supervisor.webhooks import WebhookOptions

from tests.conftest import MakeEngine
from tests.webhooks.conftest import Hooked, allowing, hooked_api, started
from tests.webhooks.receiver import Receiver


async def _refused(api: Hooked, token: str, body: Any) -> dict[str, Any]:
    r = await api.client.post("/v1/webhooks", headers=api.auth(token),
                              **({"content": body} if isinstance(body, bytes) else {"json": body}))
    assert r.status_code == 422, r.text
    return dict(r.json()["error"])


async def test_bad_registrations_are_refused_saying_what_to_do(make_engine: MakeEngine, tmp_path: Path,
                                                               nursery: trio.Nursery) -> None:
    receiver = await started(nursery, Receiver())
    async with hooked_api(make_engine, tmp_path, allowing(receiver)) as api:
        error = await _refused(api, api.admin, {"url": "https://example.com/hook", "kinds": ["*"]})
        assert "'url'" in error["message"] and "--webhook-allow example.com" in error["message"]
        error = await _refused(api, api.admin, {"url": "http://example.com:8080/", "kinds": ["*"]})
        assert "--webhook-allow example.com:8080" in error["message"]
        error = await _refused(api, api.alice, {"url": "http://example.com:8080/", "kinds": ["*"]})
        assert "ask the operator" in error["message"] and "--webhook" not in error["message"]
        assert receiver.allow not in error["message"]  # the operator's allowlist is not a tenant's to read
        for url in ("ftp://127.0.0.1/", f"http://user:pw@127.0.0.1:{receiver.port}/", "http://", "not a url",
                    f"{receiver.url}\r\nX-Evil: 1", f"{receiver.url}/a b", f"{receiver.url}/\u0000x"):
            error = await _refused(api, api.alice, {"url": url, "kinds": ["*"]})
            assert "'url'" in error["message"] and "http.fetch" not in error["message"], (url, error)
        error = await _refused(api, api.alice, {"url": receiver.url, "kinds": ["task.done"]})
        assert "'kinds'" in error["message"] and "task.completed" in error["message"]
        for body in ({"url": receiver.url, "kinds": []}, {"url": receiver.url}, {"url": receiver.url, "kinds": "*"},
                     {"url": receiver.url, "kinds": ["*"], "secret": "mine"}, b"{", b"[]"):
            await _refused(api, api.alice, body)
        r = await api.client.post("/v1/webhooks", headers=api.auth(api.alice),
                                  json={"url": receiver.url, "kinds": ["*"], "namespace": "user:bob"})
        assert r.status_code == 403, r.text  # as creating a session there: the name is the caller's own
        assert "may not register webhooks in namespace 'user:bob'" in r.json()["error"]["message"]
        assert not (await api.client.get("/v1/webhooks", headers=api.auth(api.alice))).json()["webhooks"]


async def test_a_link_local_address_needs_the_operator_s_word(make_engine: MakeEngine, tmp_path: Path) -> None:
    """A literal the host allowlist takes, on a non-public address (cloud metadata's) the operator did not allow."""
    options = WebhookOptions(egress=EgressPolicy(hosts=(HostPattern.parse("169.254.169.254"),)))
    async with hooked_api(make_engine, tmp_path, options) as api:
        error = await _refused(api, api.admin, {"url": "http://169.254.169.254/latest", "kinds": ["*"]})
    assert "link-local" in error["message"] and "--webhook-allow-address 169.254.169.254" in error["message"]
    assert "metadata" in error["message"] and "credentials" in error["message"]  # what allowing it would risk


async def test_a_token_of_several_namespaces_is_told_how_to_name_one(make_engine: MakeEngine, tmp_path: Path,
                                                                     nursery: trio.Nursery) -> None:
    receiver = await started(nursery, Receiver())
    async with hooked_api(make_engine, tmp_path, allowing(receiver)) as api:
        both = api.tokens.add_principal("ci", ["user:alice", "user:bob"])
        r = await api.client.post("/v1/webhooks", headers=api.auth(both), json={"url": receiver.url, "kinds": ["*"]})
        assert r.status_code == 422 and r.json()["error"]["code"] == "namespace_required", r.text
        assert "body field 'namespace'" in r.text and "--namespace" in r.text and "?namespace=" not in r.text
        await api.register(both, receiver.url, ["*"], namespace="user:bob")


async def test_tenants_see_only_their_own(make_engine: MakeEngine, tmp_path: Path, nursery: trio.Nursery) -> None:
    receiver = await started(nursery, Receiver())
    async with hooked_api(make_engine, tmp_path, allowing(receiver)) as api:
        mine = (await api.register(api.alice, receiver.url, ["task.completed"]))["webhook"]
        everyone = (await api.register(api.admin, receiver.url, ["*"]))["webhook"]
        assert "namespace" not in everyone  # every namespace: none of its own
        sent = (await api.client.post(f"/v1/webhooks/{mine['id']}/test", headers=api.auth(api.alice))).json()
        delivery = sent["delivery"]["id"]
        bob = api.auth(api.bob)
        for method, path in (("GET", f"/v1/webhooks/{mine['id']}"), ("DELETE", f"/v1/webhooks/{mine['id']}"),
                             ("POST", f"/v1/webhooks/{mine['id']}/rotate"), ("POST", f"/v1/webhooks/{mine['id']}/test"),
                             ("GET", f"/v1/webhooks/{mine['id']}/deliveries"),
                             ("GET", f"/v1/webhooks/{mine['id']}/deliveries/{delivery}"),
                             ("POST", f"/v1/webhooks/{mine['id']}/deliveries/{delivery}/redeliver"),
                             ("GET", f"/v1/webhooks/{everyone['id']}"), ("GET", "/v1/webhooks/wh_nope"),
                             ("GET", "/v1/webhooks/wh_%00")):
            r = await api.client.request(method, path, headers=bob)
            assert r.status_code == 404, (method, path, r.text)
        r = await api.client.get(f"/v1/webhooks/{everyone['id']}", headers=api.auth(api.alice))
        assert r.status_code == 404  # the admin's: not a tenant's to see
        r = await api.client.get(f"/v1/webhooks/{everyone['id']}/deliveries/{delivery}", headers=api.auth(api.admin))
        assert r.status_code == 404  # a delivery of another webhook
        assert [w["id"] for w in (await api.client.get("/v1/webhooks", headers=api.auth(api.alice))).json()[
            "webhooks"]] == [mine["id"]]
        assert {w["id"] for w in (await api.client.get("/v1/webhooks", headers=api.auth(api.admin))).json()[
            "webhooks"]} == {mine["id"], everyone["id"]}
        r = await api.client.get(f"/v1/webhooks/{mine['id']}/deliveries?state=lost", headers=api.auth(api.alice))
        assert r.status_code == 422 and "pending, delivered or dead" in r.text
        r = await api.client.delete(f"/v1/webhooks/{mine['id']}", headers=api.auth(api.alice))
        assert r.status_code == 204
        assert (await api.client.get(f"/v1/webhooks/{mine['id']}", headers=api.auth(api.alice))).status_code == 404
        assert api.service.accepts("user:carol", "lease.moved")  # the admin's takes every kind of every namespace
        await api.client.delete(f"/v1/webhooks/{everyone['id']}", headers=api.auth(api.admin))
        assert not api.service.accepts("user:alice", "task.completed")


async def test_the_clients(make_engine: MakeEngine, tmp_path: Path, nursery: trio.Nursery) -> None:
    receiver = await started(nursery, Receiver())
    async with hooked_api(make_engine, tmp_path, allowing(receiver)) as api:
        async with AsyncClient(socket=api.socket, token=api.alice) as client:
            created = await client.create_webhook(receiver.url, ["task.failed", "task.completed"],
                                                  description="ci")
            assert created.webhook.kinds == ("task.completed", "task.failed")
            assert [w.id for w in await client.webhooks()] == [created.webhook.id]
            delivery = await client.test_webhook(created.webhook.id)
            while (await client.delivery(created.webhook.id, delivery.id)).state.value == "pending":
                await trio.sleep(0.05)
            assert [d.id for d in await client.deliveries(created.webhook.id, "delivered")] == [delivery.id]
            with pytest.raises(InvalidRequest, match="ask the operator"):
                await client.create_webhook("https://example.com/", ["*"])
            with pytest.raises(NotFound):
                await client.webhook("wh_nope")

        def blocking() -> None:
            with Client(socket=api.socket, token=api.alice) as sync:
                rotated = sync.rotate_webhook_secret(created.webhook.id)
                assert rotated.secret.startswith("whsec_")
                again = sync.redeliver(created.webhook.id, delivery.id)
                assert again.id == delivery.id
                assert sync.webhook(created.webhook.id).description == "ci"
                sync.delete_webhook(created.webhook.id)
                assert sync.webhooks() == []
                with pytest.raises(InvalidRequest, match="kinds"):
                    sync.create_webhook(receiver.url, ["nope"])

        await trio.to_thread.run_sync(blocking)


async def test_the_cli(make_engine: MakeEngine, tmp_path: Path, nursery: trio.Nursery,
                       capsys: pytest.CaptureFixture[str]) -> None:
    receiver = await started(nursery, Receiver())
    async with hooked_api(make_engine, tmp_path, allowing(receiver)) as api:
        url = ["--url", f"unix:{api.socket}", "--token", api.alice]

        async def run(*argv: str) -> str:
            assert await cmd_webhooks(build_parser().parse_args(["webhooks", *argv, *url])) == 0
            return capsys.readouterr().out

        out = await run("add", receiver.url, "--kind", "task.completed", "--json")
        created = json.loads(out)
        webhook = created["webhook"]["id"]
        assert created["secret"].startswith("whsec_")
        assert webhook in await run("list")
        delivery = json.loads(await run("test", webhook, "--json"))["id"]
        while json.loads(await run("deliveries", webhook, delivery, "--json"))["state"] == "pending":
            await trio.sleep(0.05)
        assert "status=204" in await run("deliveries", webhook, delivery)
        assert delivery in await run("deliveries", webhook, "--state", "delivered")
        assert "secret whsec_" in await run("rotate", webhook)
        with pytest.raises(Exception, match="--end-overlap") as overlapping:
            await run("rotate", webhook)
        assert refusal_exit_code(overlapping.value) == 2
        assert "secret whsec_" in await run("rotate", webhook, "--end-overlap")
        assert delivery in await run("redeliver", webhook, delivery)
        assert webhook in await run("show", webhook)

        with pytest.raises(CliError, match=r"--kind: unknown kind\(s\) 'done'"):
            await run("add", receiver.url, "--kind", "done")
        for argv in (("add", "https://example.com/", "--kind", "*"), ("show", "wh_nope")):
            with pytest.raises(Exception) as refused:
                await run(*argv)
            assert refusal_exit_code(refused.value) == 2, refused.value
        with pytest.raises(SystemExit) as usage:
            build_parser().parse_args(["webhooks", "deliveries", webhook, "--state", "lost"])
        assert usage.value.code == 2
        with pytest.raises(CliError, match="--url"):
            await cmd_webhooks(build_parser().parse_args(["webhooks", "list"]))
        await run("remove", webhook)
        assert webhook not in await run("list")


async def test_a_namespace_has_a_bounded_number_of_webhooks(make_engine: MakeEngine, tmp_path: Path,
                                                            nursery: trio.Nursery) -> None:
    receiver = await started(nursery, Receiver())
    async with hooked_api(make_engine, tmp_path, allowing(receiver, max_per_namespace=2)) as api:
        for _ in range(2):
            await api.register(api.alice, receiver.url, ["*"])
        r = await api.client.post("/v1/webhooks", headers=api.auth(api.alice), json={"url": receiver.url,
                                                                                     "kinds": ["*"]})
        assert r.status_code == 409 and r.json()["error"]["code"] == "too_many_webhooks", r.text
        assert "remove one" in r.json()["error"]["message"]
        await api.register(api.bob, receiver.url, ["*"])  # another namespace's count is its own
