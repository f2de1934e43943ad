"""A webhook's deliveries page by page, newest first: through the API, both clients and the CLI, each delivery on
exactly one page."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from codesdk.client import AsyncClient, Client
from codesdk.supervisor.cli.front import build_parser
from codesdk.supervisor.cli.local import refusal_exit_code
from codesdk.supervisor.cli.webhooks import cmd_webhooks

from tests.conftest import MakeEngine
from tests.webhooks.conftest import allowing, hooked_api, started
from tests.webhooks.receiver import Receiver


async def test_deliveries_page_by_page(make_engine: MakeEngine, tmp_path: Path, nursery: trio.Nursery,
                                       capsys: pytest.CaptureFixture[str], store_options: dict[str, Any]) -> None:
    receiver = await started(nursery, Receiver())
    async with hooked_api(make_engine, tmp_path, allowing(receiver), **store_options) as api:
        webhook = (await api.register(api.alice, receiver.url, ["*"]))["webhook"]["id"]
        other = (await api.register(api.alice, receiver.url, ["*"]))["webhook"]["id"]
        made = []
        for _ in range(5):
            r = await api.client.post(f"/v1/webhooks/{webhook}/test", headers=api.auth(api.alice))
            made.append(r.json()["delivery"]["id"])
        foreign = (await api.client.post(f"/v1/webhooks/{other}/test", headers=api.auth(api.alice))
                   ).json()["delivery"]["id"]
        newest_first = made[::-1]

        seen: list[str] = []
        params: dict[str, str | int] = {"limit": 2}
        while True:
            r = await api.client.get(f"/v1/webhooks/{webhook}/deliveries", params=params, headers=api.auth(api.alice))
            assert r.status_code == 200, r.text
            page = r.json()
            seen += [d["id"] for d in page["deliveries"]]
            if not page["has_more"]:
                assert "next_before" not in page
                break
            params["before"] = page["next_before"]
        assert seen == newest_first

        for query in ({"limit": 0}, {"limit": 1001}, {"before": foreign}, {"before": "msg_nope"},
                      {"before": "wh_x"}):
            r = await api.client.get(f"/v1/webhooks/{webhook}/deliveries", params=query, headers=api.auth(api.alice))
            assert r.status_code == 422, (query, r.text)
        r = await api.client.get(f"/v1/webhooks/{webhook}/deliveries", params={"before": foreign},
                                 headers=api.auth(api.alice))
        assert "next_before" in r.json()["error"]["message"]

        async with AsyncClient(socket=api.socket, token=api.alice) as client:
            first = await client.list_deliveries(webhook, limit=3)
            assert [d.id for d in first.deliveries] == newest_first[:3] and first.has_more
            rest = await client.list_deliveries(webhook, before=first.next_before)
            assert [d.id for d in rest.deliveries] == newest_first[3:] and not rest.has_more

        def blocking() -> None:
            with Client(socket=api.socket, token=api.alice) as sync:
                page = sync.list_deliveries(webhook, limit=4, before=newest_first[0])
                assert [d.id for d in page.deliveries] == newest_first[1:] and not page.has_more

        await trio.to_thread.run_sync(blocking)

        url = ["--url", f"unix:{api.socket}", "--token", api.alice]
        assert await cmd_webhooks(build_parser().parse_args(["webhooks", "deliveries", webhook, "--limit", "2",
                                                             *url])) == 0
        shown = capsys.readouterr()
        assert [line.split()[0] for line in shown.out.splitlines()] == newest_first[:2]
        assert f"--before {newest_first[1]}" in shown.err
        assert await cmd_webhooks(build_parser().parse_args(["webhooks", "deliveries", webhook, "--before",
                                                             newest_first[1], *url])) == 0
        shown = capsys.readouterr()
        assert [line.split()[0] for line in shown.out.splitlines()] == newest_first[2:] and "--before" not in shown.err
        with pytest.raises(Exception) as refused:
            await cmd_webhooks(build_parser().parse_args(["webhooks", "deliveries", webhook, "--limit", "0", *url]))
        assert refusal_exit_code(refused.value) == 2
