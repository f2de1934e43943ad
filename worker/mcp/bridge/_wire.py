"""What both ends of the bridge socket share: names, bounds, line splitting and long socket paths.

Imported by the bridge process before it has said hello, so it imports nothing beyond the standard library's
basics: a bridge the worker refuses exits in milliseconds, without loading trio or mcp.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

#: The environment variables through which the agent hands the bridge its endpoint (``BridgeEndpoint.mcp_server``).
SOCKET_ENV = "CODESDK_BRIDGE_SOCKET"
TOKEN_ENV = "CODESDK_BRIDGE_TOKEN"

#: Longest line either side accepts on the socket (without its newline): the protocol's frame limit, so any tool
#: result the worker's own protocol carries fits.
MAX_LINE_BYTES = 8 * 1024 * 1024

#: Longest JSON-RPC line taken from the agent on stdin: a call's arguments plus MCP's envelope. Beyond it a line is
#: dropped (logged); a call that long could not be forwarded within the socket's own limit anyway.
MAX_STDIN_LINE_BYTES = 2 * MAX_LINE_BYTES

#: The longest path ``bind``/``connect`` take: ``sun_path`` is 108 bytes with its NUL; a margin for other kernels.
_MAX_SUN_PATH_BYTES = 100

#: What a call answered by nobody says: the worker closed the socket (the task ended) before answering it.
TASK_ENDED = "the task ended: CodeSDK's tools are no longer available"


class LineTooLong(ValueError):
    """A line grew past the limit; its bytes up to the next newline are dropped."""


class LineReader:
    """Splits bytes into lines (without the newline), at most ``max_line_bytes`` each. Sans-IO: ``feed`` bytes,
    take lines with ``next_line``. An over-long line raises ``LineTooLong`` once and is skipped."""

    def __init__(self, max_line_bytes: int) -> None:
        self.max_line_bytes = max_line_bytes
        self._buffer = bytearray()
        self._scanned = 0  # bytes of _buffer known to hold no newline: each byte is searched once
        self._discarding = False

    def feed(self, data: bytes) -> None:
        self._buffer += data

    def next_line(self) -> bytes | None:
        """The next complete line, or None until more bytes come."""
        while True:
            newline = self._buffer.find(b"\n", self._scanned)
            if newline < 0:
                self._scanned = len(self._buffer)
                if self._discarding:
                    self._buffer.clear()
                    self._scanned = 0
                elif len(self._buffer) > self.max_line_bytes:
                    self._discarding = True
                    self._buffer.clear()
                    self._scanned = 0
                    raise LineTooLong(f"a line longer than {self.max_line_bytes} bytes")
                return None
            line = bytes(self._buffer[:newline])
            del self._buffer[:newline + 1]
            self._scanned = 0
            if self._discarding:
                self._discarding = False
                continue
            if len(line) > self.max_line_bytes:
                raise LineTooLong(f"a line longer than {self.max_line_bytes} bytes")
            if line.strip():
                return line

    def rest(self) -> bytes | None:
        """At end of input: a last line that had no newline, if any."""
        line = bytes(self._buffer)
        self._buffer.clear()
        self._scanned = 0
        return line if line.strip() and not self._discarding else None


def encode_line(message: dict[str, Any]) -> bytes:
    """One message as a line. A lone surrogate in a string (possible in Python ``str``) becomes ``?``."""
    return json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "replace") + b"\n"


@contextmanager
def socket_address(path: Path) -> Iterator[str]:
    """An address for ``bind``/``connect`` that names ``path`` whatever its length.

    A path too long for ``sun_path`` is reached through a descriptor of its directory: ``/proc/self/fd/<fd>/<name>``
    resolves to the same inode (no ``chdir``, which would race every other task of the process). The descriptor
    is closed when the block ends; the address is only good inside it.
    """
    if len(os.fsencode(path)) <= _MAX_SUN_PATH_BYTES:
        yield str(path)
        return
    directory = os.open(path.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{directory}/{path.name}"
    finally:
        os.close(directory)
