"""The bridge's line to its worker: reach the worker's socket, say hello with the task's token, take the tool list.

The standard library only: a bridge refused or unable to reach its worker must say so and exit within milliseconds,
before anything heavy is imported.
"""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._wire import MAX_LINE_BYTES, LineReader, LineTooLong, encode_line, socket_address

#: How long the worker may take to answer our hello (it answers at once unless the machine is stuck).
HANDSHAKE_TIMEOUT_S = 30.0


class WorkerUnavailable(Exception):
    """The worker could not be reached, or refused us: the message says which, for the agent's log."""


@dataclass
class WorkerLink:
    """An accepted connection to the worker: the socket, the bytes read past the tool list, the tools."""

    sock: socket.socket
    reader: LineReader
    tools: list[dict[str, Any]]


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
