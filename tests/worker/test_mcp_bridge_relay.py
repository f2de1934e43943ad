"""The bridge's relay (``codesdk.worker.mcp.bridge._relay``) without trio: the handshake is answered with the standard
library alone, a cancelled call is answered at once and its late answer dropped, a worker that breaks its protocol
ends every call in flight, and what the agent writes in one piece is taken whole. The whole bridge is driven by the
``mcp`` package's client in ``test_mcp_bridge.py``; here the relay runs in a thread of this process over real pipes
and a socket pair whose worker end the test holds, and once as the real bridge process."""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import trio
from hypothesis import given
from hypothesis import strategies as st

from codesdk.worker.mcp._messages import Call, Cancel, McpAnswers, McpTool, ToolCallResult
from codesdk.worker.mcp.server import McpServer
from codesdk.worker.mcp.bridge._link import WorkerLink
from codesdk.worker.mcp.bridge._relay import serve
from codesdk.worker.mcp.bridge._wire import MAX_LINE_BYTES, TASK_ENDED, LineReader
from codesdk.worker.mcp.bridge.endpoint import serve_tools

from tests.waits import HANG_GUARD_S
from tests.worker.harness import REPO
from tests.worker.test_mcp_bridge import GUARD_S, TOOLS, Handler, bridge_argv, bridge_env

WORKER_TOOLS = [{"name": "echo", "description": "Answers with its arguments.", "inputSchema": {"type": "object"}}]


def _line(message: dict[str, Any]) -> bytes:
    return json.dumps(message).encode() + b"\n"


def _request(request_id: int, method: str, params: dict[str, Any] | None = None) -> bytes:
    return _line({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params or {}})


INITIALIZE = _request(1, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                        "clientInfo": {"name": "test", "version": "0"}})
INITIALIZED = _line({"jsonrpc": "2.0", "method": "notifications/initialized"})
TOOLS_LIST = _request(2, "tools/list")
PING = _request(4, "ping")


def _call(request_id: int, text: str) -> bytes:
    return _request(request_id, "tools/call", {"name": "echo", "arguments": {"text": text}})


class _Relayed:
    """The relay serving in a thread: the agent's pipes and the worker's end of the socket, as the test holds them."""

    def __init__(self) -> None:
        stdin_read, self.stdin = os.pipe()
        self.wire, wire_write = os.pipe()
        ours, self.worker = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.worker.settimeout(HANG_GUARD_S)
        self._fds = [stdin_read, wire_write]
        link = WorkerLink(ours, LineReader(MAX_LINE_BYTES), WORKER_TOOLS)
        self.thread = threading.Thread(target=self._serve, args=(link, wire_write, stdin_read), daemon=True)
        self.thread.start()
        self._buffer = b""
        self._worker_buffer = b""

    def _serve(self, link: WorkerLink, wire_write: int, stdin_read: int) -> None:
        serve(link, wire_write, stdin_read)
        for fd in self._fds:
            os.close(fd)  # the relay is over: the agent sees its stdout end

    def write(self, data: bytes) -> None:
        os.write(self.stdin, data)

    def answer(self) -> dict[str, Any]:
        """The next message the relay wrote to the agent."""
        while b"\n" not in self._buffer:
            readable, _, _ = select.select([self.wire], [], [], HANG_GUARD_S)
            assert readable, f"no answer from the relay within {HANG_GUARD_S:g} s"
            chunk = os.read(self.wire, 65536)
            assert chunk, "the relay's stdout ended"
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return dict(json.loads(line))

    def call_at_worker(self) -> dict[str, Any]:
        while b"\n" not in self._worker_buffer:
            chunk = self.worker.recv(65536)
            assert chunk, "the relay closed the worker's socket"
            self._worker_buffer += chunk
        line, self._worker_buffer = self._worker_buffer.split(b"\n", 1)
        return dict(json.loads(line))

    def ended(self) -> bool:
        self.thread.join(HANG_GUARD_S)
        return not self.thread.is_alive()


@contextmanager
def _relayed() -> Iterator[_Relayed]:
    relay = _Relayed()
    try:
        yield relay
    finally:
        os.close(relay.stdin)
        relay.worker.close()
        relay.thread.join(HANG_GUARD_S)
        os.close(relay.wire)


def test_the_handshake_is_answered_without_the_worker_and_a_call_goes_to_it() -> None:
    with _relayed() as relay:
        relay.write(INITIALIZE + INITIALIZED + TOOLS_LIST + _call(3, "hi") + PING[:10])
        initialize, tools = relay.answer(), relay.answer()
        assert initialize["id"] == 1 and initialize["result"]["protocolVersion"] == "2025-06-18"
        assert tools == {"jsonrpc": "2.0", "id": 2, "result": {"tools": WORKER_TOOLS}}
        call = relay.call_at_worker()
        assert (call["type"], call["name"], call["arguments"]) == ("call", "echo", {"text": "hi"})
        relay.write(PING[10:])
        assert relay.answer() == {"jsonrpc": "2.0", "id": 4, "result": {}}, "what followed the call was lost"
        relay.worker.sendall(_line({"type": "result", "id": call["id"], "text": "hi back", "isError": False}))
        assert relay.answer()["result"]["content"] == [{"type": "text", "text": "hi back"}]


def test_a_cancelled_call_is_answered_at_once_and_its_late_answer_dropped() -> None:
    with _relayed() as relay:
        relay.write(_call(7, "slow") + _call(8, "fast"))
        slow, fast = relay.call_at_worker(), relay.call_at_worker()
        relay.write(_line({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 7}}))
        assert relay.answer() == {"jsonrpc": "2.0", "id": 7, "error": {"code": -32800, "message": "Request cancelled"}}
        relay.worker.sendall(_line({"type": "result", "id": slow["id"], "text": "too late"})
                             + _line({"type": "result", "id": fast["id"], "text": "in time"}))
        answer = relay.answer()
        assert answer["id"] == 8 and answer["result"]["content"][0]["text"] == "in time"


def test_a_worker_that_breaks_its_protocol_ends_every_call_in_flight_and_the_relay() -> None:
    with _relayed() as relay:
        relay.write(_call(3, "a") + _call(4, "b"))
        relay.call_at_worker()
        relay.call_at_worker()
        relay.worker.sendall(b"not a json line\n")
        answers = [relay.answer(), relay.answer()]
        assert sorted(answer["id"] for answer in answers) == [3, 4]
        assert all(answer["result"] == {"content": [{"type": "text", "text": TASK_ENDED}], "isError": True}
                   for answer in answers)
        assert relay.ended()


def test_answers_still_reach_the_agent_while_the_worker_reads_no_more_calls() -> None:
    """The worker stops reading (at its bound of calls in flight, it answers inline) while the agent sends more than
    the socket holds: the relay keeps what the socket does not take and goes on reading the worker's answers. A
    relay that waited for the socket would stop reading too, and both sides would wait for ever."""
    with _relayed() as relay:
        relay.write(_call(1, "first"))
        first = relay.call_at_worker()
        big = "x" * 16_000
        flood = b"".join(_call(100 + n, big) for n in range(64))  # ~1 MB: far more than the socket's buffers
        threading.Thread(target=relay.write, args=(flood,), daemon=True).start()
        relay.worker.sendall(_line({"type": "result", "id": first["id"], "text": "done"}))
        assert relay.answer()["id"] == 1
        calls = [relay.call_at_worker() for _ in range(64)]
        assert [call["arguments"]["text"] == big for call in calls] == [True] * 64


def test_a_line_that_is_not_json_gets_a_parse_error_and_the_relay_goes_on() -> None:
    with _relayed() as relay:
        relay.write(b"{not json\n" + PING)
        assert relay.answer()["error"]["code"] == -32700
        assert relay.answer()["id"] == 4


def test_the_bridge_imports_neither_trio_nor_mcp() -> None:
    probe = ("import sys; import codesdk.worker.mcp.bridge.main, codesdk.worker.mcp.bridge._relay; "
             "print(sorted(name for name in ('trio', 'mcp', 'pydantic') if name in sys.modules))")
    found = subprocess.run([sys.executable, "-I", "-c", probe], capture_output=True, text=True, check=True, cwd=REPO)
    assert found.stdout.strip() == "[]"


async def test_a_call_written_with_the_handshake_in_one_piece_reaches_the_worker(tmp_path: Path) -> None:
    """The real bridge process: the handshake, a call and a ping in one write; each is answered once."""
    handler = Handler()
    with trio.fail_after(GUARD_S):
        async with serve_tools(TOOLS, handler, directory=tmp_path) as endpoint, trio.open_nursery() as nursery:
            bridge: trio.Process = await nursery.start(partial(
                trio.run_process, bridge_argv(endpoint), env=bridge_env(endpoint), cwd=tmp_path,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, check=False))
            assert bridge.stdin is not None and bridge.stdout is not None
            await bridge.stdin.send_all(INITIALIZE + INITIALIZED + TOOLS_LIST + _call(3, "hi") + PING)
            answers: dict[int, dict[str, Any]] = {}
            buffer = b""
            while len(answers) < 4:
                chunk = await bridge.stdout.receive_some()
                assert chunk, f"the bridge's stdout ended with answers to {sorted(answers)} only"
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    message = json.loads(line)
                    assert message["id"] not in answers, f"answered twice: {message}"
                    answers[message["id"]] = message
            await bridge.stdin.aclose()
            assert await bridge.wait() == 0
    assert [call.name for call in handler.calls] == ["echo"]
    assert json.loads(answers[3]["result"]["content"][0]["text"]) == {"text": "hi"}
    assert answers[4]["result"] == {} and {tool["name"] for tool in answers[2]["result"]["tools"]} == {
        tool.name for tool in TOOLS}


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                     max_leaves=8)
_methods = st.sampled_from(["initialize", "ping", "tools/list", "tools/call", "notifications/cancelled",
                            "notifications/initialized", "resources/list"]) | st.text(max_size=12)


@given(message=_json | st.fixed_dictionaries({"jsonrpc": st.just("2.0"), "method": _methods}, optional={
    "id": st.integers() | st.text(max_size=4) | st.booleans() | st.none(), "params": _json}))
def test_every_message_gets_one_well_formed_step(message: Any) -> None:
    """Whatever an agent sends, ``McpAnswers.step`` decides without raising: an answer to write (carrying the
    request's own id when it had a usable one), nothing, a call of a tool we serve, or a cancellation."""
    answers = McpAnswers("codesdk", "1", [McpTool("echo", "", {"type": "object"})])
    step = answers.step(message)
    if isinstance(step, Call):
        assert step.name == "echo" and isinstance(step.arguments, dict) and isinstance(step.meta, dict)
        assert step.request_id == message["id"]
    elif isinstance(step, dict):
        assert step["jsonrpc"] == "2.0" and ("result" in step) != ("error" in step)
        json.dumps(step)  # writable as it is
        request_id = message.get("id") if isinstance(message, dict) else None
        if isinstance(request_id, str | int) and not isinstance(request_id, bool) and "error" not in step:
            assert step["id"] == request_id
    elif isinstance(step, Cancel):
        assert isinstance(step.request_id, str | int) and not isinstance(step.request_id, bool)
        hash(step.request_id)  # a key the servers can look calls up by
    else:
        assert step is None


async def test_a_cancellation_of_a_request_id_no_request_can_have_is_ignored() -> None:
    """``notifications/cancelled`` naming a list, an object or a boolean: nothing to cancel, nothing raised (the
    in-process server looks calls up by id)."""

    async def never(name: str, arguments: dict[str, Any], meta: dict[str, Any]) -> ToolCallResult:
        raise AssertionError("no call was made")

    server = McpServer("codesdk", "1", [McpTool("echo", "", {"type": "object"})], never)
    for request_id in ([1], {"a": 1}, True, None, 1.5):
        cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": request_id}}
        assert await server.handle(cancel) is None
        assert server.answers.step(cancel) is None
