"""CodeSDK's tools as an MCP server that an agent spawns itself (ACP agents: Gemini CLI, OpenCode).

Two halves: the worker serves a task's tools on a private unix socket (``serve_tools``, in ``_endpoint``), and the
bridge process (``python -I -m worker.mcp_bridge`` or ``codesdk-worker mcp-bridge``, in ``_server``) is the stdio MCP
server the agent starts from ``BridgeEndpoint.mcp_server()``; it relays each ``tools/call`` to the worker.

The public names are loaded on first use: the bridge process imports this package too, and must not pay for trio
and the protocol models before it has even reached its worker.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._endpoint import (
        BridgeAnswer,
        BridgeCall,
        BridgeEndpoint,
        BridgeTool,
        CallHandler,
        bridge_command,
        serve_tools,
    )

__all__ = ["BridgeAnswer", "BridgeCall", "BridgeEndpoint", "BridgeTool", "CallHandler", "bridge_command",
           "serve_tools"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("._endpoint", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
