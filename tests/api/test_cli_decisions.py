"""``codesdk approvals`` and ``codesdk decide`` against a real API: a batch decided from the command line, each
approval answered on its own."""

from __future__ import annotations

import json

import pytest
import trio

from codesdk.protocol import GrantScope
from codesdk.supervisor.cli.decision_args import SCOPES
from codesdk.supervisor.cli.decisions import cmd_approvals, cmd_decide
from codesdk.supervisor.cli.front import build_parser

from tests.api.conftest import Api
from tests.api.test_grants import _pending, _scenario, _start, _write


def test_the_cli_offers_every_scope() -> None:
    assert SCOPES == tuple(scope.value for scope in GrantScope)


async def test_decide_several_from_the_command_line(api: Api, capsys: pytest.CaptureFixture[str]) -> None:
    with trio.fail_after(60):
        session = (await api.create_session(api.alice, "user:alice"))["session_id"]
        task = await _start(api, session, _scenario([_write("w1", "a.txt"), _write("w2", "b.txt")]))
        first, second = [a["approval_id"] for a in await _pending(api, 2)]
        url = ["--url", f"unix:{api.socket}", "--token", api.alice]
        assert await cmd_approvals(build_parser().parse_args(["approvals", *url, "--json"])) == 0
        listed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert {row["approval_id"] for row in listed} == {first, second}

        args = build_parser().parse_args(["decide", "allow", first, second, "apr_nope", *url, "--scope", "task",
                                          "--reason", "both fine"])
        assert await cmd_decide(args) == 2  # one of them could not be decided: the command says so
        out = capsys.readouterr()
        assert f"{first}  approved" in out.out and f"{second}  approved" in out.out
        assert "apr_nope  not decided (404" in out.err
        assert (await api.ended(api.alice, task))["state"] == "completed"
