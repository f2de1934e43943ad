"""``GET /v1/me``: who a token is, as both clients read it; what `codesdk run --url` and `codesdk acp` choose a
namespace by."""

from __future__ import annotations

import pytest
import trio

from codesdk import AsyncClient, Client
from codesdk.client import Unauthorized
from codesdk.protocol.api import Me

from tests.api.conftest import Api


async def test_each_token_is_told_who_it_is(api: Api) -> None:
    with trio.fail_after(30):
        async with AsyncClient(socket=api.socket, token=api.alice) as alice:
            me = await alice.me()
        assert (me.name, me.admin, me.namespaces) == ("alice", False, ("user:alice",))
        async with AsyncClient(socket=api.socket, token=api.admin) as admin:
            me = await admin.me()
        assert me.admin and me.namespaces == ()
        bound_twice = api.tokens.add_principal("carol", ["user:carol", "ci:nightly"])

        def ask() -> Me:
            with Client(socket=api.socket, token=bound_twice) as client:  # the blocking client too
                return client.me()

        me = await trio.to_thread.run_sync(ask)
        assert me.namespaces == ("ci:nightly", "user:carol")
        async with AsyncClient(socket=api.socket, token="csk_not-a-token") as stranger:
            with pytest.raises(Unauthorized):
                await stranger.me()
