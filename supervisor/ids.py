"""Identifiers the supervisor makes: a kind prefix and 128 random bits (``ses_``, ``task_``, ``apr_``, …), the
same everywhere so a log line or a URL says what an id names."""

from __future__ import annotations

import uuid


def new_id(prefix: str) -> str:
    """``{prefix}_`` and 32 hex digits of a random UUID: unique without coordination between supervisors."""
    return f"{prefix}_{uuid.uuid4().hex}"


def is_id(value: str, prefix: str) -> bool:
    """Whether ``value`` is an id ``new_id(prefix)`` could have made."""
    head, sep, tail = value.partition("_")
    return head == prefix and bool(sep) and len(tail) == 32 and all(c in "0123456789abcdef" for c in tail)
