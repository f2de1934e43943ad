"""An event stream already open ends once its token no longer admits it — revoked or rotated here, by another
process on the same tokens file, or on another supervisor sharing PostgreSQL's table; for the console's cookie
too — with a last ``error`` frame saying why, so a follower does not take the end for the session's."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

from codesdk.supervisor.api import PostgresTokenStore, STALE_AFTER_S, TokenAuth, hash_token, open_token_auth
from codesdk.supervisor.cli.admin import main as admin_main
from codesdk.supervisor.store import open_token_table

from tests.api.conftest import Api, read_sse, serve_test_api
from tests.api.test_token_stores import UnreachableTable
from tests.conftest import MakeEngine


async def _stream_ended_by(api: Api, headers: dict[str, str], lapse: Callable[[], Awaitable[Any]]) -> dict[str, Any]:
    """Open alice's session's stream with ``headers``, then ``lapse`` her token: the stream's last frame."""
    sid = (await api.create_session(api.alice, "user:alice"))["session_id"]
    async with api.client.stream("GET", f"/v1/sessions/{sid}/events/stream", headers=headers) as response:
        assert response.status_code == 200
        await lapse()
        frames = await read_sse(response)  # returns once the server ends the stream
    assert frames, "the stream ended without saying why"
    return frames[-1]


def _alice_id(api: Api) -> str:
    return next(i for i, p in api.tokens.records() if p.name == "alice")


async def test_a_token_revoked_over_the_api_ends_its_open_stream(api: Api) -> None:
    async def revoke() -> None:
        r = await api.client.delete(f"/v1/tokens/{_alice_id(api)}", headers=api.auth(api.admin))
        assert r.status_code == 200, r.text

    last = await _stream_ended_by(api, api.auth(api.alice), revoke)
    assert last["event"] == "error" and last["data"]["error"]["code"] == "token_revoked"
    assert "revoked" in last["data"]["error"]["message"]


async def test_a_rotated_token_ends_its_open_stream(api: Api) -> None:
    async def rotate() -> None:
        r = await api.client.post(f"/v1/tokens/{_alice_id(api)}/rotate", headers=api.auth(api.admin))
        assert r.status_code == 200, r.text

    last = await _stream_ended_by(api, api.auth(api.alice), rotate)
    assert last["event"] == "error" and last["data"]["error"]["code"] == "token_revoked"


async def test_a_token_revoked_with_the_command_ends_its_open_stream(api: Api) -> None:
    """`codesdk-supervisor token revoke` changes the tokens file behind the service's back."""
    assert api.tokens.path is not None
    argv = ["token", "revoke", "alice", "--data-dir", str(api.tokens.path.parent)]

    async def revoke() -> None:
        assert await trio.to_thread.run_sync(admin_main, argv) == 0

    last = await _stream_ended_by(api, api.auth(api.alice), revoke)
    assert last["event"] == "error" and last["data"]["error"]["code"] == "token_revoked"


async def test_another_tokens_stream_stays_open(api: Api) -> None:
    sid = (await api.create_session(api.bob, "user:bob"))["session_id"]
    async with api.client.stream("GET", f"/v1/sessions/{sid}/events/stream",
                                 headers=api.auth(api.bob), params={"until_terminal": "true"}) as response:
        await api.client.delete(f"/v1/tokens/{_alice_id(api)}", headers=api.auth(api.admin))
        await api.run_task(api.bob, sid)  # the stream then ends after the task's end, not before
        frames = await read_sse(response)
    assert frames[-1]["event"] != "error" and all(f["event"] != "error" for f in frames)


async def test_a_console_stream_ends_when_its_token_is_revoked(api: Api) -> None:
    r = await api.client.post("/console/session", json={"token": api.alice}, headers={"Origin": "http://codesdk"})
    assert r.status_code == 201, r.text
    api.client.cookies.clear()
    cookie = {"Cookie": "codesdk_console=" + r.headers["set-cookie"].split(";")[0].split("=", 1)[1]}

    async def revoke() -> None:
        await api.client.delete(f"/v1/tokens/{_alice_id(api)}", headers=api.auth(api.admin))

    last = await _stream_ended_by(api, cookie, revoke)
    assert last["event"] == "error" and last["data"]["error"]["code"] == "token_revoked"


async def test_a_stream_on_one_supervisor_ends_when_another_revokes_its_token(
        postgres_url: str, tmp_path: Path, make_engine: MakeEngine) -> None:
    async with open_token_auth(tmp_path / "data", postgres_url) as here, \
            open_token_auth(tmp_path / "elsewhere", postgres_url) as elsewhere, \
            serve_test_api(make_engine, tmp_path, tokens=here) as api:
        async def revoke_elsewhere() -> None:
            await trio.to_thread.run_sync(elsewhere.revoke, "alice")

        last = await _stream_ended_by(api, api.auth(api.alice), revoke_elsewhere)
        assert last["event"] == "error" and last["data"]["error"]["code"] == "token_revoked"


async def test_a_table_unread_for_too_long_ends_tenant_streams(postgres_url: str, tmp_path: Path) -> None:
    now = [1000.0]
    table = open_token_table(postgres_url)
    try:
        TokenAuth.bootstrap_shared(tmp_path, PostgresTokenStore(table))
        admin = (tmp_path / "admin.token").read_text().strip()
        store = UnreachableTable(table)
        auth = TokenAuth(store=store, clock=lambda: now[0])
        _, _, alice = auth.issue("alice", ["user:alice"])
        ended: dict[str, tuple[str, str]] = {}

        async def follow(name: str, token: str) -> None:
            ended[name] = await auth.until_lapsed(hash_token(token), "user:alice")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(follow, "alice", alice)
            nursery.start_soon(follow, "admin", admin)
            store.failing = True
            auth.reload()  # fails: the view read last stands, for STALE_AFTER_S
            now[0] += STALE_AFTER_S + 1
            while "alice" not in ended:
                await trio.sleep(0.02)
            assert ended["alice"][0] == "tokens_unavailable" and "admin" not in ended  # the operator's stays
            nursery.cancel_scope.cancel()
    finally:
        table.close()
