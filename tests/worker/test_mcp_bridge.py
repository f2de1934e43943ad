"""The MCP bridge (``codesdk.worker.mcp.bridge``): the REAL bridge process, driven over its stdio by the ``mcp`` package's
client (or by hand-written JSON-RPC lines), against a worker endpoint served in this test.

What it must hold: the agent sees exactly the task's tools and each call reaches the handler as the model made it
(less Gemini CLI's scheduling argument); answers come back shaped for Gemini CLI; and nothing but the task's own
bridge, with the task's own token, while the task lives, reaches the handler.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any, TextIO

import pytest
import trio
import trio.testing
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPError

from codesdk.worker.mcp.bridge import endpoint as _endpoint
from codesdk.worker.mcp.bridge.endpoint import (
    BridgeAnswer,
    BridgeCall,
    BridgeEndpoint,
    BridgeTool,
    bridge_command,
    serve_tools,
)
from codesdk.worker.mcp.bridge._wire import SOCKET_ENV, TASK_ENDED, TOKEN_ENV, socket_address

from tests.worker.harness import REPO

#: A hang guard only a broken bridge reaches (a cold bridge starts in ~1 s).
GUARD_S = 60
#: A uid nothing on the machine runs as.
STRANGER_UID = 3910099

OBJECT = {"type": "object", "properties": {"text": {"type": "string"}}}
TOOLS = [
    BridgeTool("echo", "Answers with its arguments as JSON.", OBJECT),
    BridgeTool("text", "Answers with the text it is given.", OBJECT),
    BridgeTool("scheduled", "Declares wait_for_previous itself.",
               {"type": "object", "properties": {"wait_for_previous": {"type": "boolean"}}}),
    BridgeTool("fail", "Its handler raises.", {"properties": {}}),
    BridgeTool("block", "Its handler waits until released (or cancelled).", {"type": "object"}),
]


class Handler:
    """The worker's side of each call, recording what reached it."""

    def __init__(self) -> None:
        self.calls: list[BridgeCall] = []
        self.blocked = trio.Event()  # a "block" call is running
        self.release = trio.Event()
        self.cancelled = trio.Event()  # a "block" call was cancelled
        self.finished: list[str] = []  # the "text" arguments, in the order their calls finished

    async def __call__(self, call: BridgeCall) -> BridgeAnswer:
        self.calls.append(call)
        if call.name == "fail":
            raise RuntimeError("the tool broke")
        if call.name == "block":
            self.blocked.set()
            try:
                await self.release.wait()
            except trio.Cancelled:
                self.cancelled.set()
                raise
            return BridgeAnswer("released")
        if call.name == "text":
            self.finished.append(call.arguments["text"])
            return BridgeAnswer(call.arguments["text"], is_error=call.arguments.get("error", False))
        return BridgeAnswer(json.dumps(call.arguments))


def bridge_env(endpoint: BridgeEndpoint, **overrides: str) -> dict[str, str]:
    entry = endpoint.mcp_server()
    env = {item["name"]: item["value"] for item in entry["env"]}
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **env, **overrides}


def bridge_argv(endpoint: BridgeEndpoint) -> list[str]:
    entry = endpoint.mcp_server()
    return [entry["command"], *entry["args"]]


@asynccontextmanager
async def bridge_session(endpoint: BridgeEndpoint, cwd: Path, argv: list[str] | None = None,
                         ) -> AsyncIterator[ClientSession]:
    """The bridge spawned as an ACP agent would (its entry's command, args and env; cwd = the workspace), with an
    initialized MCP client session on its stdio."""
    command, *args = argv or bridge_argv(endpoint)
    params = StdioServerParameters(command=command, args=args, env=bridge_env(endpoint), cwd=cwd)
    with _errlog(cwd) as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            yield session


async def run_bridge(env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[bytes]:
    """The bridge run to its end with ``env`` and nothing on stdin: how it exits and what it said."""
    return await trio.run_process([sys.executable, "-I", "-m", "codesdk.worker.mcp.bridge"], env=env, cwd=cwd, stdin=b"",
                                  capture_stdout=True, capture_stderr=True, check=False)


def text_of(result: Any) -> str:
    return str(result.content[0].text)


# -- tools and calls ------------------------------------------------------------------------------------


async def test_the_agent_sees_exactly_the_tasks_tools(tmp_path: Path) -> None:
    with trio.fail_after(GUARD_S):
        async with serve_tools(TOOLS, Handler(), directory=tmp_path) as endpoint, \
                bridge_session(endpoint, tmp_path) as session:
            listed = (await session.list_tools()).tools
    assert [(t.name, t.description) for t in listed] == [(t.name, t.description) for t in TOOLS]
    assert listed[0].input_schema == OBJECT
    assert listed[3].input_schema == {"type": "object", "properties": {}}  # MCP: always an object schema


async def test_a_call_reaches_the_handler_as_made_less_geminis_scheduling_argument(tmp_path: Path) -> None:
    handler = Handler()
    with trio.fail_after(GUARD_S):
        async with serve_tools(TOOLS, handler, directory=tmp_path) as endpoint, \
                bridge_session(endpoint, tmp_path) as session:
            result = await session.call_tool("echo", {"text": "hi", "n": [1, 2], "wait_for_previous": True},
                                             meta={"progress_token": 7})
            declared = await session.call_tool("scheduled", {"wait_for_previous": False})
    assert not result.is_error
    assert json.loads(text_of(result)) == {"text": "hi", "n": [1, 2]}
    assert handler.calls[0] == BridgeCall("echo", {"text": "hi", "n": [1, 2]}, {"progressToken": 7})
    assert handler.calls[1].arguments == {"wait_for_previous": False}  # the tool's own argument stays
    assert not declared.is_error


#: A result's text -> the ``structuredContent`` that goes out with it.
STRUCTURED: list[tuple[str, dict[str, Any] | None]] = [
    ("42", {"result": 42}), ("[1, 2]", {"result": [1, 2]}), ('"quoted"', {"result": "quoted"}),
    ("true", {"result": True}), ("null", {"result": None}),
    ('{"already": "an object"}', None), ("plain words", None), ("NaN", None), ("", None),
]


async def test_a_json_text_that_is_not_an_object_also_goes_out_as_structured_content(tmp_path: Path) -> None:
    with trio.fail_after(GUARD_S):
        async with serve_tools(TOOLS, Handler(), directory=tmp_path) as endpoint, \
                bridge_session(endpoint, tmp_path) as session:
            results = [await session.call_tool("text", {"text": text}) for text, _ in STRUCTURED]
    assert [(text_of(r), r.structured_content) for r in results] == STRUCTURED


async def test_errors_reach_the_model_as_tool_errors_and_the_bridge_goes_on(tmp_path: Path) -> None:
    handler = Handler()
    with trio.fail_after(GUARD_S):
        async with serve_tools(TOOLS, handler, directory=tmp_path) as endpoint, \
                bridge_session(endpoint, tmp_path) as session:
            raised = await session.call_tool("fail", {})
            with pytest.raises(MCPError, match="Unknown tool: no_such_tool") as unknown:  # MCP: a protocol error
                await session.call_tool("no_such_tool", {})
            reported = await session.call_tool("text", {"text": "denied by policy", "error": True})
            after = await session.call_tool("text", {"text": "still here"})
    assert raised.is_error and "internal error (RuntimeError)" in text_of(raised)
    assert "the tool broke" not in text_of(raised)  # the exception is logged, not shown to the model
    assert unknown.value.error.code == -32602
    assert reported.is_error and text_of(reported) == "denied by policy"
    assert not after.is_error and text_of(after) == "still here"
    assert [call.name for call in handler.calls] == ["fail", "text", "text"]  # the unknown tool never ran


async def test_parallel_calls_are_answered_as_they_finish(tmp_path: Path) -> None:
    handler = Handler()
    results: dict[str, str] = {}
    with trio.fail_after(GUARD_S):
        async with serve_tools(TOOLS, handler, directory=tmp_path) as endpoint, \
                bridge_session(endpoint, tmp_path) as session:

            async def call(name: str, arguments: dict[str, Any]) -> None:
                results[name] = text_of(await session.call_tool(name, arguments))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(call, "block", {})
                await handler.blocked.wait()  # the first call is in flight...
                await call("text", {"text": "second"})  # ...while the second is answered
                assert "block" not in results
                handler.release.set()
    assert results == {"text": "second", "block": "released"}


# -- isolation ------------------------------------------------------------------------------------------


async def test_the_endpoint_is_a_private_directory_of_ours(tmp_path: Path) -> None:
    async with serve_tools(TOOLS, Handler(), directory=tmp_path) as endpoint:
        info = endpoint.directory.stat()
        assert stat.S_IMODE(info.st_mode) == 0o700 and info.st_uid == os.geteuid()
        assert endpoint.directory.parent == tmp_path and endpoint.directory.name.startswith("codesdk-mcp-")
        assert stat.S_ISSOCK(endpoint.socket_path.stat().st_mode)
        assert endpoint.token not in repr(endpoint)
        entry = endpoint.mcp_server("tools")
        assert entry == {"name": "tools", "command": bridge_argv(endpoint)[0], "args": bridge_argv(endpoint)[1:],
                         "env": [{"name": SOCKET_ENV, "value": str(endpoint.socket_path)},
                                 {"name": TOKEN_ENV, "value": endpoint.token}]}


async def test_each_endpoint_has_its_own_directory_and_token(tmp_path: Path) -> None:
    async with serve_tools(TOOLS, Handler(), directory=tmp_path) as a, \
            serve_tools(TOOLS, Handler(), directory=tmp_path) as b:
        assert a.directory != b.directory and a.token != b.token


async def test_a_wrong_token_is_refused_and_the_bridge_exits_2(tmp_path: Path) -> None:
    handler = Handler()
    async with serve_tools(TOOLS, handler, directory=tmp_path) as endpoint:
        ran = await run_bridge(bridge_env(endpoint, CODESDK_BRIDGE_TOKEN="guessed"), tmp_path)
    assert ran.returncode == 2
    assert ran.stderr.decode().strip() == ("codesdk mcp bridge: CodeSDK's worker refused the connection: wrong token "
                                           "(the task may have ended)")
    assert ran.stdout == b"" and not handler.calls


async def test_one_tasks_token_does_not_open_another_tasks_socket(tmp_path: Path) -> None:
    first, second = Handler(), Handler()
    async with serve_tools(TOOLS, first, directory=tmp_path) as a, \
            serve_tools(TOOLS, second, directory=tmp_path) as b:
        ran = await run_bridge(bridge_env(b, CODESDK_BRIDGE_TOKEN=a.token), tmp_path)
    assert ran.returncode == 2 and b"wrong token" in ran.stderr
    assert not first.calls and not second.calls


async def test_once_the_task_ended_its_token_and_socket_are_dead(tmp_path: Path) -> None:
    async with serve_tools(TOOLS, Handler(), directory=tmp_path) as endpoint:
        pass
    assert not endpoint.directory.exists()
    ran = await run_bridge(bridge_env(endpoint), tmp_path)
    assert ran.returncode == 2
    assert b"cannot reach CodeSDK's worker" in ran.stderr and b"No such file or directory" in ran.stderr


async def test_without_its_environment_the_bridge_exits_2(tmp_path: Path) -> None:
    ran = await run_bridge({"PATH": os.environ.get("PATH", "")}, tmp_path)
    assert ran.returncode == 2 and SOCKET_ENV.encode() in ran.stderr


def _connect_as(uid: int, path: Path, token: str) -> int:
    """In a forked child that became ``uid``: connect to ``path`` and say hello with ``token``. Its exit status:
    10 the socket could not be opened (EACCES), 20 refused by the worker, 21 accepted, 9x something else."""
    pid = os.fork()
    if pid == 0:  # the child: no trio, no pytest; only os._exit
        code = 98
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            client.settimeout(GUARD_S)
            try:
                client.connect(str(path))
            except PermissionError:
                os._exit(10)
            client.sendall(json.dumps({"type": "hello", "token": token}).encode() + b"\n")
            answer = b""
            while b"\n" not in answer and (chunk := client.recv(4096)):
                answer += chunk
            code = 20 if json.loads(answer.split(b"\n")[0]).get("type") == "refused" else 21
        except (OSError, ValueError):
            code = 99
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a client as another uid (setuid)")
async def test_a_peer_of_another_uid_cannot_open_the_socket_nor_be_served(open_tmp: Path) -> None:
    handler = Handler()
    async with serve_tools(TOOLS, handler, directory=open_tmp) as endpoint:
        connect = partial(_connect_as, STRANGER_UID, endpoint.socket_path, endpoint.token)
        assert await trio.to_thread.run_sync(connect) == 10  # the 0700 directory: EACCES
        # Were the directory opened up, the peer check still refuses it (and even with the right token).
        os.chmod(endpoint.directory, 0o755)
        os.chmod(endpoint.socket_path, 0o777)
        assert await trio.to_thread.run_sync(connect) == 20
    assert not handler.calls


async def test_a_client_that_never_says_hello_blocks_nobody_and_is_dropped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_endpoint, "HELLO_TIMEOUT_S", 0.5)
    with trio.fail_after(GUARD_S):
        async with serve_tools(TOOLS, Handler(), directory=tmp_path) as endpoint:
            silent = await _raw_connection(endpoint)
            async with bridge_session(endpoint, tmp_path) as session:  # served while the silent one waits
                assert text_of(await session.call_tool("text", {"text": "served"})) == "served"
            refusal = await _read_all(silent)
    assert json.loads(refusal) == {"type": "refused", "reason": "no hello within 0.5 s"}


async def test_lines_that_break_the_protocol_are_refused_without_reaching_the_handler(tmp_path: Path) -> None:
    handler = Handler()
    after_hello = [b'{"type": "call", "id": 1, "name": "echo", "arguments": []}\n', b"not json\n",
                  b'{"type": "call", "name": "echo"}\n', b'{"type": "shutdown"}\n']
    async with serve_tools(TOOLS, handler, directory=tmp_path) as endpoint:
        for line in [b'{"type": "call", "id": 1, "name": "echo"}\n', b'{"type": "hello", "token": 5}\n']:
            stream = await _raw_connection(endpoint)
            await stream.send_all(line)
            assert json.loads(await _read_all(stream))["type"] == "refused"
        for line in after_hello:
            stream = await _raw_connection(endpoint)
            await stream.send_all(json.dumps({"type": "hello", "token": endpoint.token}).encode() + b"\n" + line)
            tools, refusal = (await _read_all(stream)).splitlines()
            assert json.loads(tools)["type"] == "tools" and json.loads(refusal)["type"] == "refused"
    assert not handler.calls


async def test_connections_and_calls_in_flight_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_endpoint, "MAX_CALLS_IN_FLIGHT", 1)
    handler = Handler()
    with trio.fail_after(GUARD_S):
        async with serve_tools(TOOLS, handler, directory=tmp_path) as endpoint:
            silent = [await _raw_connection(endpoint) for _ in range(_endpoint.MAX_CONNECTIONS)]
            await trio.testing.wait_all_tasks_blocked()  # each is taken, and waits for its hello
            assert json.loads(await _read_all(await _raw_connection(endpoint))) == {
                "type": "refused", "reason": f"too many connections ({_endpoint.MAX_CONNECTIONS} are open)"}
            for stream in silent:
                await stream.aclose()
            stream = await _raw_connection(endpoint)  # served again once the silent ones are gone
            await stream.send_all(json.dumps({"type": "hello", "token": endpoint.token}).encode() + b"\n"
                                  + b'{"type": "call", "id": 1, "name": "block", "arguments": {}}\n'
                                  + b'{"type": "call", "id": 2, "name": "block", "arguments": {}}\n')
            lines = _Lines(stream)
            assert json.loads(await lines.next())["type"] == "tools"
            assert json.loads(await lines.next()) == {
                "type": "result", "id": 2, "isError": True,
                "text": "too many tool calls at once (at most 1); call again when some have finished"}
            handler.release.set()
            assert json.loads(await lines.next()) == {"type": "result", "id": 1, "text": "released", "isError": False}
            await stream.aclose()
    assert len(handler.calls) == 1


async def test_a_long_line_before_the_hello_is_refused_at_once(tmp_path: Path) -> None:
    async with serve_tools(TOOLS, Handler(), directory=tmp_path) as endpoint:
        stream = await _raw_connection(endpoint)
        await stream.send_all(b'{"type": "hello", "token": "' + b"x" * _endpoint.MAX_HELLO_BYTES)  # no newline
        refusal = json.loads(await _read_all(stream))
    assert refusal["type"] == "refused" and "exceeds the frame limit of 4096 bytes" in refusal["reason"]


async def test_a_closed_connection_cancels_its_calls(tmp_path: Path) -> None:
    handler = Handler()
    with trio.fail_after(GUARD_S):
        async with serve_tools(TOOLS, handler, directory=tmp_path) as endpoint:
            stream = await _raw_connection(endpoint)
            await stream.send_all(json.dumps({"type": "hello", "token": endpoint.token}).encode() + b"\n"
                                  + b'{"type": "call", "id": "a", "name": "block", "arguments": {}}\n')
            await handler.blocked.wait()
            await stream.aclose()
            await handler.cancelled.wait()


def test_tool_names_must_be_what_agents_accept() -> None:
    for bad in (["has.dot"], ["x" * 65], [""], ["twice", "twice"]):
        with pytest.raises(ValueError, match="tool names"):
            _endpoint._Service([BridgeTool(name, "", {}) for name in bad], Handler())


# -- ending ---------------------------------------------------------------------------------------------


async def test_cancelling_the_endpoint_ends_everything_while_a_call_is_in_flight(tmp_path: Path) -> None:
    handler = Handler()
    endpoints: list[BridgeEndpoint] = []
    served, ended = trio.Event(), trio.Event()
    scope = trio.CancelScope()

    async def task() -> None:
        with scope:
            async with serve_tools(TOOLS, handler, directory=tmp_path) as endpoint:
                endpoints.append(endpoint)
                served.set()
                await trio.sleep_forever()
        ended.set()

    with trio.fail_after(GUARD_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(task)
            await served.wait()
            answers: list[Any] = []
            async with bridge_session(endpoints[0], tmp_path) as session, trio.open_nursery() as calls:
                calls.start_soon(lambda: _append(answers, session.call_tool("block", {})))
                await handler.blocked.wait()
                scope.cancel()
            await ended.wait()
    assert answers[0].is_error and text_of(answers[0]) == TASK_ENDED
    assert handler.cancelled.is_set()
    assert not endpoints[0].directory.exists()


async def test_the_bridge_answers_and_exits_when_its_task_ends_though_stdin_stays_open(tmp_path: Path) -> None:
    handler = Handler()
    with trio.fail_after(GUARD_S):
        async with trio.open_nursery() as nursery:
            with trio.CancelScope() as task_scope:
                async with serve_tools(TOOLS, handler, directory=tmp_path) as endpoint:
                    bridge, agent = await _start_by_hand(nursery, endpoint, tmp_path)
                    await agent.send({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                                      "params": {"name": "block", "arguments": {}}})
                    await handler.blocked.wait()
                    task_scope.cancel()
            answer = await agent.response(2)
            assert answer["result"]["isError"] is True
            assert answer["result"]["content"] == [{"type": "text", "text": TASK_ENDED}]
            assert await bridge.wait() == 0  # exited by itself: its stdin is still open
            assert bridge.stdin is not None
            await bridge.stdin.aclose()


async def test_the_bridge_exits_when_the_agent_closes_its_stdin_and_its_calls_end(tmp_path: Path) -> None:
    handler = Handler()
    with trio.fail_after(GUARD_S):
        async with serve_tools(TOOLS, handler, directory=tmp_path) as endpoint, trio.open_nursery() as nursery:
            bridge, agent = await _start_by_hand(nursery, endpoint, tmp_path)
            await agent.send({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                              "params": {"name": "block", "arguments": {}}})
            await handler.blocked.wait()
            assert bridge.stdin is not None
            await bridge.stdin.aclose()
            assert await bridge.wait() == 0
            await handler.cancelled.wait()  # its connection closed: nobody is left to read the answer


# -- how the agent starts it ----------------------------------------------------------------------------


def _plant_packages(workspace: Path) -> None:
    """What a hostile tenant could leave in the workspace the agent starts the bridge in."""
    for name in ("worker", "mcp", "trio"):
        (workspace / name).mkdir(parents=True)
        (workspace / name / "__init__.py").write_text("raise SystemExit('a planted package was imported')\n")


@pytest.mark.parametrize("form", ["console script", "python -I"])
async def test_a_package_planted_in_the_workspace_is_not_imported(tmp_path: Path, form: str) -> None:
    workspace = tmp_path / "workspace"
    _plant_packages(workspace)
    async with serve_tools(TOOLS, Handler(), directory=tmp_path) as endpoint:
        argv = bridge_argv(endpoint) if form == "console script" else [sys.executable, "-I", "-m",
                                                                         "codesdk.worker.mcp.bridge"]
        if form == "console script":
            assert argv == [str(Path(sys.executable).with_name("codesdk-worker")), "mcp-bridge"]
        with trio.fail_after(GUARD_S):
            async with bridge_session(endpoint, workspace, argv) as session:
                assert text_of(await session.call_tool("text", {"text": "genuine"})) == "genuine"


def test_without_the_console_script_the_interpreter_runs_isolated(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python3"))
    assert bridge_command() == [str(tmp_path / "python3"), "-I", "-m", "codesdk.worker.mcp.bridge"]


async def test_a_socket_path_too_long_for_sun_path_works(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    with trio.fail_after(GUARD_S):
        async with serve_tools(TOOLS, Handler(), directory=deep) as endpoint:
            assert len(os.fsencode(endpoint.socket_path)) > 108
            async with bridge_session(endpoint, tmp_path) as session:
                assert text_of(await session.call_tool("text", {"text": "far"})) == "far"
    assert not endpoint.directory.exists()


def test_the_repo_is_what_the_bridge_runs() -> None:
    """The editable install resolves ``codesdk.worker`` to this checkout under ``-I`` too."""
    ran = subprocess.run([sys.executable, "-I", "-c", "import codesdk.worker; print(codesdk.worker.__file__)"], cwd="/",
                         capture_output=True, text=True, check=True)
    assert Path(ran.stdout.strip()).resolve() == REPO / "worker" / "__init__.py"


# -- helpers ----------------------------------------------------------------------------------------------


def _errlog(directory: Path) -> TextIO:
    """Where a bridge's stderr goes (read it when a test fails)."""
    return open(directory / "bridge.stderr", "a")


async def _append(into: list[Any], awaitable: Any) -> None:
    into.append(await awaitable)


async def _raw_connection(endpoint: BridgeEndpoint) -> trio.SocketStream:
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with socket_address(endpoint.socket_path) as address:
        await sock.connect(address)
    return trio.SocketStream(sock)


async def _read_all(stream: trio.SocketStream) -> bytes:
    """Everything until the worker closes the connection."""
    data = b""
    while chunk := await stream.receive_some():
        data += chunk
    await stream.aclose()
    return data


async def _start_by_hand(nursery: trio.Nursery, endpoint: BridgeEndpoint, cwd: Path,
                         ) -> tuple[trio.Process, _JsonRpcPeer]:
    """The bridge started in ``nursery`` and initialized by hand-written JSON-RPC (what a client sends first)."""
    with _errlog(cwd) as errlog:
        bridge: trio.Process = await nursery.start(partial(
            trio.run_process, bridge_argv(endpoint), env=bridge_env(endpoint), cwd=cwd, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=errlog, check=False))
    agent = _JsonRpcPeer(bridge)
    await agent.request(1, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                          "clientInfo": {"name": "test", "version": "0"}})
    await agent.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    return bridge, agent


class _Lines:
    """The worker's lines on a raw connection."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buffer = b""

    async def next(self) -> bytes:
        while b"\n" not in self.buffer:
            chunk = await self.stream.receive_some()
            if not chunk:
                raise AssertionError("the worker closed the connection")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line


class _JsonRpcPeer:
    """An agent's MCP client by hand: JSON-RPC lines on the bridge's stdin and stdout."""

    def __init__(self, process: trio.Process) -> None:
        assert process.stdin is not None and process.stdout is not None
        self.stdin, self.stdout = process.stdin, process.stdout
        self.buffer = b""

    async def send(self, message: dict[str, Any]) -> None:
        await self.stdin.send_all(json.dumps(message).encode() + b"\n")

    async def request(self, request_id: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
        await self.send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        return await self.response(request_id)

    async def response(self, request_id: int) -> dict[str, Any]:
        while True:
            while b"\n" in self.buffer:
                line, self.buffer = self.buffer.split(b"\n", 1)
                message: dict[str, Any] = json.loads(line)
                if message.get("id") == request_id and "method" not in message:
                    return message
            chunk = await self.stdout.receive_some()
            if not chunk:
                raise AssertionError(f"the bridge's stdout ended before the answer to {request_id}")
            self.buffer += chunk

