"""A JSON-RPC 2.0 peer over a runtime program's stdio, under trio: requests both ways, and notifications.

Runtimes that speak JSON-RPC on their stdio (``codex app-server``; Agent Client Protocol agents) both send requests
to us (a tool call, an approval) while we wait for answers to ours. ``RpcPeer`` reads the program's stdout in one
task, hands each of its requests to a handler in a task of its own (an approval may wait for a human), wakes whoever
waits for an answer, and passes notifications, in order, to whoever reads ``notifications``.

What it reads is taken leniently — this is a runtime's output, not a client of ours: the ``"jsonrpc"`` member may be
missing (Codex omits it), extra top-level members are ignored, a blank line is skipped. A line that is not a JSON
object, or an object that is none of request, notification or response, is a ``PeerProtocolError``: the runtime
broke the protocol and the task fails with ``PROTOCOL_ERROR``. Lines are bounded by ``RuntimeProcess``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from typing import Any

import trio

from ._awaited import AwaitedAnswers
from .runtime_process import RuntimeProcess

log = logging.getLogger("codesdk.worker.rpc_peer")

#: Answers one request of the runtime: (method, params) -> result. ``PeerError`` answers that error; any other
#: exception answers an internal error (logged).
RequestHandler = Callable[[str, dict[str, Any]], Awaitable[Any]]


class PeerClosed(Exception):
    """The runtime's output ended (it exited or closed stdout), or its stdin is gone, before an answer came."""


class PeerError(Exception):
    """A JSON-RPC error: the runtime's answer to one of our requests, or ours to one of its requests."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(f"{message} ({code})")
        self.code = code
        self.message = message
        self.data = data


class PeerProtocolError(Exception):
    """The runtime wrote something on stdout that is not JSON-RPC."""


METHOD_NOT_FOUND = -32601
INTERNAL_ERROR = -32603


class RpcPeer:
    """One runtime process's stdio, spoken as JSON-RPC. Start ``run`` in a nursery, then use it.

    ``versioned``: whether what we send carries ``"jsonrpc": "2.0"`` (Codex's app-server neither sends nor needs it).
    """

    def __init__(self, process: RuntimeProcess, handler: RequestHandler, *, versioned: bool = True,
                 buffer: int = 1024, sent: tuple[str, ...] = ()) -> None:
        """``sent``: ids of requests written before the peer existed (a launch's opening); ``answer_to`` waits for
        their answers."""
        self.process = process
        self._handler = handler
        self._versioned = versioned
        self._write_lock = trio.Lock()
        self._answers = AwaitedAnswers(sent)
        self._counter = 0
        self._send_notifications, self.notifications = trio.open_memory_channel[tuple[str, dict[str, Any]]](buffer)
        #: Notifications handed to ``notifications`` so far: every one the runtime wrote before the answer a caller
        #: just got is counted (its reader can tell when it has caught up with that answer).
        self.notified = 0
        self.closed = False

    async def run(self) -> None:
        """Read the runtime's stdout until it ends; then fail what still waits for an answer and close
        ``notifications``. Raises ``PeerProtocolError`` on a line that is not JSON-RPC."""
        broken: PeerProtocolError | None = None
        try:
            lines = self.process.lines()
            async with trio.open_nursery() as handlers, aclosing(lines):
                try:
                    async for line in lines:
                        message = _decode(line)
                        if message is not None:
                            await self._route(message, handlers)
                except PeerProtocolError as exc:  # raised below, outside the nursery (not as a group)
                    broken = exc
                handlers.cancel_scope.cancel()  # the runtime is gone or unreadable: nobody is left to answer
            if broken is not None:
                raise broken
        finally:
            self.closed = True
            self._answers.fail_all(PeerClosed(f"{self.process.name}'s output ended"))
            self._send_notifications.close()

    async def request(self, method: str, params: dict[str, Any] | None = None) -> Any:
        """Send a request and wait for its result (``PeerError`` if answered with an error, ``PeerClosed`` if the
        runtime goes away first)."""
        if self.closed:
            raise PeerClosed(f"{self.process.name}'s output ended")
        self._counter += 1
        request_id = f"codesdk-{self._counter}"
        self._answers.expect(request_id)
        try:
            await self._send({"id": request_id, "method": method, **({"params": params} if params is not None else {})})
        except BaseException:
            self._answers.forget(request_id)
            raise
        return await self.answer_to(request_id)

    async def answer_to(self, request_id: str) -> Any:
        """Wait for the answer to a request already sent (by ``request``, or before the peer: ``sent``)."""
        return await self._answers.wait(request_id)

    async def notify(self, method: str, params: dict[str, Any] | None = None) -> None:
        await self._send({"method": method, **({"params": params} if params is not None else {})})

    async def _send(self, message: dict[str, Any]) -> None:
        if self._versioned:
            message = {"jsonrpc": "2.0", **message}
        data = json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
        async with self._write_lock:
            try:
                await self.process.send(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                raise PeerClosed(f"{self.process.name}'s stdin is closed: {exc}") from exc

    async def _route(self, message: dict[str, Any], handlers: trio.Nursery) -> None:
        method = message.get("method")
        if isinstance(method, str):
            params = message.get("params")
            params = params if isinstance(params, dict) else {}
            if "id" in message:
                handlers.start_soon(self._serve, message["id"], method, params)
            else:
                try:
                    await self._send_notifications.send((method, params))
                    self.notified += 1
                except trio.BrokenResourceError:
                    pass  # nobody reads notifications any more (the task has its outcome): drop them
            return
        if "id" in message and ("result" in message or "error" in message):
            error = message.get("error")
            if error is not None:
                error = error if isinstance(error, dict) else {}
                answer: Any = PeerError(int(error.get("code") or INTERNAL_ERROR), str(error.get("message") or "error"),
                                        error.get("data"))
            else:
                answer = message.get("result")
            if not self._answers.resolve(str(message["id"]), answer):
                log.debug("%s answered a request we did not send: %r", self.process.name, message["id"])
            return
        raise PeerProtocolError(f"{self.process.name} wrote a JSON object that is not JSON-RPC: "
                                f"{json.dumps(message)[:200]}")

    async def _serve(self, request_id: Any, method: str, params: dict[str, Any]) -> None:
        answer: dict[str, Any]
        try:
            answer = {"id": request_id, "result": await self._handler(method, params)}
        except PeerError as exc:
            answer = {"id": request_id, "error": {"code": exc.code, "message": exc.message}}
        except Exception as exc:  # the runtime gets an error answer; the task goes on
            log.exception("answering %s's %s request failed", self.process.name, method)
            answer = {"id": request_id, "error": {"code": INTERNAL_ERROR, "message": f"{type(exc).__name__}: {exc}"}}
        try:
            await self._send(answer)
        except PeerClosed:
            log.debug("%s went away before our answer to %s", self.process.name, method)


def _decode(line: bytes) -> dict[str, Any] | None:
    text = line.strip()
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise PeerProtocolError(f"a line that is not JSON: {exc}: {text[:200]!r}") from exc
    if not isinstance(value, dict):
        raise PeerProtocolError(f"a line that is not a JSON object: {text[:200]!r}")
    return value
