"""Claude Code's stream-json control protocol over the CLI's stdio, under trio.

The CLI runs as ``claude --input-format stream-json --output-format stream-json --verbose …``. Both directions
carry one JSON object per line:

- to the CLI: user messages ``{"type": "user", "message": {"role": "user", "content": …}, …}``, our control
  requests ``{"type": "control_request", "request_id": ID, "request": {"subtype": "initialize" | "interrupt", …}}``
  and our answers to its requests ``{"type": "control_response", "response": {"subtype": "success",
  "request_id": ID, "response": {…}}}`` (or ``{"subtype": "error", "request_id": ID, "error": TEXT}``);
- from the CLI: SDK messages (``system``, ``stream_event``, ``assistant``, ``user``, ``result``), answers to our
  requests (``control_response``), its own requests (``control_request`` with subtype ``hook_callback``,
  ``can_use_tool``, ``mcp_message`` …) and ``control_cancel_request`` {request_id} when it no longer waits for
  one of them (then nothing is answered).

``ControlChannel`` reads the CLI's stdout in one task, answers the CLI's requests each in a task of its own (a hook
may wait for the supervisor for a long time) and hands every other message, in order, to whoever reads
``messages``. It learned the wire format from claude-agent-sdk 0.2.187 (``_internal/query.py``) and from the CLI
itself; it does not import the SDK.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from typing import Any

import trio

from .._awaited import AwaitedAnswers
from ..runtime_process import RuntimeProcess

log = logging.getLogger("codesdk.worker.claude")

#: Answers one request of the CLI (its ``request`` object) with the ``response`` object; raising answers an error.
RequestHandler = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


class ChannelClosed(Exception):
    """The CLI's output ended (it exited or closed stdout) before our request was answered."""


class ControlError(Exception):
    """The CLI answered one of our control requests with an error."""


class ControlChannel:
    """One CLI process's stdio, spoken as the control protocol. Start ``run`` in a nursery, then use it."""

    def __init__(self, process: RuntimeProcess, handler: RequestHandler, buffer: int = 256,
                 sent: tuple[str, ...] = ()) -> None:
        """``sent``: ids of requests written before the channel existed (a launch's opening); ``answer_to`` waits
        for their answers."""
        self.process = process
        self._handler = handler
        self._write_lock = trio.Lock()
        self._answers = AwaitedAnswers(sent)
        self._serving: dict[str, trio.CancelScope] = {}
        self._counter = 0
        self._send_messages, self.messages = trio.open_memory_channel[dict[str, Any]](buffer)
        self.closed = False

    async def run(self) -> None:
        """Read the CLI's stdout until it ends; then fail what still waits for an answer and close ``messages``."""
        try:
            lines = self.process.lines()
            async with trio.open_nursery() as handlers, aclosing(lines):
                async for line in lines:
                    message = _decode(line)
                    if message is not None:
                        await self._route(message, handlers)
                handlers.cancel_scope.cancel()  # the CLI is gone: nobody is left to answer
        finally:
            self.closed = True
            self._answers.fail_all(ChannelClosed("Claude Code's output ended"))
            self._send_messages.close()

    async def send(self, message: dict[str, Any]) -> None:
        """Write one message to the CLI. ``ChannelClosed`` if its stdin is gone."""
        data = json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
        async with self._write_lock:
            try:
                await self.process.send(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                raise ChannelClosed(f"Claude Code's stdin is closed: {exc}") from exc

    async def request(self, request: dict[str, Any]) -> dict[str, Any]:
        """Send a control request and wait for its answer (the ``response`` object of a success)."""
        if self.closed:
            raise ChannelClosed("Claude Code's output ended")
        self._counter += 1
        request_id = f"req_{self._counter}_{os.urandom(4).hex()}"
        self._answers.expect(request_id)
        try:
            await self.send({"type": "control_request", "request_id": request_id, "request": request})
        except BaseException:
            self._answers.forget(request_id)
            raise
        return await self.answer_to(request_id)

    async def answer_to(self, request_id: str) -> dict[str, Any]:
        """Wait for the answer to a request already sent (by ``request``, or before the channel: ``sent``)."""
        answer: dict[str, Any] = await self._answers.wait(request_id)
        return answer

    async def _route(self, message: dict[str, Any], handlers: trio.Nursery) -> None:
        kind = message.get("type")
        if kind == "control_response":
            response = message.get("response") or {}
            answer = response.get("response")
            resolved = self._answers.resolve(str(response.get("request_id")), ControlError(
                str(response.get("error") or "unknown error")) if response.get("subtype") == "error"
                else answer if isinstance(answer, dict) else {})
            if not resolved:
                log.debug("control response for an unknown request: %s", response.get("request_id"))
        elif kind == "control_request":
            request_id = str(message.get("request_id"))
            scope = trio.CancelScope()
            self._serving[request_id] = scope
            handlers.start_soon(self._serve, request_id, message.get("request") or {}, scope)
        elif kind == "control_cancel_request":
            serving = self._serving.get(str(message.get("request_id")))
            if serving is not None:
                serving.cancel()
        else:
            try:
                await self._send_messages.send(message)
            except trio.BrokenResourceError:
                pass  # nobody reads messages any more (the task has its outcome): drop them

    async def _serve(self, request_id: str, request: dict[str, Any], scope: trio.CancelScope) -> None:
        reply: dict[str, Any] | None = None
        try:
            with scope:
                try:
                    response = await self._handler(request)
                    reply = {"subtype": "success", "request_id": request_id, "response": response}
                except Exception as exc:  # the CLI gets the error (a PreToolUse hook then blocks the call)
                    log.exception("answering Claude Code's %s request failed", request.get("subtype"))
                    reply = {"subtype": "error", "request_id": request_id, "error": f"{type(exc).__name__}: {exc}"}
        finally:
            self._serving.pop(request_id, None)
        if reply is None:  # cancelled by the CLI (control_cancel_request): it waits for nothing
            return
        try:
            await self.send({"type": "control_response", "response": reply})
        except ChannelClosed:
            log.debug("Claude Code went away before our answer to %s", request.get("subtype"))


def _decode(line: bytes) -> dict[str, Any] | None:
    """One stdout line as a message; lines that are not JSON objects (a stray log line) are skipped."""
    text = line.strip()
    if not text.startswith(b"{"):
        if text:
            log.info("Claude Code (stdout): %s", text[:500].decode("utf-8", "replace"))
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ProtocolError(f"Claude Code wrote a line that is not JSON: {exc}: {text[:200]!r}") from exc
    return value if isinstance(value, dict) else None


class ProtocolError(Exception):
    """Claude Code wrote something on stdout that breaks the protocol."""
