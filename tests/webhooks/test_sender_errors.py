"""What a failed attempt records: in the webhook's own words (not another tool's)."""

from __future__ import annotations

import dataclasses
import ipaddress
from pathlib import Path

from codesdk.supervisor.egress import EgressPolicy, HostPattern, IPAddress

from tests.conftest import MakeEngine
from tests.webhooks.conftest import allowing, hooked_api


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
