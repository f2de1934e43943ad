"""``codesdk acp`` driven by the official TypeScript SDK (``@agentclientprotocol/sdk``, pinned in
``tests/acp/client-ts``, installed by ``scripts/install-runtimes``): a tenant's new session, permissions allowed once
then rejected, a cancel mid-turn, the list, and the session loaded in a second connection with the same history."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from tests.api.conftest import serve_test_api
from tests.conftest import MakeEngine
from tests.waits import HANG_GUARD_S

from .wire import check_log

CLIENT = Path(__file__).with_name("client-ts")
TEE = Path(__file__).with_name("tee.py")

pytestmark = pytest.mark.skipif(
    shutil.which("node") is None or not (CLIENT / "node_modules" / "@agentclientprotocol" / "sdk").is_dir(),
    reason="the ACP TypeScript SDK is not installed: run ./scripts/install-runtimes (needs node and npm)")


async def test_a_typescript_sdk_client_runs_cancels_loads_and_lists(make_engine: MakeEngine, tmp_path: Path) -> None:
    log = tmp_path / "wire.jsonl"
    async with serve_test_api(make_engine, tmp_path) as api:
        agent = [sys.executable, str(TEE), str(log), "--", sys.executable, "-m", "codesdk.supervisor.cli.front",
                 "--url", f"unix:{api.socket}", "--token", api.alice, "acp", "--runtime", "scripted"]
        with trio.fail_after(HANG_GUARD_S):
            done = await trio.run_process(["node", "client.mjs", str(tmp_path), "--", *agent], cwd=CLIENT,
                                          capture_stdout=True, stderr=None, stdin=subprocess.DEVNULL)
    seen = json.loads(done.stdout)
    live, loaded = seen["live"], seen["loaded"]
    assert live["protocolVersion"] == 1
    assert [a["toolCallId"] for a in live["asked"]] == ["call_first", "call_second"]
    assert live["asked"][0]["kinds"] == ["allow_once", "allow_always", "reject_once"]
    assert live["states"] == {"call_first": "completed", "call_second": "failed"}
    assert (Path(live["workspace"]) / "first.txt").is_file() and not (Path(live["workspace"]) / "second.txt").exists()
    assert live["stopReasons"] == ["end_turn", "cancelled"] and live["receipt"]
    assert live["sessionId"] in live["listed"]
    assert loaded["states"] == live["states"] and loaded["text"] == live["text"]
    assert loaded["prompts"] == ["write both", "think"]
    counts = check_log(log)
    assert counts["RequestPermissionRequest"] == 2 and counts["LoadSessionResponse"] == 1
