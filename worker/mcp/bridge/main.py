"""The bridge process: a stdio MCP server that an ACP agent spawns, serving one task's tools from its worker.

Started as ``codesdk-worker mcp-bridge`` or ``python -I -m codesdk.worker.mcp.bridge`` (``BridgeEndpoint.mcp_server``), with
``CODESDK_BRIDGE_SOCKET`` and ``CODESDK_BRIDGE_TOKEN`` in its environment. It first reaches the worker and says
hello, with nothing but the standard library loaded: refused or unreachable, it prints one line on stderr and exits
2 within milliseconds (the agent then reports its MCP server failed, and has no tools). Accepted, it serves the
worker's tools on stdin/stdout (``_relay``, the standard library only: the agent waits for its answers before the
turn's first model request) until stdin ends or the worker closes the socket (the task ended).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ._link import WorkerUnavailable, connect
from ._wire import SOCKET_ENV, TOKEN_ENV

#: The exit status of a bridge that could not get its tools: the agent's MCP client sees a failed server.
EXIT_UNAVAILABLE = 2


def main(argv: list[str] | None = None) -> int:
    if argv:
        return _fail(f"takes no arguments (got {' '.join(argv)[:200]}); it reads {SOCKET_ENV} and {TOKEN_ENV}")
    path, token = os.environ.get(SOCKET_ENV), os.environ.get(TOKEN_ENV)
    if not path or not token:
        return _fail(f"{SOCKET_ENV} and {TOKEN_ENV} must be set (CodeSDK's worker passes them to the agent)")
    # stdout is the MCP wire from here on: a stray print or library output lands on stderr instead.
    wire = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        link = connect(Path(path), token)
    except WorkerUnavailable as exc:
        return _fail(str(exc))
    from ._relay import serve

    serve(link, wire)
    return 0


def _fail(message: str) -> int:
    print(f"codesdk mcp bridge: {message}", file=sys.stderr, flush=True)
    return EXIT_UNAVAILABLE
