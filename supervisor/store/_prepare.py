"""Turning drafts into validated, serialized events — on the caller's side, before anything is queued.

Doing all validation and serialization here means a bad draft raises ``InvalidEvent`` to the caller and
never reaches the writer: a failing batch leaves the database untouched by construction.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC

from pydantic import ValidationError

from codesdk.protocol import (
    EVENT_MODELS,
    PAYLOAD_MODELS,
    SCHEMA_VERSION,
    EventType,
    Model,
    NormalizedEvent,
    RuntimeInfo,
    Trace,
    utc_now,
)

from ._errors import InvalidEvent
from ._records import EventDraft
from ._sql import PreparedEvent
from ._time import to_text


def prepare(session_id: str, drafts: Sequence[EventDraft]) -> list[PreparedEvent]:
    return [_prepare_one(session_id, index, draft) for index, draft in enumerate(drafts)]


def _prepare_one(session_id: str, index: int, draft: EventDraft) -> PreparedEvent:
    where = f"event draft #{index} of the batch for session {session_id!r}"
    if not isinstance(draft, EventDraft):
        raise InvalidEvent(f"{where} is a {type(draft).__name__}, not an EventDraft")
    try:
        event_type = EventType(draft.type)
    except ValueError:
        raise InvalidEvent(f"{where} has unknown event type {draft.type!r}") from None
    trace = draft.trace if draft.trace is not None else Trace(session_id=session_id)
    if trace.session_id != session_id:
        raise InvalidEvent(f"{where} has trace.session_id {trace.session_id!r}; it must match the session")
    try:
        event = _trusted(event_type, draft, trace) or EVENT_MODELS[event_type](  # its class validates the payload
            seq=1,  # placeholder: the writer assigns the real seq inside its transaction
            time=draft.time if draft.time is not None else utc_now(),
            type=event_type,
            trace=trace,
            runtime=draft.runtime,
            payload=draft.payload if isinstance(draft.payload, Model) else dict(draft.payload),
        )
        # the wire form (``to_json_obj``) minus seq; fails here on lone surrogates, bytes, sets ...
        body = event.model_dump_json(exclude_none=True, exclude={"seq"})
    except ValidationError as exc:
        raise InvalidEvent(f"{where} ({event_type}) is invalid: {exc}") from exc
    except (ValueError, TypeError) as exc:  # unencodable text, unserializable values
        raise InvalidEvent(f"{where} ({event_type}) cannot be stored as JSON: {exc}") from exc
    return PreparedEvent(
        event=event, task_id=trace.task_id, type=event_type.value, time=to_text(event.time), body=body
    )


def _trusted(event_type: EventType, draft: EventDraft, trace: Trace) -> NormalizedEvent | None:
    """The event built without validating again, when every part already is a validated model of the right
    type (what the engine hands over for every streamed event); None means: validate as usual."""
    payload, runtime = draft.payload, draft.runtime
    if type(payload) is not PAYLOAD_MODELS[event_type] or type(runtime) is not RuntimeInfo or type(trace) is not Trace:
        return None
    time = draft.time if draft.time is not None else utc_now()
    if time.tzinfo is not UTC:
        return None
    return EVENT_MODELS[event_type].model_construct(schema_version=SCHEMA_VERSION, seq=1, time=time,
                                                    type=event_type, trace=trace, runtime=runtime, payload=payload)
