"""What a failed attempt records: in the webhook's own words (not another tool's), and the status a receiver sent
even when the body of its answer never finished."""

from __future__ import annotations

import dataclasses
import ipaddress
from pathlib import Path

import trio

from codesdk.supervisor.egress import EgressPolicy, HostPattern, IPAddress

from tests.conftest import MakeEngine
from tests.webhooks.conftest import allowing, hooked_api, started
from tests.webhooks.receiver import Receiver


async def test_a_status_that_came_is_kept_when_the_body_does_not(make_engine: MakeEngine, tmp_path: Path,
                                                                 nursery: trio.Nursery) -> None:
    """A receiver that answers 200 and then holds back its body: the attempt failed (the receiver never finished),
    with the status it did send, and says what did not come in time."""
    receiver = await started(nursery, Receiver(answer=lambda n: 200, stall_body=True))
    async with hooked_api(make_engine, tmp_path, allowing(receiver, max_attempts=1, timeout_s=2.0)) as api:
        webhook = (await api.register(api.alice, receiver.url, ["*"]))["webhook"]
        sent = await api.client.post(f"/v1/webhooks/{webhook['id']}/test", headers=api.auth(api.alice))
        dead = await api.delivered(api.alice, webhook["id"], sent.json()["delivery"]["id"])
    [attempt] = dead["attempts"]
    assert dead["state"] == "dead" and attempt["status"] == 200
    assert "HTTP 200" in attempt["error"] and "body" in attempt["error"] and "did not finish" in attempt["error"]
    assert "no answer" not in attempt["error"]


async def test_a_refused_send_speaks_of_the_webhook(make_engine: MakeEngine, tmp_path: Path) -> None:
    """A name the operator allows that resolves to a loopback address they did not: refused on each send, in a
    webhook's words."""

    async def loopback(host: str, port: int) -> list[IPAddress]:
        return [ipaddress.ip_address("127.0.0.1")]

    options = dataclasses.replace(allowing(max_attempts=1), resolver=loopback,
                                  egress=EgressPolicy(hosts=(HostPattern.parse("hooks.test"),)))
    async with hooked_api(make_engine, tmp_path, options) as api:
        webhook = (await api.register(api.alice, "http://hooks.test/hook", ["*"]))["webhook"]
        sent = await api.client.post(f"/v1/webhooks/{webhook['id']}/test", headers=api.auth(api.alice))
        dead = await api.delivered(api.alice, webhook["id"], sent.json()["delivery"]["id"])
    assert "loopback" in dead["last_error"] and "webhook" in dead["last_error"]
    assert "http.fetch" not in dead["last_error"] and "fetch" not in dead["last_error"]
