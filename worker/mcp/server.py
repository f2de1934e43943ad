"""CodeSDK's tools as an MCP server: the answers to an MCP client's JSON-RPC messages, whatever carries them.

Two carriers use it. Claude Code tunnels the messages of an in-process ("sdk") server through its control protocol
(``worker.adapters.claude``: started with ``--mcp-config '{"mcpServers": {"codesdk": {"type": "sdk", ...}}}'``, it
sends ``control_request`` ``{"subtype": "mcp_message", ...}`` and waits for the ``mcp_response``). ACP agents spawn
CodeSDK's MCP bridge, which speaks them on its stdio (``codesdk.worker.mcp.bridge``).

Why hand-written: the only MCP server we need serves ``initialize``, ``ping``, ``tools/list`` and ``tools/call``
for a fixed tool list, and importing the ``mcp`` package costs ~0.8 s (measured with ``python -X importtime``): most
of a Claude Code turn, and of every ACP agent's start (the agents wait for their MCP servers before the first
prompt). The messages follow MCP 2025-11-25 (versions 2024-11-05 .. 2025-11-25 are negotiated as the spec says); the
tests check the answers against the ``mcp`` package's own models and client, and against the Claude SDK's bridge
for the messages the CLI really sends. What to answer is ``_messages`` (pure, shared with the bridge process, whose
relay runs on the standard library alone); the calls and their cancellation, on trio, are here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import trio

from ._messages import Call, Cancel, McpAnswers, McpTool, ToolCallResult

__all__ = ["McpServer", "McpTool", "ToolCallResult", "ToolCaller"]

#: ``call(tool_name, arguments, meta)``: run one call (``meta`` is the request's ``_meta``: Claude Code puts
#: ``claudecode/toolUseId`` there, Gemini CLI a ``progressToken``).
ToolCaller = Callable[[str, dict[str, Any], dict[str, Any]], Awaitable[ToolCallResult]]


class McpServer:
    """Answers the JSON-RPC messages of one MCP client session (an agent) for a fixed list of tools."""

    def __init__(self, name: str, version: str, tools: list[McpTool], call: ToolCaller) -> None:
        self.answers = McpAnswers(name, version, tools)
        self._call = call
        self._running: dict[str | int, trio.CancelScope] = {}

    async def handle(self, message: Any) -> dict[str, Any] | None:
        """The JSON-RPC response to ``message``, or None for a notification (or a response: we send no requests)."""
        step = self.answers.step(message)
        if isinstance(step, Cancel):
            scope = self._running.get(step.request_id)
            if scope is not None:
                scope.cancel()
            return None
        if isinstance(step, Call):
            return await self._make(step)
        return step

    async def _make(self, call: Call) -> dict[str, Any]:
        """Make ``call`` (cancelled if the client cancels it meanwhile); its answer."""
        with trio.CancelScope() as scope:
            self._running[call.request_id] = scope
            try:
                return call.result_of(await self._call(call.name, call.arguments, call.meta))
            finally:
                self._running.pop(call.request_id, None)
        return call.cancelled()  # the client cancelled it (notifications/cancelled)
