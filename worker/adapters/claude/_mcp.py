"""CodeSDK's tools as an in-process ("sdk") MCP server, reached by Claude Code through the control protocol.

Claude Code is started with ``--mcp-config '{"mcpServers": {"codesdk": {"type": "sdk", "name": "codesdk"}}}'``:
instead of starting a server process it tunnels every JSON-RPC message for that server through a
``control_request`` ``{"subtype": "mcp_message", "server_name": "codesdk", "message": {...}}`` on its stdout and
waits for ``{"mcp_response": {...}}`` in the ``control_response`` (an empty ``{"jsonrpc": "2.0", "result": {}}``
acknowledges a notification). This module answers those messages.

Why hand-written: the only MCP server we need serves ``initialize``, ``ping``, ``tools/list`` and ``tools/call``
for a fixed tool list, and importing the ``mcp`` package (what ``claude_agent_sdk`` uses for this) costs ~0.8 s
of a ~1.2 s SDK import (measured with ``python -X importtime``), i.e. most of a Claude Code turn. The messages
follow MCP 2025-11-25 (versions 2024-11-05 .. 2025-11-25 are negotiated as the spec says); the tests check every
answer against the ``mcp`` package's own models and against the SDK's bridge for the messages the CLI really sends.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import trio

from protocol import ErrorCode

log = logging.getLogger("codesdk.worker.claude.mcp")

#: Protocol revisions negotiated through ``initialize``, oldest to newest.
PROTOCOL_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
LATEST_PROTOCOL_VERSION = PROTOCOL_VERSIONS[-1]

#: MCP's own error code (the JSON-RPC ones are the protocol's ``ErrorCode``).
REQUEST_CANCELLED = -32800


@dataclass(frozen=True)
class McpTool:
    """One tool as ``tools/list`` shows it (``name`` is what Claude calls, without the ``mcp__<server>__``)."""

    name: str
    description: str
    input_schema: dict[str, Any]

    def to_wire(self) -> dict[str, Any]:
        schema = dict(self.input_schema)
        schema.setdefault("type", "object")  # MCP: a tool's inputSchema is an object schema
        return {"name": self.name, "description": self.description, "inputSchema": schema}


@dataclass(frozen=True)
class ToolCallResult:
    """What a ``tools/call`` returns: text content, and whether it is an error the model should see."""

    text: str
    is_error: bool = False

    def to_wire(self) -> dict[str, Any]:
        return {"content": [{"type": "text", "text": self.text}], "isError": self.is_error}


class ToolError(Exception):
    """A ``tools/call`` that names no tool we serve, or has unusable params (answered -32602)."""


#: ``call(tool_name, arguments, meta)``: run one call (``meta`` is the request's ``_meta``, where Claude Code puts
#: ``claudecode/toolUseId``).
ToolCaller = Callable[[str, dict[str, Any], dict[str, Any]], Awaitable[ToolCallResult]]


class McpServer:
    """Answers the JSON-RPC messages of one MCP client session (the CLI) for a fixed list of tools."""

    def __init__(self, name: str, version: str, tools: list[McpTool], call: ToolCaller) -> None:
        self.name = name
        self.version = version
        self.tools = {tool.name: tool for tool in tools}
        self._call = call
        self._running: dict[str | int, trio.CancelScope] = {}
        self.initialized = False

    async def handle(self, message: Any) -> dict[str, Any] | None:
        """The JSON-RPC response to ``message``, or None for a notification (or a response: we send no requests)."""
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
            return _error(message.get("id") if isinstance(message, dict) else None, ErrorCode.INVALID_REQUEST,
                          "not a JSON-RPC 2.0 message")
        method = message.get("method")
        if not isinstance(method, str):
            return None  # a response to a request of ours; we never send any
        params = message.get("params")
        if params is None:
            params = {}
        if "id" not in message:
            self._notification(method, params)
            return None
        request_id = message["id"]
        if not isinstance(request_id, str | int) or isinstance(request_id, bool):
            return _error(None, ErrorCode.INVALID_REQUEST, "a request id must be a string or an integer")
        if not isinstance(params, dict):
            return _error(request_id, ErrorCode.INVALID_PARAMS, "params must be an object")
        try:
            return _result(request_id, await self._request(request_id, method, params))
        except ToolError as exc:
            return _error(request_id, ErrorCode.INVALID_PARAMS, str(exc))
        except _MethodNotFound:
            return _error(request_id, ErrorCode.METHOD_NOT_FOUND, f"Method not found: {method}")
        except _Cancelled:
            return _error(request_id, REQUEST_CANCELLED, "Request cancelled")

    async def _request(self, request_id: str | int, method: str, params: dict[str, Any]) -> dict[str, Any]:
        if method == "initialize":
            requested = params.get("protocolVersion")
            version = requested if requested in PROTOCOL_VERSIONS else LATEST_PROTOCOL_VERSION
            return {"protocolVersion": version, "capabilities": {"tools": {"listChanged": False}},
                    "serverInfo": {"name": self.name, "version": self.version}}
        if method == "ping":
            return {}
        if method == "tools/list":
            return {"tools": [tool.to_wire() for tool in self.tools.values()]}
        if method == "tools/call":
            return await self._tools_call(request_id, params)
        raise _MethodNotFound

    async def _tools_call(self, request_id: str | int, params: dict[str, Any]) -> dict[str, Any]:
        name, arguments, meta = params.get("name"), params.get("arguments"), params.get("_meta")
        if not isinstance(name, str) or name not in self.tools:
            raise ToolError(f"Unknown tool: {name}")
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            raise ToolError("tools/call arguments must be an object")
        with trio.CancelScope() as scope:
            self._running[request_id] = scope
            try:
                return (await self._call(name, arguments, meta if isinstance(meta, dict) else {})).to_wire()
            finally:
                self._running.pop(request_id, None)
        raise _Cancelled  # the client cancelled it (notifications/cancelled)

    def _notification(self, method: str, params: Any) -> None:
        if method == "notifications/initialized":
            self.initialized = True
        elif method == "notifications/cancelled" and isinstance(params, dict):
            scope = self._running.get(params.get("requestId"))  # type: ignore[arg-type]
            if scope is not None:
                scope.cancel()
        else:
            log.debug("MCP notification %s ignored", method)


class _MethodNotFound(Exception):
    pass


class _Cancelled(Exception):
    pass


def _result(request_id: str | int, result: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def _error(request_id: Any, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": int(code), "message": message}}
