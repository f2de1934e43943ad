"""``codesdk acp`` on its own pipes: an embedded supervisor, lines that are not requests, a token the service
refuses — and never anything on stdout but protocol lines."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from tests.api.conftest import serve_test_api
from tests.conftest import MakeEngine
from tests.waits import HANG_GUARD_S

from .wire import validator

CLI = [sys.executable, "-m", "codesdk.supervisor.cli.front"]


class Peer:
    """The client's end of ``codesdk acp``'s pipes: lines written, lines read (every one kept)."""

    def __init__(self, process: trio.Process) -> None:
        assert process.stdin is not None and process.stdout is not None
        self.process, self.stdin, self.stdout = process, process.stdin, process.stdout
        self.buffer = b""
        self.seen: list[dict[str, Any]] = []

    async def send(self, message: dict[str, Any] | bytes) -> None:
        line = message if isinstance(message, bytes) else json.dumps({"jsonrpc": "2.0", **message}).encode()
        await self.stdin.send_all(line + b"\n")

    async def read(self) -> dict[str, Any]:
        while b"\n" not in self.buffer:
            data = await self.stdout.receive_some(65536)
            assert data, "codesdk acp closed its stdout"
            self.buffer += data
        line, self.buffer = self.buffer.split(b"\n", 1)
        message = json.loads(line)  # not JSON: a stray print reached the protocol's stdout
        assert isinstance(message, dict) and message["jsonrpc"] == "2.0"
        self.seen.append(message)
        return message

    async def answer(self, request_id: int | str) -> dict[str, Any]:
        """Read until the answer to ``request_id`` (notifications on the way are kept in ``seen``)."""
        while "method" in (message := await self.read()) or message.get("id") != request_id:
            pass
        return message

    async def call(self, request_id: int | str, method: str, params: dict[str, Any]) -> dict[str, Any]:
        await self.send({"id": request_id, "method": method, "params": params})
        return await self.answer(request_id)


@asynccontextmanager
async def acp_process(*args: str) -> AsyncIterator[Peer]:
    """``codesdk ARGS…`` with its stdin and stdout ours; killed and reaped if still running at the end."""
    process = await trio.lowlevel.open_process([*CLI, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        yield Peer(process)
    finally:
        with trio.CancelScope(shield=True):
            if process.returncode is None:
                process.kill()
            await process.wait()


async def test_embedded_it_serves_one_connection_and_speaks_only_protocol(tmp_path: Path) -> None:
    workspace = tmp_path / "project"
    workspace.mkdir()
    with trio.fail_after(HANG_GUARD_S):
        async with acp_process("--data-dir", str(tmp_path / "data"), "acp", "--runtime", "scripted") as peer:
            await peer.send(b"this is not json")
            assert (await peer.read())["error"]["code"] == -32700
            assert (await peer.call(1, "no/such", {}))["error"]["code"] == -32601
            ready = await peer.call(2, "initialize", {"protocolVersion": 1, "clientCapabilities": {}})
            assert ready["result"]["protocolVersion"] == 1 and ready["result"]["authMethods"] == []
            new = await peer.call(3, "session/new", {"cwd": str(workspace), "mcpServers": []})
            session_id = new["result"]["sessionId"]
            assert new["result"]["_meta"]["codesdk"]["workspace"] == str(workspace)  # embedded: the editor's cwd
            options = {o["id"]: o for o in new["result"]["configOptions"]}
            assert options["mode"]["currentValue"] == "ask" and options["runtime"]["currentValue"] == "scripted"
            wrong = await peer.call(30, "session/set_config_option", {"sessionId": session_id, "configId": "runtime",
                                                                     "value": "no-such-runtime"})
            assert wrong["error"]["code"] == -32602
            auto = await peer.call(31, "session/set_config_option", {"sessionId": session_id, "configId": "mode",
                                                                    "value": "auto"})
            assert {o["id"]: o["currentValue"] for o in auto["result"]["configOptions"]}["mode"] == "auto"
            unknown = await peer.call(4, "session/prompt", {"sessionId": "ses_nope", "prompt": []})
            assert unknown["error"]["code"] == -32002
            empty = await peer.call(5, "session/prompt", {"sessionId": session_id, "prompt": []})
            assert empty["error"]["code"] == -32602
            done = await peer.call(6, "session/prompt", {"sessionId": session_id,
                                                         "prompt": [{"type": "text", "text": "hello"}]})
            assert done["result"]["stopReason"] == "end_turn"
            chunks = [m["params"]["update"] for m in peer.seen if m.get("method") == "session/update"]
            assert "hello" in "".join(u["content"]["text"] for u in chunks
                                      if u["sessionUpdate"] == "agent_message_chunk")
            await peer.stdin.aclose()
            assert await peer.process.wait() == 0
    notification = validator("SessionNotification")
    for message in peer.seen:
        if message.get("method") == "session/update":
            assert not list(notification.iter_errors(message["params"]))


async def test_a_refused_token_is_auth_required(make_engine: MakeEngine, tmp_path: Path) -> None:
    async with serve_test_api(make_engine, tmp_path) as api:
        with trio.fail_after(HANG_GUARD_S):
            async with acp_process("--url", f"unix:{api.socket}", "--token", "not-a-token", "acp") as peer:
                ready = await peer.call(1, "initialize", {"protocolVersion": 1})
                assert ready["result"]["authMethods"][0]["id"] == "codesdk-token"
                refused = await peer.call(2, "authenticate", {"methodId": "codesdk-token"})
                assert refused["error"]["code"] == -32000
                new = await peer.call(3, "session/new", {"cwd": str(tmp_path), "mcpServers": []})
                assert new["error"]["code"] == -32000 and "--token" in new["error"]["message"]
                await peer.stdin.aclose()
                assert await peer.process.wait() == 0


async def test_a_data_dir_in_use_is_refused_with_what_to_run_instead(tmp_path: Path) -> None:
    data = str(tmp_path / "data")
    with trio.fail_after(HANG_GUARD_S):
        async with acp_process("--data-dir", data, "acp") as holder:
            assert "result" in await holder.call(1, "initialize", {"protocolVersion": 1})  # its supervisor is up
            second = await trio.run_process([*CLI, "--data-dir", data, "acp"], stdin=subprocess.DEVNULL,
                                            capture_stdout=True, capture_stderr=True, check=False)
            await holder.stdin.aclose()
            assert await holder.process.wait() == 0
    assert second.returncode == 2 and second.stdout == b""  # nothing but protocol on stdout: here, nothing
    assert b"codesdk acp --url" in second.stderr


async def test_lines_json_rpc_refuses_are_answered_and_sessions_wait_for_initialize(tmp_path: Path) -> None:
    workspace = tmp_path / "project"
    workspace.mkdir()
    with trio.fail_after(HANG_GUARD_S):
        async with acp_process("--data-dir", str(tmp_path / "data"), "acp", "--runtime", "scripted") as peer:
            await peer.send({"id": 5})  # no method, no result or error: neither a request nor an answer
            assert (await peer.read())["error"]["code"] == -32600 and peer.seen[-1]["id"] == 5
            for bad_id in ({"x": 1}, True, 1.5):  # ids are strings, integers or null
                await peer.send({"id": bad_id, "method": "initialize", "params": {"protocolVersion": 1}})
                refused = await peer.read()
                assert refused["id"] is None and refused["error"]["code"] == -32600, refused
            early = await peer.call(6, "session/new", {"cwd": str(workspace), "mcpServers": []})
            assert early["error"]["code"] == -32600 and "initialize" in early["error"]["message"]
            assert (await peer.call("seven", "initialize", {"protocolVersion": 1}))["id"] == "seven"
            new = await peer.call(8, "session/new", {"cwd": str(workspace), "mcpServers": []})
            assert new["result"]["sessionId"], new
            await peer.stdin.aclose()
            assert await peer.process.wait() == 0
    error = validator("Error")
    assert all(not list(error.iter_errors(m["error"])) for m in peer.seen if "error" in m)


async def test_a_token_of_several_namespaces_names_one_per_session(make_engine: MakeEngine, tmp_path: Path) -> None:
    async with serve_test_api(make_engine, tmp_path) as api:
        carol = api.tokens.add_principal("carol", ["user:carol", "ci:build"])
        with trio.fail_after(HANG_GUARD_S):
            async with acp_process("--url", f"unix:{api.socket}", "--token", carol, "acp") as peer:
                assert "result" in await peer.call(1, "initialize", {"protocolVersion": 1})
                unnamed = await peer.call(2, "session/new", {"cwd": str(tmp_path), "mcpServers": []})
                said = unnamed["error"]["message"]
                assert unnamed["error"]["code"] == -32602 and "ci:build, user:carol" in said and "--namespace" in said
                named = await peer.call(3, "session/new", {"cwd": str(tmp_path), "mcpServers": [],
                                                           "_meta": {"codesdk": {"namespace": "ci:build"}}})
                assert named["result"]["_meta"]["codesdk"]["namespace"] == "ci:build"
                await peer.stdin.aclose()
                assert await peer.process.wait() == 0
