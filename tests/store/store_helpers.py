"""Draft builders shared by the store tests."""

from __future__ import annotations

from typing import Any

from codesdk.protocol import EventType, RuntimeInfo, Trace
from codesdk.supervisor.store import EventDraft

RUNTIME = RuntimeInfo(name="scripted", model="scripted-1")


def delta(text: str, *, block: str = "b1", task_id: str | None = None, session_id: str | None = None) -> EventDraft:
    trace = Trace(session_id=session_id, task_id=task_id) if session_id else None
    return EventDraft(
        type=EventType.MODEL_OUTPUT_DELTA, runtime=RUNTIME, payload={"block_id": block, "delta": text}, trace=trace
    )


def session_created(runtime: str = "scripted") -> EventDraft:
    return EventDraft(type="session.created", runtime=RUNTIME, payload={"runtime": runtime, "namespace": "default"})


def terminal(kind: EventType = EventType.TASK_COMPLETED, **payload: Any) -> EventDraft:
    return EventDraft(type=kind, runtime=RUNTIME, payload=payload)


def bad_delta() -> EventDraft:
    """Fails payload validation (``delta`` is required)."""
    return EventDraft(type=EventType.MODEL_OUTPUT_DELTA, runtime=RUNTIME, payload={"block_id": "b1"})


def texts(events: list[Any]) -> list[str]:
    return [event.payload.delta for event in events]
