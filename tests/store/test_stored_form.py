"""Events as the store publishes them to subscribers: the JSON it stored with the seq put in, byte for byte what the
event's model gives, and the model itself only when asked for."""

from __future__ import annotations

import tempfile
from dataclasses import replace
from datetime import UTC
from pathlib import Path

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from codesdk.protocol import EventType, NormalizedEvent
from codesdk.supervisor.store import EventDraft, EventStore, InvalidEvent, PayloadJson
from codesdk.supervisor.store._prepare import _trusted, _validated, prepare
from codesdk.supervisor.store._stored import StoredEvent

from tests.protocol.test_models import normalized_events


def _draft(event: NormalizedEvent, session_id: str) -> EventDraft:
    return EventDraft(type=event.type, runtime=event.runtime, payload=event.payload,
                      trace=event.trace.model_copy(update={"session_id": session_id}), time=event.time)


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(normalized_events(), min_size=1, max_size=6))
def test_published_events_are_the_models_json_byte_for_byte(events: list[NormalizedEvent]) -> None:
    """Whatever the events (every type, any text), a subscriber's live ``StoredEvent`` has the body the model of the
    stored event serialises to, exactly; its model equals what a read gives; one object per event serves every
    subscriber (its frame is built once)."""
    async def check() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            async with EventStore.open(Path(tmp) / "data", synchronous="NORMAL") as store:
                session = await store.create_session(runtime="scripted", namespace="default")
                live: list[list[StoredEvent]] = [[], []]
                warm = [trio.Event(), trio.Event()]

                async def follow(into: list[StoredEvent], warmed: trio.Event) -> None:
                    async with store.subscribe(session.session_id) as subscription:
                        await subscription.next_stored()  # the warm-up event: read or pushed
                        warmed.set()  # caught up with the past: what comes next is pushed live
                        while len(into) < len(events):
                            into.append(await subscription.next_stored())

                drafts = [_draft(e, session.session_id) for e in events]
                async with trio.open_nursery() as nursery:
                    for into, warmed in zip(live, warm, strict=True):
                        nursery.start_soon(follow, into, warmed)
                    await store.append_events(session.session_id, drafts[:1])
                    for warmed in warm:
                        await warmed.wait()
                    await store.append_events(session.session_id, drafts)
                read = await store.read(session.session_id, after_seq=1)
                assert [s.seq for s in live[0]] == [e.seq for e in read]
                for stored, other, event in zip(live[0], live[1], read, strict=True):
                    assert stored is other and stored.frame is other.frame
                    assert stored.body == event.__pydantic_serializer__.to_json(event, exclude_none=True)
                    assert stored.type == event.type and stored.model() == event

    async def guarded() -> None:
        with trio.fail_after(60):  # a guard against a hang, not a timing
            await check()

    trio.run(guarded)


@given(normalized_events())
def test_an_event_put_together_from_its_parts_is_the_json_its_model_gives(event: NormalizedEvent) -> None:
    """The engine's events are stored from their parts' JSON without building the event (``_trusted``); the result is
    byte for byte the validated event's JSON, its columns the same, and the model it makes is that event."""
    utc = event.model_copy(update={"time": event.time.astimezone(UTC)})
    draft = EventDraft(type=utc.type, runtime=utc.runtime, payload=utc.payload, trace=utc.trace, time=utc.time)
    if draft.time is not None and draft.time.tzinfo is not UTC:
        draft = replace(draft, time=draft.time.replace(tzinfo=UTC))
    trusted = _trusted(EventType(draft.type), draft, utc.trace)
    assert trusted is not None
    validated = _validated(EventType(draft.type), draft, utc.trace)
    assert trusted.body == validated.body
    assert (trusted.type, trusted.time, trusted.task_id, trusted.schema_version) == (
        validated.type, validated.time, validated.task_id, validated.schema_version)
    assert trusted.model(utc.seq) == validated.model(utc.seq) == utc


@given(normalized_events())
def test_a_payload_given_as_its_json_is_stored_as_the_model_would_store_it(event: NormalizedEvent) -> None:
    """A payload the worker-line decoder validated comes as its JSON (``PayloadJson``): the stored body is the one
    its model gives, and the model made on demand is the event."""
    time = event.time.astimezone(UTC)
    as_json = PayloadJson(event.type, event.payload.__pydantic_serializer__.to_json(event.payload, exclude_none=True))
    draft = EventDraft(type=event.type, runtime=event.runtime, payload=as_json, trace=event.trace, time=time)
    as_model = replace(draft, payload=event.payload)
    [from_json], [from_model] = prepare(event.trace.session_id, [draft]), prepare(event.trace.session_id, [as_model])
    assert from_json.body == from_model.body
    assert from_json.model(event.seq) == event.model_copy(update={"time": time})
    with pytest.raises(InvalidEvent, match="carries a"):  # a payload of another type is refused, not stored
        other = next(t for t in EventType if t != event.type)
        prepare(event.trace.session_id, [replace(draft, type=other)])
