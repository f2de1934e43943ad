"""Timestamps are stored as ISO-8601 UTC text so they sort and read back exactly."""

from __future__ import annotations

from datetime import UTC, datetime

from codesdk.protocol import utc_now


def to_text(value: datetime) -> str:
    if value.tzinfo is None:
        raise ValueError("timestamps must carry a timezone (UTC)")
    return value.astimezone(UTC).isoformat()


def from_text(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)


def now_text() -> str:
    return to_text(utc_now())
