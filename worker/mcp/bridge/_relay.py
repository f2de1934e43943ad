"""The bridge's MCP side: CodeSDK's MCP answers (``codesdk.worker.mcp._messages``) on stdio, relaying tool calls to the
worker. The standard library only, one thread, one selector over stdin and the worker's socket.

Why not trio, or the ``mcp`` package's server: an agent starts its MCP servers when a turn begins and waits for
their ``initialize`` and ``tools/list`` answers before its first model request, so the bridge's start-up is on every
turn's path. Importing the ``mcp`` package costs ~0.8 s; trio ~90 ms of CPU, which on a small box also slows the
agent and the model server it waits for (codex-acp's warm turn: 1.55x a minimal client with trio imported before the
handshake, 1.37x with the import moved beside it, measured with ``scripts/bench --case acp``). What is relayed needs
no task machinery: a request is answered at once or forwarded, and each forwarded call is answered when the worker
answers it.

Requests from the agent are answered concurrently (an agent's parallel tool calls), each as it finishes; a call the
agent cancels (``notifications/cancelled``) is answered "cancelled" at once and its late answer dropped. stdin's and
the socket's lines are bounded. Calls are shaped for the agents we serve: an argument ``wait_for_previous`` that
Gemini CLI adds to every call is dropped unless the tool declares it; a text that parses as JSON but not as an
object also goes out as ``structuredContent = {"result": <value>}``, since Gemini CLI otherwise takes the parsed text
itself as structured content and fails validating a non-object.

When the worker closes the socket (its task ended), every call in flight is answered ``TASK_ENDED`` and the bridge
exits, without waiting for stdin to end. When stdin ends the agent is done with us: the bridge exits, and the
worker, seeing the connection close, cancels what it was still running for us.
"""

from __future__ import annotations

import json
import logging
import os
import selectors
import sys
from typing import Any, NoReturn

from codesdk._version import __version__
from .._messages import Call, Cancel, McpAnswers, McpTool, ToolCallResult
from ._link import WorkerLink
from ._wire import MAX_LINE_BYTES, MAX_STDIN_LINE_BYTES, TASK_ENDED, LineReader, LineTooLong, encode_line

log = logging.getLogger("codesdk.mcp_bridge")

#: The argument Gemini CLI adds to every tool call (its scheduler's, not the tool's).
GEMINI_SCHEDULING_ARGUMENT = "wait_for_previous"
#: The server's name in ``initialize``.
SERVER_NAME = "codesdk"
PARSE_ERROR = -32700
_READ_CHUNK_BYTES = 64 * 1024


class _Done(Exception):
    """Nothing is left to do: the bridge exits."""


def serve(link: WorkerLink, wire_fd: int, stdin_fd: int = 0) -> None:
    """Serve the agent on ``stdin_fd``/``wire_fd`` until it is done with us or the worker is gone."""
    level = os.environ.get("CODESDK_LOG_LEVEL", "WARNING").upper()
    logging.basicConfig(stream=sys.stderr, level=level if level in logging.getLevelNamesMapping() else "WARNING",
                        format="codesdk mcp bridge: %(levelname)s %(name)s: %(message)s")
    with selectors.DefaultSelector() as selector:
        relay = _Relay(link, wire_fd, selector)
        selector.register(stdin_fd, selectors.EVENT_READ, relay.from_agent)
        selector.register(link.sock, selectors.EVENT_READ, relay.from_worker)
        try:
            relay.worker_lines()  # what the worker sent along with the tool list, if anything
            while True:
                for key, events in selector.select():
                    if events & selectors.EVENT_WRITE:
                        relay.send_waiting()
                    if events & selectors.EVENT_READ and (chunk := _read(key.fd)) is not None:
                        key.data(chunk)
        except _Done:
            pass
        finally:
            link.sock.close()


def _read(fd: int) -> bytes | None:
    """What ``fd`` has (empty at its end); None if it had nothing after all."""
    try:
        return os.read(fd, _READ_CHUNK_BYTES)
    except BlockingIOError:
        return None
    except OSError:  # a reset socket or a broken pipe: an end like any other
        return b""


class _Relay:
    """The agent's requests and the worker's answers, matched by call."""

    def __init__(self, link: WorkerLink, wire_fd: int, selector: selectors.BaseSelector) -> None:
        self.sock = link.sock
        self.sock.setblocking(False)
        self.selector = selector
        #: Calls not yet taken by the socket. Sent as the worker reads, never waited for: a worker that stops
        #: reading (too many calls in flight) goes on writing answers, which we must go on reading.
        self.unsent = bytearray()
        self.wire_fd = wire_fd
        self.tools = {str(tool.get("name")): tool for tool in link.tools}
        self.answers = McpAnswers(SERVER_NAME, __version__, [
            McpTool(name=name, description=str(tool.get("description") or ""),
                    input_schema=dict(tool.get("inputSchema") or {"type": "object"}))
            for name, tool in self.tools.items()])
        self.from_stdin = LineReader(MAX_STDIN_LINE_BYTES)
        self.from_socket = link.reader
        #: Calls sent to the worker and not yet answered, by our id on the socket.
        self.waiting: dict[int, Call] = {}
        self._next_id = 0

    # -- the agent ------------------------------------------------------------------------------

    def from_agent(self, chunk: bytes) -> None:
        if not chunk:  # stdin ended: the agent is done with us
            last = self.from_stdin.rest()
            if last is not None:
                self._take(last)
            raise _Done
        self.from_stdin.feed(chunk)
        while True:
            try:
                line = self.from_stdin.next_line()
            except LineTooLong as exc:
                log.error("dropped %s from the agent", exc)
                continue
            if line is None:
                return
            self._take(line)

    def _take(self, line: bytes) -> None:
        try:
            message = json.loads(line)
        except ValueError as exc:
            self._write({"jsonrpc": "2.0", "id": None, "error": {"code": PARSE_ERROR, "message": f"Parse error: {exc}"}})
            return
        step = self.answers.step(message)
        if isinstance(step, Call):
            self._forward(step)
        elif isinstance(step, Cancel):
            for call_id, call in list(self.waiting.items()):
                if call.request_id == step.request_id:
                    del self.waiting[call_id]  # its answer, if it comes, is dropped
                    self._write(call.cancelled())
        elif step is not None:
            self._write(step)

    def _write(self, message: dict[str, Any]) -> None:
        view = memoryview(encode_line(message))
        try:
            while view:
                view = view[os.write(self.wire_fd, view):]
        except OSError as exc:
            log.info("the agent closed our stdout (%s): the bridge stops", exc)
            raise _Done from None

    # -- the worker -----------------------------------------------------------------------------

    def _forward(self, call: Call) -> None:
        arguments = dict(call.arguments)
        declared = (self.tools.get(call.name, {}).get("inputSchema") or {}).get("properties") or {}
        if GEMINI_SCHEDULING_ARGUMENT not in declared:
            arguments.pop(GEMINI_SCHEDULING_ARGUMENT, None)
        self._next_id += 1
        line = encode_line({"type": "call", "id": self._next_id, "name": call.name, "arguments": arguments,
                            "meta": call.meta})
        if len(line) - 1 > MAX_LINE_BYTES:
            self._write(call.result_of(ToolCallResult(
                f"the arguments of this call are too large ({len(line)} bytes; the limit is {MAX_LINE_BYTES})",
                is_error=True)))
            return
        self.waiting[self._next_id] = call
        was_empty = not self.unsent
        self.unsent += line
        if was_empty:
            self.send_waiting()

    def send_waiting(self) -> None:
        """Give the socket what it takes now of the calls not yet sent; wait for it to be writable for the rest."""
        try:
            sent = self.sock.send(self.unsent)
        except BlockingIOError:
            sent = 0
        except OSError:
            self._worker_lost()
        del self.unsent[:sent]
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if self.unsent else 0)
        if self.selector.get_key(self.sock).events != events:
            self.selector.modify(self.sock, events, self.from_worker)

    def from_worker(self, chunk: bytes) -> None:
        if not chunk:
            self._worker_lost()
        self.from_socket.feed(chunk)
        self.worker_lines()

    def worker_lines(self) -> None:
        """Take every answer the worker's bytes so far hold."""
        try:
            while (line := self.from_socket.next_line()) is not None:
                self._take_answer(line)
        except (LineTooLong, ValueError) as exc:
            log.error("the worker sent an unreadable line (%s): the bridge stops", exc)
            self._worker_lost()

    def _take_answer(self, line: bytes) -> None:
        message = json.loads(line)
        if not isinstance(message, dict) or message.get("type") != "result":
            raise ValueError(f"unexpected message {line[:200]!r}")
        call_id = message.get("id")
        call = self.waiting.pop(call_id, None) if isinstance(call_id, int) else None
        if call is None:
            return  # a call the agent cancelled: nobody waits for it
        self._write(call.result_of(_tool_result(str(message.get("text", "")), bool(message.get("isError")))))

    def _worker_lost(self) -> NoReturn:
        """The worker closed the connection (the task ended): every call in flight is answered, then we exit."""
        log.info("the worker closed the connection: the task ended")
        waiting, self.waiting = self.waiting, {}
        for call in waiting.values():
            self._write(call.result_of(ToolCallResult(TASK_ENDED, is_error=True)))
        raise _Done


def _tool_result(text: str, is_error: bool) -> ToolCallResult:
    try:
        value = json.loads(text, parse_constant=_not_json)
    except ValueError:
        return ToolCallResult(text, is_error)
    return ToolCallResult(text, is_error, None if isinstance(value, dict) else {"result": value})


def _not_json(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")
