"""Text a tenant wrote, made safe to put in front of an operator — on a terminal (the CLI) or in a log line: every
character that could drive a terminal is shown escaped instead."""

from __future__ import annotations

#: What a tenant's text could drive the operator's terminal with (control characters but newline and tab — escape
#: sequences, bells, carriage returns — DEL, C1 controls, bidirectional overrides): shown escaped instead.
_UNSAFE = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F, *range(0x80, 0xA0)) if c not in (0x09, 0x0A)}
_UNSAFE |= {c: f"\\u{c:04x}" for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))}
#: The same, and newlines and tabs too: for text that must stay on its one line (a title in a listing, a log line).
_UNSAFE_IN_LINE = _UNSAFE | {0x09: "\\t", 0x0A: "\\n"}


def printable(text: str) -> str:
    """``text`` with every character that could drive a terminal shown escaped (``\\x1b``, ``\\u202e``)."""
    return text.translate(_UNSAFE)


def one_line(text: str) -> str:
    """``printable``, with newlines and tabs escaped too: it cannot make a line look like two."""
    return text.translate(_UNSAFE_IN_LINE)
