"""What a crash report carries, on both sides of the protocol: how a process ended, and the tail of its stderr.

``WORKER_CRASHED`` (a worker, reported by the supervisor) and ``RUNTIME_CRASHED`` (a runtime's own process, reported
by its worker) describe the end the same way: ``exit_code`` or ``signal``, and the last bytes the process wrote to
stderr (stored as a blob, referenced by ``stderr_tail_ref``).
"""

from __future__ import annotations

import signal
from collections import deque
from dataclasses import dataclass
from typing import Any

#: Bytes of a process's stderr kept for its crash report.
STDERR_TAIL_BYTES = 64 * 1024


@dataclass(frozen=True)
class ExitStatus:
    exit_code: int | None  # None when ended by a signal
    signal: int | None

    @classmethod
    def from_returncode(cls, returncode: int) -> ExitStatus:
        """From a ``subprocess``-style return code: negative means killed by that signal."""
        return cls(None, -returncode) if returncode < 0 else cls(returncode, None)

    def describe(self) -> str:
        if self.signal is not None:
            return f"killed by signal {_signal_name(self.signal)}"
        return f"exited with code {self.exit_code}"

    def to_json_obj(self) -> dict[str, Any]:
        out: dict[str, Any] = {"exit_code": self.exit_code}
        if self.signal is not None:
            out["signal"] = _signal_name(self.signal)
        return out


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


class StderrTail:
    """Keeps the last ``limit`` bytes of a stream (a process's stderr) for its crash report."""

    def __init__(self, limit: int = STDERR_TAIL_BYTES) -> None:
        self._chunks: deque[bytes] = deque()
        self._size = 0
        self.limit = limit
        self._partial = b""  # the start of a line whose end has not arrived yet (for ``feed``)

    def feed(self, data: bytes | bytearray) -> list[str]:
        """Keep ``data`` and return the lines it completed (to be logged as they come; a partial line is held
        back, up to ``limit`` bytes)."""
        self.add(data)
        *complete, partial = (self._partial + bytes(data)).split(b"\n")
        self._partial = partial[-self.limit:]
        return [line.decode("utf-8", "replace") for line in complete]

    def add(self, data: bytes | bytearray) -> None:
        if not data:
            return
        self._chunks.append(bytes(data))
        self._size += len(data)
        while self._size - len(self._chunks[0]) >= self.limit:
            self._size -= len(self._chunks.popleft())

    def text(self) -> str:
        return b"".join(self._chunks)[-self.limit:].decode("utf-8", errors="replace")
