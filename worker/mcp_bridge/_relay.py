"""The bridge's MCP side: the ``mcp`` package's low-level server on stdio, relaying tool calls to the worker.

Loaded only once the worker accepted our hello (importing ``mcp`` costs most of the bridge's start-up).

Built on ``mcp.server.lowlevel.Server`` and ``mcp.server.stdio.stdio_server`` (under trio, through anyio). Two
things are our own, for reasons:

- stdin and stdout are handed to ``stdio_server`` as trio streams (``_StdinLines``, ``_StdoutLines``): its default
  reads stdin in a worker thread that cancellation cannot stop, so a bridge whose task ended would hang until the
  agent wrote again; ours stops at once, and bounds the length of a line.
- ``_Relay`` shapes each answer for the agents we serve: an argument ``wait_for_previous`` that Gemini CLI adds to
  every call is dropped unless the tool declares it; a text that parses as JSON but not as an object also goes out
  as ``structuredContent = {"result": <value>}``, since Gemini CLI otherwise takes the parsed text itself as
  structured content and fails validating a non-object.

When the worker closes the socket (its task ended), every call in flight, and any call after, is answered
``TASK_ENDED``; once those answers are written the bridge exits, without waiting for stdin to end.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable
from typing import Any, NoReturn, cast

import mcp_types as types
import trio
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

from .. import WORKER_VERSION
from ._server import WorkerLink
from ._wire import MAX_LINE_BYTES, TASK_ENDED, LineReader, LineTooLong, encode_line

log = logging.getLogger("codesdk.mcp_bridge")

#: Longest JSON-RPC line taken from the agent: a call's arguments plus MCP's envelope. Beyond it a line is dropped
#: (logged); a call that long could not be forwarded within the socket's own limit anyway.
MAX_STDIN_LINE_BYTES = 2 * MAX_LINE_BYTES
#: The argument Gemini CLI adds to every tool call (its scheduler's, not the tool's).
GEMINI_SCHEDULING_ARGUMENT = "wait_for_previous"
_READ_CHUNK_BYTES = 64 * 1024


async def serve(link: WorkerLink, wire_fd: int) -> None:
    level = os.environ.get("CODESDK_LOG_LEVEL", "WARNING").upper()
    logging.basicConfig(stream=sys.stderr, level=level if level in logging.getLevelNamesMapping() else "WARNING",
                        format="codesdk mcp bridge: %(levelname)s %(name)s: %(message)s")
    relay = _Relay(link)
    server: Server[Any] = Server("codesdk", version=WORKER_VERSION, on_list_tools=relay.list_tools,
                                 on_call_tool=relay.call_tool)
    async with relay.stream, trio.open_nursery() as nursery:
        stdin = _StdinLines(trio.lowlevel.FdStream(os.dup(0)))
        stdout = _StdoutLines(trio.lowlevel.FdStream(wire_fd), relay.written, nursery.cancel_scope.cancel)
        nursery.start_soon(relay.read_answers)
        nursery.start_soon(relay.end_when_drained, nursery.cancel_scope)
        # Explicit streams: stdio_server then neither claims fds 0/1 nor reads stdin in a thread.
        async with stdio_server(cast(Any, stdin), cast(Any, stdout)) as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())
        nursery.cancel_scope.cancel()  # stdin ended: the agent is done with us


class _Relay:
    """The worker's side of each MCP request: its tool list, and its answer to each call."""

    def __init__(self, link: WorkerLink) -> None:
        self.stream = trio.SocketStream(trio.socket.from_stdlib_socket(link.sock))
        self.reader = link.reader
        self.tools = {str(tool.get("name")): tool for tool in link.tools}
        self.listing = types.ListToolsResult(tools=[types.Tool(
            name=str(tool.get("name")), description=str(tool.get("description") or ""),
            input_schema=dict(tool.get("inputSchema") or {"type": "object"})) for tool in link.tools])
        self.worker_gone = trio.Event()
        #: Set once the worker is gone and every call's answer is written: time to exit.
        self.drained = trio.Event()
        self._next_id = 0
        self._waiting: dict[int, tuple[trio.Event, list[tuple[str, bool]]]] = {}
        self._send_lock = trio.Lock()
        self._handlers_running = 0
        #: MCP request ids answered after the worker went away, whose answers are not written yet.
        self._unwritten: set[int | str] = set()

    # -- MCP requests ---------------------------------------------------------------------------

    async def list_tools(self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None,
                         ) -> types.ListToolsResult:
        return self.listing

    async def call_tool(self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams,
                        ) -> types.CallToolResult:
        self._handlers_running += 1
        try:
            arguments = dict(params.arguments or {})
            declared = (self.tools.get(params.name, {}).get("inputSchema") or {}).get("properties") or {}
            if GEMINI_SCHEDULING_ARGUMENT not in declared:
                arguments.pop(GEMINI_SCHEDULING_ARGUMENT, None)
            meta = params.model_dump(by_alias=True, mode="json").get("_meta") or {}
            text, is_error = await self._call(params.name, arguments, meta)
            if self.worker_gone.is_set() and ctx.request_id is not None:
                self._unwritten.add(ctx.request_id)
            return _tool_result(text, is_error)
        finally:
            self._handlers_running -= 1
            self._check_drained()

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

    def written(self, line: str) -> None:
        """``_StdoutLines`` wrote ``line``: if it answers a call made after the worker left, it is no longer owed."""
        if self._unwritten:
            try:
                message = json.loads(line)
            except ValueError:
                return
            if isinstance(message, dict):
                self._unwritten.discard(message.get("id"))
                self._check_drained()

    def _check_drained(self) -> None:
        if self.worker_gone.is_set() and not self._handlers_running and not self._unwritten:
            self.drained.set()

    async def end_when_drained(self, scope: trio.CancelScope) -> None:
        await self.drained.wait()
        scope.cancel()


def _tool_result(text: str, is_error: bool) -> types.CallToolResult:
    result = types.CallToolResult(content=[types.TextContent(text=text)], is_error=is_error)
    try:
        value = json.loads(text, parse_constant=_not_json)
    except ValueError:
        return result
    if not isinstance(value, dict):
        result.structured_content = {"result": value}
    return result


def _not_json(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")


class _StdinLines:
    """stdin as ``stdio_server`` reads it (``async for line``), from a trio stream: cancellable, bounded lines."""

    def __init__(self, stream: trio.lowlevel.FdStream) -> None:
        self.stream = stream
        self.reader = LineReader(MAX_STDIN_LINE_BYTES)
        self.ended = False

    def __aiter__(self) -> _StdinLines:
        return self

    async def __anext__(self) -> str:
        while True:
            try:
                line = self.reader.next_line()
            except LineTooLong as exc:
                log.error("dropped %s from the agent", exc)
                continue
            if line is None and self.ended:
                line = self.reader.rest()
                if line is None:
                    raise StopAsyncIteration
            if line is not None:
                return line.decode("utf-8", "replace")
            try:
                chunk = await self.stream.receive_some(_READ_CHUNK_BYTES)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                chunk = b""
            if chunk:
                self.reader.feed(chunk)
            else:
                self.ended = True


class _StdoutLines:
    """stdout as ``stdio_server`` writes it (``write`` then ``flush``), to a trio stream. A write to an agent
    that is gone ends the bridge (``on_broken``)."""

    def __init__(self, stream: trio.lowlevel.FdStream, on_written: Callable[[str], None],
                 on_broken: Callable[[], None]) -> None:
        self.stream = stream
        self.on_written = on_written
        self.on_broken = on_broken

    async def write(self, text: str) -> None:
        try:
            await self.stream.send_all(text.encode("utf-8", "replace"))
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            log.info("the agent closed our stdout (%s): the bridge stops", exc)
            self.on_broken()
            return
        self.on_written(text)

    async def flush(self) -> None:
        await trio.lowlevel.checkpoint()
