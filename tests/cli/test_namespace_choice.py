"""``codesdk run --url`` without ``--namespace``: the session goes to the token's own namespace (a tenant's only
one, the admin's ``default``), as ``codesdk acp`` does; a token bound to several is told to name one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import trio

from tests.api.conftest import Api, serve_test_api
from tests.conftest import MakeEngine
from tests.waits import HANG_GUARD_S

CLI = [sys.executable, "-m", "codesdk.supervisor.cli.front"]


async def _run(api: Api, token: str, *flags: str) -> subprocess.CompletedProcess[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CODESDK_")} | {"NO_COLOR": "1"}
    with trio.fail_after(HANG_GUARD_S):
        return await trio.run_process([*CLI, "--url", f"unix:{api.socket}", "--token", token, "run", "hello",
                                       "--non-interactive", *flags], stdin=subprocess.DEVNULL, capture_stdout=True,
                                      capture_stderr=True, check=False, env=env)


async def _namespaces_of_sessions(api: Api) -> list[str]:
    listed = await api.client.get("/v1/sessions", headers=api.auth(api.admin))
    assert listed.status_code == 200, listed.text
    return [s["namespace"] for s in listed.json()["sessions"]]


async def test_run_puts_a_session_in_the_tokens_own_namespace(make_engine: MakeEngine, tmp_path: Path) -> None:
    async with serve_test_api(make_engine, tmp_path) as api:
        alice = await _run(api, api.alice)
        assert alice.returncode == 0, alice.stderr.decode()
        assert "namespace user:alice" in alice.stderr.decode() + alice.stdout.decode()
        admin = await _run(api, api.admin)
        assert admin.returncode == 0, admin.stderr.decode()
        assert await _namespaces_of_sessions(api) == ["user:alice", "default"]


async def test_a_token_of_several_namespaces_is_told_to_name_one(make_engine: MakeEngine, tmp_path: Path) -> None:
    async with serve_test_api(make_engine, tmp_path) as api:
        carol = api.tokens.add_principal("carol", ["user:carol", "ci:build"])
        unnamed = await _run(api, carol)
        assert unnamed.returncode == 2 and unnamed.stdout == b""
        said = unnamed.stderr.decode()
        assert "ci:build, user:carol" in said and "--namespace" in said, said
        assert await _namespaces_of_sessions(api) == []  # nothing was stored
        named = await _run(api, carol, "--namespace", "ci:build")
        assert named.returncode == 0, named.stderr.decode()
        assert await _namespaces_of_sessions(api) == ["ci:build"]
