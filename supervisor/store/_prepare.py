"""Turning drafts into validated, serialized events — on the caller's side, before anything is queued.

Doing all validation and serialization here means a bad draft raises ``InvalidEvent`` to the caller and
never reaches the writer: a failing batch leaves the database untouched by construction.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC
from typing import Any

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
from ._records import EventDraft, PayloadJson
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
        return _trusted(event_type, draft, trace) or _validated(event_type, draft, trace)
    except ValidationError as exc:
        raise InvalidEvent(f"{where} ({event_type}) is invalid: {exc}") from exc
    except (ValueError, TypeError) as exc:  # unencodable text, unserializable values
        raise InvalidEvent(f"{where} ({event_type}) cannot be stored as JSON: {exc}") from exc


def _validated(event_type: EventType, draft: EventDraft, trace: Trace) -> PreparedEvent:
    """The event built by its class, which validates the payload; its JSON (``to_json_obj`` minus seq) fails here
    on lone surrogates, bytes, sets ..."""
    event = EVENT_MODELS[event_type](
        seq=1,  # placeholder: the writer assigns the real seq inside its transaction
        time=draft.time if draft.time is not None else utc_now(),
        type=event_type,
        trace=trace,
        runtime=draft.runtime,
        payload=_payload_value(draft.payload),
    )
    body = event.model_dump_json(exclude_none=True, exclude={"seq"})
    return PreparedEvent(task_id=trace.task_id, type=event_type.value, time=to_text(event.time), body=body,
                         schema_version=event.schema_version,
                         make=lambda seq: event.model_copy(update={"seq": seq}))


def _payload_value(payload: Model | PayloadJson | Mapping[str, Any]) -> Model | dict[str, Any]:
    if isinstance(payload, PayloadJson):
        return payload.model()
    return payload if isinstance(payload, Model) else dict(payload)


def _trusted(event_type: EventType, draft: EventDraft, trace: Trace) -> PreparedEvent | None:
    """The event's JSON put together from its parts' own, without building (or validating again) the event, when
    every part already is a validated model of the right type (what the engine hands over for every streamed
    event): the same bytes ``_validated`` gives (tests/store holds it to that). None means: validate as usual."""
    payload, runtime = draft.payload, draft.runtime
    if isinstance(payload, PayloadJson):
        if payload.type != event_type:
            raise InvalidEvent(f"a {event_type} draft carries a {payload.type} payload")
        payload_json = payload.json.decode()
    elif type(payload) is PAYLOAD_MODELS[event_type]:
        payload_json = payload.__pydantic_serializer__.to_json(payload, exclude_none=True).decode()
    else:
        return None
    if type(runtime) is not RuntimeInfo or type(trace) is not Trace:
        return None
    time = draft.time if draft.time is not None else utc_now()
    if time.tzinfo is not UTC:
        return None
    text = to_text(time)  # isoformat: "...+00:00"; the models write "...Z"
    body = "".join(('{"schema_version":', _VERSION, ',"time":"', text[:-6], 'Z","type":"', event_type.value,
                    '","trace":', _json_of(trace), ',"runtime":', _json_of(runtime), ',"payload":', payload_json,
                    "}"))

    def make(seq: int) -> NormalizedEvent:
        model = payload.model() if isinstance(payload, PayloadJson) else payload
        return EVENT_MODELS[event_type].model_construct(schema_version=SCHEMA_VERSION, seq=seq, time=time,
                                                        type=event_type, trace=trace, runtime=runtime, payload=model)

    return PreparedEvent(task_id=trace.task_id, type=event_type.value, time=text, body=body,
                         schema_version=SCHEMA_VERSION, make=make)


_VERSION = str(SCHEMA_VERSION)

#: The JSON of recent traces and runtime infos, by identity: a task's events share its two (frozen) objects.
_JSON_KEPT = 1024
_json_cache: dict[int, tuple[Model, str]] = {}


def _json_of(model: Model) -> str:
    found = _json_cache.get(id(model))
    if found is not None and found[0] is model:  # the object itself is held here, so its id is not reused meanwhile
        return found[1]
    text = model.__pydantic_serializer__.to_json(model, exclude_none=True).decode()
    if len(_json_cache) >= _JSON_KEPT:
        _json_cache.clear()
    _json_cache[id(model)] = (model, text)
    return text
