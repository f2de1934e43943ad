"""The bridge's MCP side: CodeSDK's MCP server (``codesdk.worker.mcp.server``) on stdio, relaying tool calls to the worker.

Loaded once the worker accepted our hello. Not the ``mcp`` package's server: importing it costs ~0.8 s, and every
ACP agent waits for its MCP servers before its first prompt, so that was most of what CodeSDK added to an agent's
turn (``scripts/bench --case acp``); the project's own server, which Claude Code's in-process server uses too, needs
trio only. The tests drive the bridge with the ``mcp`` package's client.

Requests from the agent are answered concurrently (an agent's parallel tool calls), each as it finishes; stdin's
lines are bounded. ``_Relay`` shapes each call for the agents we serve: an argument ``wait_for_previous`` that
Gemini CLI adds to every call is dropped unless the tool declares it; a text that parses as JSON but not as an
object also goes out as ``structuredContent = {"result": <value>}``, since Gemini CLI otherwise takes the parsed
text itself as structured content and fails validating a non-object.

When the worker closes the socket (its task ended), every call in flight, and any call after, is answered
``TASK_ENDED``; once those answers are written the bridge exits, without waiting for stdin to end.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import Any, NoReturn

import trio

from codesdk._version import __version__
from ..server import McpServer, McpTool, ToolCallResult
from ._link import WorkerLink
from ._wire import MAX_LINE_BYTES, TASK_ENDED, LineReader, LineTooLong, encode_line

log = logging.getLogger("codesdk.mcp_bridge")

#: Longest JSON-RPC line taken from the agent: a call's arguments plus MCP's envelope. Beyond it a line is dropped
#: (logged); a call that long could not be forwarded within the socket's own limit anyway.
MAX_STDIN_LINE_BYTES = 2 * MAX_LINE_BYTES
#: The argument Gemini CLI adds to every tool call (its scheduler's, not the tool's).
GEMINI_SCHEDULING_ARGUMENT = "wait_for_previous"
_READ_CHUNK_BYTES = 64 * 1024
PARSE_ERROR = -32700


async def serve(link: WorkerLink, wire_fd: int) -> None:
    level = os.environ.get("CODESDK_LOG_LEVEL", "WARNING").upper()
    logging.basicConfig(stream=sys.stderr, level=level if level in logging.getLevelNamesMapping() else "WARNING",
                        format="codesdk mcp bridge: %(levelname)s %(name)s: %(message)s")
    relay = _Relay(link)
    tools = [McpTool(name=str(tool.get("name")), description=str(tool.get("description") or ""),
                     input_schema=dict(tool.get("inputSchema") or {"type": "object"})) for tool in link.tools]
    server = McpServer("codesdk", __version__, tools, relay.call)
    stdout = trio.lowlevel.FdStream(wire_fd)
    write_lock = trio.Lock()

    async def answer(message: Any, response: dict[str, Any] | None = None) -> None:
        """Answer one message of the agent (``response``: already known, a parse error)."""
        relay.started()
        try:
            if response is None:
                response = await server.handle(message)
            if response is not None:
                async with write_lock:
                    await stdout.send_all(encode_line(response))
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            log.info("the agent closed our stdout (%s): the bridge stops", exc)
            requests.cancel_scope.cancel()
        finally:
            relay.finished()

    async with relay.stream, trio.open_nursery() as requests:
        requests.start_soon(relay.read_answers)
        requests.start_soon(relay.end_when_drained, requests.cancel_scope)
        async for line in _stdin_lines(trio.lowlevel.FdStream(os.dup(0))):
            try:
                message = json.loads(line)
            except ValueError as exc:
                requests.start_soon(answer, None, {"jsonrpc": "2.0", "id": None,
                                                   "error": {"code": PARSE_ERROR, "message": f"Parse error: {exc}"}})
                continue
            requests.start_soon(answer, message)
        requests.cancel_scope.cancel()  # stdin ended: the agent is done with us


class _Relay:
    """The worker's side of each MCP request: its tool list, and its answer to each call."""

    def __init__(self, link: WorkerLink) -> None:
        self.stream = trio.SocketStream(trio.socket.from_stdlib_socket(link.sock))
        self.reader = link.reader
        self.tools = {str(tool.get("name")): tool for tool in link.tools}
        self.worker_gone = trio.Event()
        #: Set once the worker is gone and every call's answer is written: time to exit.
        self.drained = trio.Event()
        self._next_id = 0
        self._waiting: dict[int, tuple[trio.Event, list[tuple[str, bool]]]] = {}
        self._send_lock = trio.Lock()
        #: The agent's requests being answered (their answers not yet written).
        self._answering = 0

    # -- MCP requests ---------------------------------------------------------------------------

    def started(self) -> None:
        self._answering += 1

    def finished(self) -> None:
        self._answering -= 1
        self._check_drained()

    async def call(self, name: str, arguments: dict[str, Any], meta: dict[str, Any]) -> ToolCallResult:
        """One ``tools/call``, as the worker answers it."""
        arguments = dict(arguments)
        declared = (self.tools.get(name, {}).get("inputSchema") or {}).get("properties") or {}
        if GEMINI_SCHEDULING_ARGUMENT not in declared:
            arguments.pop(GEMINI_SCHEDULING_ARGUMENT, None)
        text, is_error = await self._call(name, arguments, meta)
        return _tool_result(text, is_error)

    # -- the worker -----------------------------------------------------------------------------

    async def _call(self, name: str, arguments: dict[str, Any], meta: dict[str, Any]) -> tuple[str, bool]:
        if self.worker_gone.is_set():
            return TASK_ENDED, True
        self._next_id += 1
        call_id = self._next_id
        line = encode_line({"type": "call", "id": call_id, "name": name, "arguments": arguments, "meta": meta})
        if len(line) - 1 > MAX_LINE_BYTES:
            return f"the arguments of this call are too large ({len(line)} bytes; the limit is {MAX_LINE_BYTES})", True
        arrived, answer = trio.Event(), list[tuple[str, bool]]()
        self._waiting[call_id] = (arrived, answer)
        try:
            async with self._send_lock:
                await self.stream.send_all(line)
            await arrived.wait()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._worker_lost()
        finally:
            del self._waiting[call_id]
        return answer[0] if answer else (TASK_ENDED, True)

    async def read_answers(self) -> None:
        """Wake each call with its answer until the worker closes the socket; then wake the rest with
        ``TASK_ENDED``."""
        try:
            while True:
                while (line := self.reader.next_line()) is not None:
                    self._take_answer(line)
                chunk = await self.stream.receive_some(_READ_CHUNK_BYTES)
                if not chunk:
                    break
                self.reader.feed(chunk)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        except (LineTooLong, ValueError) as exc:
            log.error("the worker sent an unreadable line (%s): the bridge stops", exc)
        self._worker_lost()
        await self.stream.aclose()

    def _take_answer(self, line: bytes) -> None:
        message = json.loads(line)
        if not isinstance(message, dict) or message.get("type") != "result":
            raise ValueError(f"unexpected message {line[:200]!r}")
        call_id = message.get("id")
        waiting = self._waiting.get(call_id) if isinstance(call_id, int) else None
        if waiting is None:
            return  # a call the agent cancelled: nobody waits for it
        arrived, answer = waiting
        answer.append((str(message.get("text", "")), bool(message.get("isError"))))
        arrived.set()

    def _worker_lost(self) -> None:
        if not self.worker_gone.is_set():
            log.info("the worker closed the connection: the task ended")
        self.worker_gone.set()
        for arrived, _answer in self._waiting.values():
            arrived.set()
        self._check_drained()

    # -- ending ---------------------------------------------------------------------------------

    def _check_drained(self) -> None:
        if self.worker_gone.is_set() and not self._answering:
            self.drained.set()

    async def end_when_drained(self, scope: trio.CancelScope) -> None:
        await self.drained.wait()
        scope.cancel()


def _tool_result(text: str, is_error: bool) -> ToolCallResult:
    try:
        value = json.loads(text, parse_constant=_not_json)
    except ValueError:
        return ToolCallResult(text, is_error)
    return ToolCallResult(text, is_error, None if isinstance(value, dict) else {"result": value})


def _not_json(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")


async def _stdin_lines(stream: trio.lowlevel.FdStream) -> Any:
    """stdin's lines (without their newline), from a trio stream: cancellable, each bounded (a longer one is
    dropped, logged)."""
    reader = LineReader(MAX_STDIN_LINE_BYTES)
    ended = False
    while True:
        try:
            line = reader.next_line()
        except LineTooLong as exc:
            log.error("dropped %s from the agent", exc)
            continue
        if line is None and ended:
            line = reader.rest()
            if line is None:
                return
        if line is not None:
            if line.strip():
                yield line
            continue
        try:
            chunk = await stream.receive_some(_READ_CHUNK_BYTES)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            chunk = b""
        if chunk:
            reader.feed(chunk)
        else:
            ended = True
