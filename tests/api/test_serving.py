"""Serving details: keep-alives, TCP on loopback, the tokens file."""

from __future__ import annotations

import json
import socket
import stat
from functools import partial
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
import trio

from codesdk.supervisor.api import ApiLimits, TokenAuth
from codesdk.supervisor.api.server import serve_api

from tests.conftest import MakeEngine
from tests.api.conftest import KEEPALIVE_S, Api

pytestmark = [
    pytest.mark.filterwarnings("ignore:Async generator .* was garbage collected:ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]


async def test_idle_stream_sends_keepalive_comments(api: Api) -> None:
    with trio.fail_after(10):
        sid = (await api.create_session(api.alice, "user:alice"))["session_id"]
        async with api.client.stream("GET", f"/v1/sessions/{sid}/events/stream?after_seq=1",
                                     headers=api.auth(api.alice)) as response:
            seen: list[str] = []
            with trio.move_on_after(KEEPALIVE_S * 3.5):
                async for line in response.aiter_lines():
                    seen.append(line)
        assert seen.count(": keep-alive") >= 2, seen
        assert not any(line.startswith("id:") for line in seen)  # seq 1 was skipped; nothing else yet


def test_tokens_file_round_trip(tmp_path: Path) -> None:
    data = tmp_path / "d"
    auth = TokenAuth.bootstrap(data)
    admin = (data / "admin.token").read_text().strip()
    carol = auth.add_principal("carol", ["user:carol", "ci:build-7"])
    again = TokenAuth.bootstrap(data)  # existing file: loaded, admin token not rewritten
    assert (data / "admin.token").read_text().strip() == admin
    assert stat.S_IMODE((data / "api-tokens.json").stat().st_mode) == 0o600
    admin_p, carol_p = again.authenticate(admin), again.authenticate(carol)
    assert admin_p is not None and admin_p.admin
    assert carol_p is not None and not carol_p.admin
    assert carol_p.can_access("ci:build-7") and not carol_p.can_access("user:dave")
    assert again.authenticate("csk_wrong") is None and again.authenticate(None) is None
    doc: dict[str, Any] = json.loads((data / "api-tokens.json").read_text())
    assert all(len(t["sha256"]) == 64 for t in doc["tokens"])
    with pytest.raises(ValueError, match="invalid namespace"):
        auth.add_principal("eve", ["nope"])


async def test_optional_loopback_tcp_port(make_engine: MakeEngine, tmp_path: Path) -> None:
    with trio.fail_after(15):
        data = tmp_path / "data"
        async with make_engine(data_dir=data) as engine, trio.open_nursery() as nursery:
            auth = TokenAuth.bootstrap(data)
            admin = (data / "admin.token").read_text().strip()
            bound = await nursery.start(partial(serve_api, engine, auth, None, 0))
            [address] = bound
            assert "127.0.0.1:" in address
            url = address if address.startswith("http") else f"http://{address}"
            async with httpx.AsyncClient(base_url=url, timeout=10) as client:
                assert (await client.get("/healthz")).status_code == 200
                r = await client.post("/v1/sessions", json={"namespace": "default"},
                                      headers={"Authorization": f"Bearer {admin}"})
                assert r.status_code == 201
            nursery.cancel_scope.cancel()


async def test_serve_needs_somewhere_to_listen(make_engine: MakeEngine, tmp_path: Path) -> None:
    with trio.fail_after(10):
        async with make_engine() as engine:
            with pytest.raises(ValueError, match="unix socket"):
                await serve_api(engine, TokenAuth(), None, None)


async def test_listen_backlog_holds_a_burst_of_connects(make_engine: MakeEngine, tmp_path: Path) -> None:
    """A burst of clients connecting while the accept loop is busy waits in the kernel's queue, up to the connection
    cap: a unix socket's nonblocking connect() past a full backlog fails with EAGAIN, which trio (and so httpx) takes
    for "in progress" — the client then writes into an unconnected socket and its first read fails with EINVAL."""
    burst = 256  # > the 128 the listener used to be given; each connect is one descriptor of this process
    with open("/proc/sys/net/core/somaxconn") as somaxconn:
        if int(somaxconn.read()) < burst:
            pytest.skip("net.core.somaxconn caps every listen backlog below the burst")
    with trio.fail_after(20):
        data = tmp_path / "data"
        sock_path = data / "api.sock"
        async with make_engine(data_dir=data) as engine, trio.open_nursery() as nursery:
            auth = TokenAuth.bootstrap(data)
            await nursery.start(partial(serve_api, engine, auth, sock_path, None,
                                        limits=ApiLimits(max_connections=burst + 16)))
            pending: list[socket.socket] = []
            try:
                # no checkpoint in this loop: the service's accept loop cannot run, every connection stays queued
                for index in range(burst):
                    raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    pending.append(raw)
                    raw.setblocking(False)
                    try:
                        raw.connect(str(sock_path))
                    except BlockingIOError:
                        pytest.fail(f"connect #{index + 1} of {burst} found the listen backlog full (EAGAIN)")
            finally:
                for raw in pending:
                    raw.close()
            transport = httpx.AsyncHTTPTransport(uds=str(sock_path))
            async with httpx.AsyncClient(transport=transport, base_url="http://codesdk", timeout=10) as client:
                assert (await client.get("/healthz")).status_code == 200
            nursery.cancel_scope.cancel()
