"""A real supervisor API on a unix socket in a tmp data dir, and an HTTP client that speaks to it."""

from __future__ import annotations

import ipaddress
import json
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, cast

import httpx2 as httpx
import pytest
import trio

from codesdk.supervisor.api import ApiLimits, TokenAuth
from codesdk.supervisor.api.server import StreamDrain, serve_api
from codesdk.supervisor.egress import EgressPolicy, HostPattern
from codesdk.supervisor.engine import Engine
from codesdk.supervisor.store import EventStore
from codesdk.supervisor.webhooks import WebhookOptions, WebhookService

from tests.conftest import MakeEngine
from tests.waits import HANG_GUARD_S

KEEPALIVE_S = 0.3
#: Webhooks may be registered on 127.0.0.1:9, where nothing listens (a delivery there fails at once, and is retried).
WEBHOOKS = WebhookOptions(egress=EgressPolicy(hosts=(HostPattern.parse("127.0.0.1:9"),),
                                              addresses=(ipaddress.ip_network("127.0.0.1/32"),)))


@dataclass
class Api:
    engine: Engine
    socket: Path
    admin: str
    alice: str  # bound to user:alice
    bob: str  # bound to user:bob
    client: httpx.AsyncClient
    tokens: TokenAuth  # the table the server reads: add_principal takes effect at once
    drain: StreamDrain  # the server's record of open streams (the service drains it on SIGTERM)

    def auth(self, token: str | None) -> dict[str, str]:
        return {} if token is None else {"Authorization": f"Bearer {token}"}

    async def create_session(self, token: str, namespace: str) -> dict[str, Any]:
        r = await self.client.post("/v1/sessions", json={"namespace": namespace}, headers=self.auth(token))
        assert r.status_code == 201, r.text
        return dict(r.json())

    async def ended(self, token: str, task_id: str) -> dict[str, Any]:
        """The task once it has ended (asked again until then)."""
        while (task := (await self.client.get(f"/v1/tasks/{task_id}", headers=self.auth(token))).json())["state"] in (
                "pending", "running"):
            await trio.sleep(0.05)
        return dict(task)

    async def decide_first_approval(self, token: str, allow: bool) -> dict[str, Any]:
        """Decide the first approval the token sees pending, once there is one; the approval as decided."""
        while not (pending := (await self.client.get("/v1/approvals", headers=self.auth(token))).json()["approvals"]):
            await trio.sleep(0.05)
        r = await self.client.post(f"/v1/approvals/{pending[0]['approval_id']}", headers=self.auth(token),
                                   json={"allow": allow})
        assert r.status_code == 200, r.text
        return dict(r.json())

    async def run_task(self, token: str, session_id: str, scenario: str = "echo") -> dict[str, Any]:
        r = await self.client.post(f"/v1/sessions/{session_id}/tasks", headers=self.auth(token),
                                   json={"prompt": "hello", "runtime_config": {"scenario": scenario}})
        assert r.status_code == 202, r.text
        return dict(r.json())


@asynccontextmanager
async def serve_test_api(make_engine: MakeEngine, tmp_path: Path, limits: ApiLimits | None = None,
                         timeout_s: float = HANG_GUARD_S, tokens: TokenAuth | None = None,
                         **options: Any) -> AsyncIterator[Api]:
    """A supervisor's API on a unix socket in ``tmp_path`` (admin, alice and bob tokens), with these limits (and
    these ``SupervisorOptions``). Its client's timeout is a hang guard, never a measure: a busy machine may take
    long (a support bundle is built at the lowest CPU priority, and waits for idle time). ``tokens``: the table
    the server reads (one whose admin token is in the data dir's admin.token), else the data dir's file."""
    data_dir = tmp_path / "data"
    async with make_engine(data_dir=data_dir, **options) as engine:
        auth = tokens or TokenAuth.bootstrap(data_dir)
        admin = (data_dir / "admin.token").read_text().strip()
        alice = auth.add_principal("alice", ["user:alice"])
        bob = auth.add_principal("bob", ["user:bob"])
        sock = tmp_path / "run" / "api.sock"
        assert isinstance(engine.store, EventStore)
        webhooks = WebhookService(engine.store, WEBHOOKS)
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as inner:
                drain = StreamDrain()
                await inner.start(webhooks.run)
                await inner.start(partial(serve_api, engine, auth, sock, None, keepalive_s=KEEPALIVE_S,
                                          limits=limits, drain=drain, webhooks=webhooks))
                transport = httpx.AsyncHTTPTransport(uds=str(sock))
                async with httpx.AsyncClient(transport=transport, base_url="http://codesdk",
                                             timeout=timeout_s) as client:
                    yield Api(engine, sock, admin, alice, bob, client, auth, drain)
                scope.cancel()


@pytest.fixture
async def api(make_engine: MakeEngine, tmp_path: Path, nursery: trio.Nursery) -> AsyncIterator[Api]:
    async with serve_test_api(make_engine, tmp_path) as served:
        yield served


async def read_sse(response: httpx.Response, stop_after: int | None = None) -> list[dict[str, Any]]:
    """Parse SSE frames from a streaming response; returns [{'id','event','data'}] (comments skipped)."""
    frames: list[dict[str, Any]] = []
    current: dict[str, Any] = {}
    async with aclosing(cast(AsyncGenerator[str, None], response.aiter_lines())) as lines:
        async for line in lines:
            if line == "":
                if current:
                    current["data"] = json.loads(current["data"])
                    frames.append(current)
                    current = {}
                    if stop_after is not None and len(frames) >= stop_after:
                        break
                continue
            if line.startswith(":"):
                continue
            field, _, value = line.partition(":")
            current[field] = value.removeprefix(" ")
    return frames
