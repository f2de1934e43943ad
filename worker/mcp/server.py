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
for the messages the CLI really sends. Light on purpose: trio and the standard library only (the bridge process
starts with it).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import trio

log = logging.getLogger("codesdk.worker.mcp")

#: Protocol revisions negotiated through ``initialize``, oldest to newest.
PROTOCOL_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
LATEST_PROTOCOL_VERSION = PROTOCOL_VERSIONS[-1]

#: JSON-RPC's error codes, and MCP's own.
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
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
    """What a ``tools/call`` returns: text content, whether it is an error the model should see, and structured
    content when the carrier sends some."""

    text: str
    is_error: bool = False
    structured: dict[str, Any] | None = None

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"content": [{"type": "text", "text": self.text}], "isError": self.is_error}
        if self.structured is not None:
            wire["structuredContent"] = self.structured
        return wire


class ToolError(Exception):
    """A ``tools/call`` that names no tool we serve, or has unusable params (answered -32602)."""


#: ``call(tool_name, arguments, meta)``: run one call (``meta`` is the request's ``_meta``: Claude Code puts
#: ``claudecode/toolUseId`` there, Gemini CLI a ``progressToken``).
ToolCaller = Callable[[str, dict[str, Any], dict[str, Any]], Awaitable[ToolCallResult]]


class McpServer:
    """Answers the JSON-RPC messages of one MCP client session (an agent) for a fixed list of tools."""

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
            return _error(message.get("id") if isinstance(message, dict) else None, INVALID_REQUEST,
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
            return _error(None, INVALID_REQUEST, "a request id must be a string or an integer")
        if not isinstance(params, dict):
            return _error(request_id, INVALID_PARAMS, "params must be an object")
        try:
            return _result(request_id, await self._request(request_id, method, params))
        except ToolError as exc:
            return _error(request_id, INVALID_PARAMS, str(exc))
        except _MethodNotFound:
            return _error(request_id, METHOD_NOT_FOUND, f"Method not found: {method}")
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
