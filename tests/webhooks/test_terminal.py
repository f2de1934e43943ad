"""What a tenant wrote (a webhook's URL and description) and what its receiver answered (a delivery's last error)
reach the admin's terminal through ``codesdk webhooks``: shown escaped, never driving the terminal."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from codesdk.supervisor.cli.front import build_parser
from codesdk.supervisor.cli.webhooks import cmd_webhooks

from tests.conftest import MakeEngine
from tests.webhooks.conftest import allowing, hooked_api, started
from tests.webhooks.receiver import Receiver

HOSTILE = "\u001b[31mRED\u001b[0m\rOVERWRITE\nwh_fake  https://evil.example/  kinds=*\u202e\u0007\x9b"


def _harmless(out: str, lines: int) -> None:
    assert not any(c in out for c in "\u001b\r\u0007\u202e\x9b"), out
    assert out.count("\n") == lines, out  # one line each: nothing made a line look like two


async def test_hostile_text_is_shown_escaped(make_engine: MakeEngine, tmp_path: Path, nursery: trio.Nursery,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    receiver = await started(nursery, Receiver(answer=lambda n: 500, body=HOSTILE.encode()))
    async with hooked_api(make_engine, tmp_path, allowing(receiver, max_attempts=1)) as api:
        webhook = (await api.register(api.alice, f"{receiver.url}?x=%1b", ["*"], description=HOSTILE))["webhook"]
        sent = await api.client.post(f"/v1/webhooks/{webhook['id']}/test", headers=api.auth(api.alice))
        delivery = sent.json()["delivery"]["id"]
        dead = await api.delivered(api.alice, webhook["id"], delivery)
        assert "\u001b" in dead["last_error"]  # the API keeps what came; the terminal is the CLI's to protect
        admin = ["--url", f"unix:{api.socket}", "--token", api.admin]
        for argv, lines in ((("list",), 1), (("show", webhook["id"]), 1), (("deliveries", webhook["id"]), 1),
                            (("deliveries", webhook["id"], delivery), 2)):
            assert await cmd_webhooks(build_parser().parse_args(["webhooks", *argv, *admin])) == 0
            out = capsys.readouterr().out
            _harmless(out, lines)
            assert "\\x1b[31mRED" in out
