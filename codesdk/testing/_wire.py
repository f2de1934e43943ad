"""Every line a worker wrote, in the order it arrived: what a protocol test asserts ordering and cleanliness on."""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from codesdk.protocol import BadFrame

#: Lines kept by default (the count of all lines is exact; the log keeps the most recent).
WIRE_LINES_KEPT = 100_000


@dataclass(frozen=True)
class WireLine:
    """One line the worker wrote: its place on the wire (from 0), and the line (or why it could not be read)."""

    index: int
    line: bytes | BadFrame

    def message(self) -> dict[str, Any] | None:
        """The line as a JSON object, or None when it is not one (a bad frame, a log line, a scalar)."""
        if isinstance(self.line, BadFrame):
            return None
        try:
            value = json.loads(self.line)
        except ValueError:
            return None
        return value if isinstance(value, dict) else None

    def text(self, limit: int = 200) -> str:
        """The line for a report, shortened to ``limit`` characters."""
        text = (f"<{self.line.problem}: {self.line.detail}>" if isinstance(self.line, BadFrame)
                else self.line.decode(errors="replace"))
        return text if len(text) <= limit else text[: limit - 1] + "…"


class WireLog:
    """The worker's output lines, appended by the connection's reader as they arrive."""

    def __init__(self, keep: int = WIRE_LINES_KEPT) -> None:
        self.lines: deque[WireLine] = deque(maxlen=keep)
        self.count = 0

    def record(self, line: bytes | BadFrame) -> None:
        self.lines.append(WireLine(self.count, line))
        self.count += 1

    def bad_lines(self) -> list[WireLine]:
        """Lines that are not JSON-RPC objects at all: a log line, a torn or oversized frame."""
        return [entry for entry in self.lines if (entry.message() or {}).get("jsonrpc") != "2.0"]

    def first_index(self, where: Callable[[dict[str, Any]], bool]) -> int | None:
        """Where the first message (a JSON object) ``where`` holds for arrived, if one did."""
        for entry in self.lines:
            message = entry.message()
            if message is not None and where(message):
                return entry.index
        return None

    def first_event_index(self, task_id: str) -> int | None:
        """Where the first ``runtime.event`` of ``task_id`` arrived, if one did."""
        return self.first_index(lambda message: message.get("method") == "runtime.event"
                                and isinstance(params := message.get("params"), dict)
                                and params.get("task_id") == task_id)
