"""The bridge process: a stdio MCP server that an ACP agent spawns, serving one task's tools from its worker.

Started as ``codesdk-worker mcp-bridge`` or ``python -I -m worker.mcp_bridge`` (``BridgeEndpoint.mcp_server``), with
``CODESDK_BRIDGE_SOCKET`` and ``CODESDK_BRIDGE_TOKEN`` in its environment. It first reaches the worker and says
hello, with nothing but the standard library loaded: refused or unreachable, it prints one line on stderr and exits
2 within milliseconds (the agent then reports its MCP server failed, and has no tools). Accepted, it loads trio and
``mcp`` (~0.7 s, ``_relay``) and serves the worker's tools on stdin/stdout until stdin ends or the worker closes
the socket (the task ended).
"""

from __future__ import annotations

import json
import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._wire import MAX_LINE_BYTES, SOCKET_ENV, TOKEN_ENV, LineReader, LineTooLong, encode_line, socket_address

#: How long the worker may take to answer our hello (it answers at once unless the machine is stuck).
HANDSHAKE_TIMEOUT_S = 30.0
#: The exit status of a bridge that could not get its tools: the agent's MCP client sees a failed server.
EXIT_UNAVAILABLE = 2


class WorkerUnavailable(Exception):
    """The worker could not be reached, or refused us: the message says which, for the agent's log."""


@dataclass
class WorkerLink:
    """An accepted connection to the worker: the socket, the bytes read past the tool list, the tools."""

    sock: socket.socket
    reader: LineReader
    tools: list[dict[str, Any]]


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
    import trio

    from ._relay import serve

    trio.run(serve, link, wire)
    return 0


def connect(path: Path, token: str, timeout_s: float = HANDSHAKE_TIMEOUT_S) -> WorkerLink:
    """Reach the worker at ``path``, say hello with ``token``, and take its tool list."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.settimeout(timeout_s)
        try:
            with socket_address(path) as address:
                sock.connect(address)
            sock.sendall(encode_line({"type": "hello", "token": token}))
        except OSError as exc:
            raise WorkerUnavailable(f"cannot reach CodeSDK's worker at {path}: {exc.strerror or exc} (the task may "
                                    "have ended)") from exc
        reader = LineReader(MAX_LINE_BYTES)
        answer = _first_line(sock, reader)
        if answer.get("type") == "refused":
            raise WorkerUnavailable(f"CodeSDK's worker refused the connection: {str(answer.get('reason'))[:300]}")
        tools = answer.get("tools")
        if answer.get("type") != "tools" or not isinstance(tools, list):
            raise WorkerUnavailable("CodeSDK's worker answered the hello without a tool list")
        sock.settimeout(None)
        return WorkerLink(sock, reader, [tool for tool in tools if isinstance(tool, dict)])
    except BaseException:
        sock.close()
        raise


def _first_line(sock: socket.socket, reader: LineReader) -> dict[str, Any]:
    try:
        while (line := reader.next_line()) is None:
            chunk = sock.recv(64 * 1024)
            if not chunk:
                raise WorkerUnavailable("CodeSDK's worker closed the connection without answering the hello")
            reader.feed(chunk)
        value = json.loads(line)
    except TimeoutError as exc:
        raise WorkerUnavailable(f"CodeSDK's worker did not answer within {sock.gettimeout():g} s") from exc
    except OSError as exc:
        raise WorkerUnavailable(f"reading from CodeSDK's worker failed: {exc.strerror or exc}") from exc
    except (LineTooLong, ValueError) as exc:
        raise WorkerUnavailable(f"CodeSDK's worker answered with an unreadable line: {exc}") from exc
    if not isinstance(value, dict):
        raise WorkerUnavailable("CodeSDK's worker answered with a line that is not a JSON object")
    return value


def _fail(message: str) -> int:
    print(f"codesdk mcp bridge: {message}", file=sys.stderr, flush=True)
    return EXIT_UNAVAILABLE
