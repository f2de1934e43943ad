"""The worker's end of the MCP bridge: one private unix socket per task, serving that task's tools.

Why: an ACP agent (Gemini CLI, OpenCode) takes MCP servers as commands it spawns itself. CodeSDK's tools reach it
as the bridge (``python -m codesdk.worker.mcp.bridge``), a stdio MCP server that relays every ``tools/call`` here, where the
task's adapter turns it into the supervisor's decision and execution. The agent, and whatever a hostile tenant makes
it run, must not reach another task's tools, nor this task's once it has ended; so each task gets:

- a fresh directory (mode 0700, random name) holding the socket: other uids cannot even open it;
- a fresh token (``secrets.token_urlsafe(32)``) that the bridge must present first, compared in constant time;
- a peer check (``SO_PEERCRED``): a peer of another uid is refused even if it reached the socket;
- an end: leaving ``serve_tools`` cancels every connection and handler call, closes the socket, removes the
  directory. The token is then dead.

Every resource a connection can take is bounded: ``MAX_CONNECTIONS`` at once, ``HELLO_TIMEOUT_S`` to say hello,
``MAX_HELLO_BYTES`` before the hello and ``MAX_LINE_BYTES`` after it per line, ``MAX_CALLS_IN_FLIGHT`` per
connection (more are answered with an error, unrun).

The socket protocol: one JSON object per line (UTF-8, ``\\n``-terminated, at most ``MAX_LINE_BYTES``)::

    bridge -> worker  {"type": "hello", "token": "<token>"}       first line, always; then wait for the answer
    worker -> bridge  {"type": "tools", "tools": [{"name", "description", "inputSchema"}, ...]}   hello accepted
    worker -> bridge  {"type": "refused", "reason": "..."}           then the worker closes the connection
    bridge -> worker  {"type": "call", "id": <int|str>, "name": "...", "arguments": {...}, "meta": {...}}
    worker -> bridge  {"type": "result", "id": <the call's id>, "text": "...", "isError": false}

Calls may overlap (an agent's parallel tool calls); each is answered once, by id, in whatever order they finish.
``meta`` is the MCP ``tools/call`` ``_meta`` (``progressToken``...). A connection may hold several calls; several
connections may use one token while the task lives (an agent may restart its MCP server). A line that breaks this
protocol gets ``refused`` and the connection is closed. A connection that closes cancels its calls still running:
nobody is left to read their answers. Leaving ``serve_tools`` cancels them all: a handler must expect cancellation.
"""

from __future__ import annotations

import hmac
import logging
import os
import re
import secrets
import shutil
import socket
import struct
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import trio

from codesdk.protocol import BadFrame, LineFramer, decode_json

from ... import _recording as recording
from ..server import McpTool
from ._wire import MAX_LINE_BYTES, SOCKET_ENV, TOKEN_ENV, encode_line, socket_address

log = logging.getLogger("codesdk.worker.mcp_bridge")

#: The socket's name inside the endpoint's directory.
SOCKET_NAME = "bridge.sock"
#: A connection must say hello within this long, or it is refused (a stray client cannot hold a slot).
HELLO_TIMEOUT_S = 10.0
#: Connections (said hello or not) one endpoint serves at once; more are refused.
MAX_CONNECTIONS = 8
#: Longest line before the hello is accepted: a connection without the token buffers next to nothing.
MAX_HELLO_BYTES = 4096
#: How long a refused peer has to read why and close, before we close on it.
REFUSAL_GRACE_S = 2.0
#: Calls one connection may have running at once; more are answered with an error without running.
MAX_CALLS_IN_FLIGHT = 64
#: How names the agent sees look (what MCP clients and model APIs accept).
TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_MAX_ID_CHARS = 128
_MAX_JSON_INT = 2**53 - 1
_LISTEN_BACKLOG = 16
_READ_CHUNK_BYTES = 64 * 1024
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


#: One tool as the agent sees it (``name``: [A-Za-z0-9_-], at most 64 characters): what the bridge's MCP server lists.
BridgeTool = McpTool


@dataclass(frozen=True)
class BridgeCall:
    """One ``tools/call`` the agent made: the tool's name, its arguments, and the request's ``_meta``."""

    name: str
    arguments: dict[str, Any]
    meta: dict[str, Any]


@dataclass(frozen=True)
class BridgeAnswer:
    """What the model reads back: text, and whether it is an error."""

    text: str
    is_error: bool = False


#: Turns one call into its answer: the supervisor's decision and execution. Runs concurrently with other calls;
#: cancelled when its connection closes or ``serve_tools`` ends. An exception it raises becomes an error answer.
CallHandler = Callable[[BridgeCall], Awaitable[BridgeAnswer]]


def bridge_command() -> list[str]:
    """How the agent starts the bridge: the ``codesdk-worker`` console script beside our interpreter, else the
    interpreter isolated (``-I``: the agent runs it in the tenant's workspace, where a planted ``worker/`` package
    must not be imported; the console script's ``sys.path[0]`` is its own directory, never the workspace)."""
    script = Path(sys.executable).with_name("codesdk-worker")
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script), "mcp-bridge"]
    return [sys.executable, "-I", "-m", "codesdk.worker.mcp.bridge"]


@dataclass(frozen=True)
class BridgeEndpoint:
    """A task's live endpoint: where its socket is and the token that opens it (valid while ``serve_tools``
    runs)."""

    directory: Path
    socket_path: Path
    token: str = field(repr=False)

    def mcp_server(self, name: str = "codesdk") -> dict[str, Any]:
        """The ACP ``session/new`` entry for a stdio MCP server that the agent spawns: the bridge to this endpoint."""
        command, *args = bridge_command()
        return {"name": name, "command": command, "args": args,
                "env": [{"name": SOCKET_ENV, "value": str(self.socket_path)},
                        {"name": TOKEN_ENV, "value": self.token}]}


#: Told of each endpoint served in this context and its handler, so that a replay of a recording
#: (``codesdk.testing.replay``) can make the calls the agent's bridge made then. Nothing else sets it.
stand_in: ContextVar[Callable[[BridgeEndpoint, CallHandler], None] | None] = ContextVar(
    "codesdk_bridge_stand_in", default=None)


@asynccontextmanager
async def serve_tools(tools: Sequence[BridgeTool], on_call: CallHandler, *,
                      directory: Path | None = None) -> AsyncIterator[BridgeEndpoint]:
    """Serve ``tools`` on a fresh private socket (in a new directory under ``directory``, default ``$TMPDIR``)
    until the block ends; every accepted call goes to ``on_call``. ``ValueError`` for a bad tool list."""
    service = _Service(tools, on_call)
    workdir = Path(tempfile.mkdtemp(prefix="codesdk-mcp-", dir=directory))
    try:
        os.chmod(workdir, 0o700)  # mkdtemp's mode, whatever the umask
        socket_path = workdir / SOCKET_NAME
        endpoint = BridgeEndpoint(workdir, socket_path, service.token)
        recording.redact(service.token, "<bridge token>")
        recording.record("bridge", socket_path=str(socket_path), command=bridge_command())
        if (replay := stand_in.get()) is not None:  # no agent connects: the replay makes the recorded calls
            replay(endpoint, service.answer)
            yield endpoint
            return
        listening = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with listening:
            with socket_address(socket_path) as address:
                await listening.bind(address)
            listening.listen(_LISTEN_BACKLOG)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(partial(trio.serve_listeners, service.serve_connection,
                                           [trio.SocketListener(listening)], handler_nursery=nursery))
                try:
                    yield endpoint
                finally:
                    nursery.cancel_scope.cancel()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


class _Connection:
    """One accepted stream: its lines in, its answers out (one writer at a time)."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.calls_in_flight: set[int | str] = set()
        self._framer = LineFramer(MAX_HELLO_BYTES)  # until the hello is accepted (``accept_long_lines``)
        self._lines: list[bytes | BadFrame] = []
        self._ended = False
        self._send_lock = trio.Lock()

    async def next_line(self) -> bytes | BadFrame | None:
        """The next line (None at the end of the stream)."""
        while not self._lines:
            if self._ended:
                return None
            try:
                chunk = await self.stream.receive_some(_READ_CHUNK_BYTES)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                chunk = b""
            if chunk:
                self._lines.extend(self._framer.feed(chunk))
            else:
                self._ended = True
                self._lines.extend(self._framer.close())
        return self._lines.pop(0)

    def accept_long_lines(self) -> None:
        self._framer.max_frame_bytes = MAX_LINE_BYTES

    async def send(self, line: bytes) -> None:
        """Write one line; a peer that went away is not an error here (its reader sees the end)."""
        async with self._send_lock:
            try:
                await self.stream.send_all(line)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                log.debug("a bridge connection went away before an answer: %s", exc)

    async def answer(self, call_id: int | str, answer: BridgeAnswer) -> None:
        line = encode_line({"type": "result", "id": call_id, "text": answer.text, "isError": answer.is_error})
        if len(line) - 1 > MAX_LINE_BYTES:
            log.warning("a tool result of %d bytes is too large for the MCP bridge", len(line))
            line = encode_line({"type": "result", "id": call_id, "isError": True,
                                "text": f"the tool's result is too large to return ({len(line)} bytes; the limit "
                                        f"is {MAX_LINE_BYTES})"})
        await self.send(line)

    async def refuse(self, reason: str) -> None:
        """Say why, then let the peer close first: closing a unix socket with unread input (a hello we did not
        read) resets the connection, and the peer would lose the reason. Bounded: a peer cannot hold us."""
        with trio.move_on_after(REFUSAL_GRACE_S):
            await self.send(encode_line({"type": "refused", "reason": reason}))
            try:
                await self.stream.send_eof()
                while await self.stream.receive_some(_READ_CHUNK_BYTES):
                    pass
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass


class _Refused(Exception):
    """This connection is refused; the reason is sent to the peer before it is closed."""


class _Service:
    """One endpoint's state: its tools, token and handler, and the connections it serves."""

    def __init__(self, tools: Sequence[BridgeTool], on_call: CallHandler) -> None:
        self.tools = {tool.name: tool for tool in tools}
        bad = [tool.name for tool in tools if not TOOL_NAME.fullmatch(tool.name)]
        if bad:
            raise ValueError(f"tool names must match {TOOL_NAME.pattern}: {bad!r}")
        if len(self.tools) != len(tools):
            raise ValueError("tool names must be unique")
        self.tools_line = encode_line({"type": "tools", "tools": [tool.to_wire() for tool in tools]})
        if len(self.tools_line) - 1 > MAX_LINE_BYTES:
            raise ValueError(f"the tool list takes {len(self.tools_line)} bytes; the bridge's limit is "
                             f"{MAX_LINE_BYTES}")
        self.token = secrets.token_urlsafe(32)
        self.on_call = on_call
        self.connections = 0

    async def serve_connection(self, stream: trio.SocketStream) -> None:
        connection = _Connection(stream)
        async with stream:
            if self.connections >= MAX_CONNECTIONS:
                log.warning("refused a bridge connection: %d are open already", self.connections)
                await connection.refuse(f"too many connections ({MAX_CONNECTIONS} are open)")
                return
            self.connections += 1
            try:
                await self._converse(connection)
            except _Refused as exc:
                log.warning("refused a bridge connection: %s", exc)
                await connection.refuse(str(exc))
            except OSError as exc:  # this connection's socket failed: the others are served on
                log.warning("a bridge connection failed: %s", exc)
            finally:
                self.connections -= 1

    async def _converse(self, connection: _Connection) -> None:
        peer_uid = _peer_uid(connection.stream.socket)
        if peer_uid != os.geteuid():
            raise _Refused(f"peer uid {peer_uid} is not the worker's")
        line: bytes | BadFrame | None = None
        with trio.move_on_after(HELLO_TIMEOUT_S):
            line = await connection.next_line()
            if line is None:
                return
        if line is None:
            raise _Refused(f"no hello within {HELLO_TIMEOUT_S:g} s")
        hello = _decode(line)
        token = hello.get("token")
        if hello.get("type") != "hello" or not isinstance(token, str):
            raise _Refused("the first line must be a hello with the token")
        if not hmac.compare_digest(token.encode("utf-8", "replace"), self.token.encode()):
            raise _Refused("wrong token (the task may have ended)")
        connection.accept_long_lines()
        await connection.send(self.tools_line)
        broken: str | None = None
        async with trio.open_nursery() as calls:
            while (line := await connection.next_line()) is not None:
                try:
                    await self._take_call(connection, _decode(line), calls)
                except _Refused as exc:
                    broken = str(exc)
                    break
            calls.cancel_scope.cancel()  # the peer is gone or broke the protocol: nobody reads these answers
        if broken is not None:
            raise _Refused(broken)

    async def _take_call(self, connection: _Connection, message: dict[str, Any], calls: trio.Nursery) -> None:
        """Start one call, or answer it at once (unknown tool, too many running). Answering inline makes a peer
        that does not read its answers stop our reading too: its backlog stays bounded."""
        call_id, name = message.get("id"), message.get("name")
        arguments, meta = message.get("arguments", {}), message.get("meta", {})
        if message.get("type") != "call":
            raise _Refused(f"unexpected message type {str(message.get('type'))[:40]!r}")
        if not _valid_id(call_id):
            raise _Refused("a call without a valid id (an integer, or a string of at most 128 characters)")
        assert isinstance(call_id, int | str)
        if not isinstance(name, str) or not isinstance(arguments, dict) or not isinstance(meta, dict):
            raise _Refused("a call needs a string name, an object of arguments and an object meta")
        if call_id in connection.calls_in_flight:
            raise _Refused(f"call id {call_id!r} is in flight already")
        if name not in self.tools:
            await connection.answer(call_id, BridgeAnswer(
                f"unknown tool {name[:64]!r}; this task's tools are: {', '.join(self.tools) or 'none'}"[:2000],
                is_error=True))
            return
        if len(connection.calls_in_flight) >= MAX_CALLS_IN_FLIGHT:
            await connection.answer(call_id, BridgeAnswer(
                f"too many tool calls at once (at most {MAX_CALLS_IN_FLIGHT}); call again when some have finished",
                is_error=True))
            return
        connection.calls_in_flight.add(call_id)
        calls.start_soon(self._run_call, connection, call_id, BridgeCall(name, arguments, meta))

    async def _run_call(self, connection: _Connection, call_id: int | str, call: BridgeCall) -> None:
        recording.record("bridge_call", call_id=call_id, name=call.name, arguments=call.arguments, meta=call.meta)
        try:
            answer = await self.answer(call)
            recording.record("bridge_answer", call_id=call_id, text=answer.text, is_error=answer.is_error)
            await connection.answer(call_id, answer)
        finally:
            connection.calls_in_flight.discard(call_id)

    async def answer(self, call: BridgeCall) -> BridgeAnswer:
        """The handler's answer to ``call``; an error answer if it failed (the model reads it; the task goes on)."""
        try:
            answer = await self.on_call(call)
            if not isinstance(answer, BridgeAnswer):
                raise TypeError(f"the call handler returned {type(answer).__name__}, not a BridgeAnswer")
        except Exception as exc:
            log.exception("the MCP bridge's handler failed on a call of %s", call.name)
            answer = BridgeAnswer(f"CodeSDK could not run {call.name}: internal error ({type(exc).__name__})",
                                  is_error=True)
        return answer


def _peer_uid(sock: trio.socket.SocketType) -> int:
    _pid, uid, _gid = _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
    return int(uid)


def _decode(line: bytes | BadFrame) -> dict[str, Any]:
    """A line as a JSON object (strictly decoded: the peer is untrusted), else ``_Refused``."""
    value = decode_json(line) if isinstance(line, bytes) else line
    if isinstance(value, BadFrame):
        raise _Refused(value.detail)
    if not isinstance(value, dict):
        raise _Refused("a line that is not a JSON object")
    return value


def _valid_id(call_id: object) -> bool:
    if isinstance(call_id, bool):
        return False
    if isinstance(call_id, int):
        return abs(call_id) <= _MAX_JSON_INT
    return isinstance(call_id, str) and len(call_id) <= _MAX_ID_CHARS
