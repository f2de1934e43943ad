"""Session listing pages by a cursor (``after`` = a page's ``next_after``) with ``has_more``, filtered by namespace
and runtime, each token seeing only its own: through the API, both clients and the CLI."""

from __future__ import annotations

import sys

import trio

from codesdk import AsyncClient, Client

from tests.api.conftest import Api


async def test_pages_follow_the_cursor_and_say_when_there_is_more(api: Api) -> None:
    with trio.fail_after(60):
        mine = [(await api.create_session(api.alice, "user:alice"))["session_id"] for _ in range(5)]
        bobs = [(await api.create_session(api.bob, "user:bob"))["session_id"] for _ in range(2)]
        seen, after, pages = [], None, 0
        async with AsyncClient(socket=api.socket, token=api.alice) as client:
            while True:
                page = await client.list_sessions(limit=2, after=after)
                pages += 1
                seen += [s.session_id for s in page.sessions]
                if not page.has_more:
                    assert page.next_after is None
                    break
                assert page.next_after == page.sessions[-1].session_id
                after = page.next_after
            assert seen == mine and pages == 3
            assert [s.session_id for s in (await client.list_sessions(runtime="scripted")).sessions] == mine
            assert (await client.list_sessions(runtime="codex")).sessions == ()
            assert (await client.list_sessions(namespace="user:bob")).sessions == ()  # not hers to list
        auth = api.auth(api.alice)
        for cursor in (bobs[0], "ses_nope"):  # another tenant's session, or none, is no cursor of hers
            r = await api.client.get(f"/v1/sessions?after={cursor}", headers=auth)
            assert r.status_code == 422 and "query 'after'" in r.json()["error"]["message"], r.text
        everything = (await api.client.get("/v1/sessions", headers=api.auth(api.admin))).json()
        assert [s["session_id"] for s in everything["sessions"]] == mine + bobs and not everything["has_more"]
        only_bob = (await api.client.get("/v1/sessions?namespace=user:bob&after=" + bobs[0],
                                         headers=api.auth(api.admin))).json()
        assert [s["session_id"] for s in only_bob["sessions"]] == bobs[1:]

        def blocking() -> list[str]:
            with Client(socket=api.socket, token=api.bob) as sync_client:
                return [s.session_id for s in sync_client.list_sessions(limit=1, after=bobs[0]).sessions]

        assert await trio.to_thread.run_sync(blocking) == bobs[1:]


async def test_the_cli_lists_every_session_through_pages(api: Api) -> None:
    with trio.fail_after(60):
        mine = [(await api.create_session(api.alice, "user:alice"))["session_id"] for _ in range(3)]
        base = [sys.executable, "-m", "codesdk.supervisor.cli.front", "--url", f"unix:{api.socket}", "--token",
                api.alice, "sessions"]
        listed = await trio.run_process(base, capture_stdout=True, capture_stderr=True, check=False)
        assert listed.returncode == 0, listed.stderr
        assert [line.split()[0] for line in listed.stdout.decode().splitlines()] == mine
        two = await trio.run_process([*base, "--limit", "2"], capture_stdout=True, check=False)
        assert [line.split()[0] for line in two.stdout.decode().splitlines()] == mine[:2]
