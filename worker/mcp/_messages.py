"""The MCP messages CodeSDK's server answers, as pure functions of the message and the tool list: what to answer
at once (``initialize``, ``ping``, ``tools/list``, every malformed request), which call to make (``tools/call``)
and which to cancel (``notifications/cancelled``).

No trio, no I/O: the bridge process answers an agent's handshake with it before trio is loaded (an agent waits for
its MCP servers before its first model request, so the bridge's start-up is on every turn's path), and
``server.McpServer`` makes the calls.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, TypeAlias

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


@dataclass(frozen=True)
class Call:
    """A well-formed ``tools/call`` of a tool we serve: make it, answer with ``result_of`` (or ``cancelled``)."""

    request_id: str | int
    name: str
    arguments: dict[str, Any]
    meta: dict[str, Any]

    def result_of(self, result: ToolCallResult) -> dict[str, Any]:
        return _result(self.request_id, result.to_wire())

    def cancelled(self) -> dict[str, Any]:
        return _error(self.request_id, REQUEST_CANCELLED, "Request cancelled")


@dataclass(frozen=True)
class Cancel:
    """The client cancelled its request ``request_id`` (``notifications/cancelled``); nothing is answered."""

    request_id: str | int


#: What a message asks for: an answer to send now (None: nothing to send), a call to make, or one to cancel.
Step: TypeAlias = dict[str, Any] | None | Call | Cancel


class McpAnswers:
    """The answers of one MCP server (its name, version and fixed tool list) to a client's messages."""

    def __init__(self, name: str, version: str, tools: list[McpTool]) -> None:
        self.name = name
        self.version = version
        self.tools = {tool.name: tool for tool in tools}

    def step(self, message: Any) -> Step:
        """What ``message`` (one parsed JSON-RPC message) asks for."""
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
            return self._notification(method, params)
        request_id = message["id"]
        if not isinstance(request_id, str | int) or isinstance(request_id, bool):
            return _error(None, INVALID_REQUEST, "a request id must be a string or an integer")
        if not isinstance(params, dict):
            return _error(request_id, INVALID_PARAMS, "params must be an object")
        if method == "initialize":
            requested = params.get("protocolVersion")
            version = requested if requested in PROTOCOL_VERSIONS else LATEST_PROTOCOL_VERSION
            return _result(request_id, {"protocolVersion": version, "capabilities": {"tools": {"listChanged": False}},
                                        "serverInfo": {"name": self.name, "version": self.version}})
        if method == "ping":
            return _result(request_id, {})
        if method == "tools/list":
            return _result(request_id, {"tools": [tool.to_wire() for tool in self.tools.values()]})
        if method == "tools/call":
            return self._call(request_id, params)
        return _error(request_id, METHOD_NOT_FOUND, f"Method not found: {method}")

    def _call(self, request_id: str | int, params: dict[str, Any]) -> Step:
        name, arguments, meta = params.get("name"), params.get("arguments"), params.get("_meta")
        if not isinstance(name, str) or name not in self.tools:
            return _error(request_id, INVALID_PARAMS, f"Unknown tool: {name}")
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            return _error(request_id, INVALID_PARAMS, "tools/call arguments must be an object")
        return Call(request_id, name, arguments, meta if isinstance(meta, dict) else {})

    @staticmethod
    def _notification(method: str, params: Any) -> Step:
        if method == "notifications/cancelled" and isinstance(params, dict):
            request_id = params.get("requestId")
            if isinstance(request_id, str | int) and not isinstance(request_id, bool):
                return Cancel(request_id)
            log.debug("cancellation of no request we could have (%r) ignored", request_id)
            return None
        if method != "notifications/initialized":
            log.debug("MCP notification %s ignored", method)
        return None


def _result(request_id: str | int, result: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def _error(request_id: Any, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": int(code), "message": message}}
