"""W3C Trace Context's ``traceparent`` header (https://www.w3.org/TR/trace-context/#traceparent-header): the caller's
trace, which a task's events and spans join. Parsed here, not by OpenTelemetry's propagator, because the service
reads it whether or not traces are exported (the SDK is an optional extra)."""

from __future__ import annotations

import re
from typing import NamedTuple

_HEADER = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")


class TraceParent(NamedTuple):
    version: str
    trace_id: str
    parent_id: str
    flags: str

    @property
    def sampled(self) -> bool:
        return bool(int(self.flags, 16) & 1)

    def header(self) -> str:
        return f"{self.version}-{self.trace_id}-{self.parent_id}-{self.flags}"


def parse_traceparent(value: str | None) -> TraceParent | None:
    """The header's fields, or None where it is absent or invalid (the spec's rule: a receiver ignores such a header
    and starts a trace of its own). Lowercase hex only; version ``ff`` and all-zero ids are invalid; a version above
    00 may carry more fields after the four, version 00 none."""
    if value is None or len(value) > 512:
        return None
    found = _HEADER.fullmatch(value.strip(" \t"))
    if found is None:
        return None
    version, trace_id, parent_id, flags, rest = found.groups()
    if version == "ff" or (version == "00" and rest) or trace_id == "0" * 32 or parent_id == "0" * 16:
        return None
    return TraceParent(version, trace_id, parent_id, flags)
