"""A supervisor's API with webhooks on (the delivery loop running beside it) and receivers on 127.0.0.1."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
import trio

from codesdk.supervisor.api import TokenAuth
from codesdk.supervisor.api.server import serve_api
from codesdk.supervisor.egress import EgressPolicy, HostPattern
from codesdk.supervisor.engine import Engine
from codesdk.supervisor.namespaces import SecretKey
from codesdk.supervisor.service.serve import webhook_service
from codesdk.supervisor.webhooks import WebhookOptions, WebhookService

from tests.conftest import MakeEngine
from tests.waits import HANG_GUARD_S, until
from tests.webhooks.receiver import Receiver


@dataclass
class Hooked:
    engine: Engine
    service: WebhookService
    admin: str
    alice: str
    bob: str
    client: httpx.AsyncClient
    socket: Path
    #: The service's tokens, for a test that needs another.
    tokens: TokenAuth

    def auth(self, token: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"}

    async def register(self, token: str, url: str, kinds: list[str], **more: Any) -> dict[str, Any]:
        r = await self.client.post("/v1/webhooks", json={"url": url, "kinds": kinds, **more}, headers=self.auth(token))
        assert r.status_code == 201, r.text
        return dict(r.json())

    async def delivery(self, token: str, webhook_id: str, delivery_id: str) -> dict[str, Any]:
        r = await self.client.get(f"/v1/webhooks/{webhook_id}/deliveries/{delivery_id}", headers=self.auth(token))
        assert r.status_code == 200, r.text
        return dict(r.json())

    async def delivered(self, token: str, webhook_id: str, delivery_id: str) -> dict[str, Any]:
        """The delivery once it is delivered (or dead)."""
        found: dict[str, Any] = {}

        async def settled() -> bool:
            found.update(await self.delivery(token, webhook_id, delivery_id))
            return bool(found["state"] != "pending")

        while not await settled():
            await trio.sleep(0.05)
        return found

    async def run_task(self, token: str, namespace: str, scenario: str = "echo") -> dict[str, Any]:
        r = await self.client.post("/v1/sessions", json={"namespace": namespace}, headers=self.auth(token))
        assert r.status_code == 201, r.text
        session = r.json()
        r = await self.client.post(f"/v1/sessions/{session['session_id']}/tasks", headers=self.auth(token),
                                   json={"prompt": "hello", "runtime_config": {"scenario": scenario}})
        assert r.status_code == 202, r.text
        return dict(r.json())


@pytest.fixture(params=["sqlite", "postgresql"])
def store_options(request: pytest.FixtureRequest) -> dict[str, Any]:
    """Both stores: the PostgreSQL one where the suite's throwaway server can run (else it skips, saying why),
    with a deployment key, as a supervisor on PostgreSQL needs."""
    if request.param == "sqlite":
        return {}
    return {"store": str(request.getfixturevalue("postgres_url")), "secret_key": SecretKey(os.urandom(32))}


def allowing(*receivers: Receiver, **options: Any) -> WebhookOptions:
    """Webhook options that allow these receivers' hosts and loopback, retrying at once."""
    egress = EgressPolicy(hosts=tuple(HostPattern.parse(r.allow) for r in receivers),
                          addresses=(ipaddress.ip_network("127.0.0.1/32"),))
    return WebhookOptions(egress=egress, **{"retry_base_s": 0.05, "retry_cap_s": 0.2, "poll_s": 0.05, **options})


@asynccontextmanager
async def hooked_api(make_engine: MakeEngine, tmp_path: Path, options: WebhookOptions,
                     **engine_options: Any) -> AsyncIterator[Hooked]:
    data_dir = tmp_path / "data"
    async with make_engine(data_dir=data_dir, **engine_options) as engine:
        service = webhook_service(engine, options)  # as the service makes it
        auth = TokenAuth.bootstrap(data_dir)
        admin = (data_dir / "admin.token").read_text().strip()
        alice = auth.add_principal("alice", ["user:alice"])
        bob = auth.add_principal("bob", ["user:bob"])
        sock = tmp_path / "run" / "api.sock"
        async with trio.open_nursery() as nursery:
            await nursery.start(service.run)
            await nursery.start(partial(serve_api, engine, auth, sock, None, webhooks=service))
            transport = httpx.AsyncHTTPTransport(uds=str(sock))
            async with httpx.AsyncClient(transport=transport, base_url="http://codesdk",
                                         timeout=HANG_GUARD_S) as client:
                yield Hooked(engine, service, admin, alice, bob, client, sock, auth)
            nursery.cancel_scope.cancel()


async def started(nursery: trio.Nursery, receiver: Receiver) -> Receiver:
    await nursery.start(receiver.serve)
    return receiver


__all__ = ["Hooked", "allowing", "hooked_api", "started", "until"]
