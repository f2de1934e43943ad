"""SSE frames: one ``data`` line holding the event's wire JSON, built once per stored event and shared."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from codesdk.protocol import NormalizedEvent, utc_now
from codesdk.supervisor.api._frames import FrameCache, sse_frame


def _delta(seq: int, text: str, session_id: str = "s1") -> NormalizedEvent:
    return NormalizedEvent.model_validate({
        "seq": seq, "time": utc_now(), "type": "model.output.delta", "trace": {"session_id": session_id},
        "runtime": {"name": "scripted"}, "payload": {"block_id": "b1", "delta": text}})


@given(st.text(), st.integers(min_value=1, max_value=2**53))
def test_a_frame_is_one_data_line_holding_the_events_wire_json(text: str, seq: int) -> None:
    """Whatever the text (line breaks, non-ASCII, the SSE field names themselves), the frame has exactly its id,
    event and one data line, and the data is the event's wire form."""
    event = _delta(seq, text)
    try:
        frame = sse_frame(event)
    except ValueError:  # a lone surrogate is not UTF-8: the store refuses such text before any frame is made
        assert any(0xD800 <= ord(c) <= 0xDFFF for c in text)
        return
    assert frame.endswith(b"\n\n")
    lines = frame[:-2].split(b"\n")
    assert lines[0] == b"id: %d" % seq and lines[1] == b"event: model.output.delta" and len(lines) == 3
    assert lines[2].startswith(b"data: ")
    assert json.loads(lines[2][len(b"data: "):]) == event.to_json_obj()


def test_streams_of_one_session_share_each_frame_and_the_cache_stays_bounded() -> None:
    cache = FrameCache(kept=3)
    events = [_delta(seq, f"d{seq}") for seq in range(1, 6)]
    first = [cache.frame("s1", event) for event in events[:3]]
    second = [cache.frame("s1", event) for event in events[:3]]  # another stream of the same session
    assert first == second and all(a is b for a, b in zip(first, second, strict=True)) and cache.built == 3
    assert cache.frame("s2", _delta(1, "other", "s2")) != first[0]  # the seq of another session is another event
    assert cache.built == 4
    for event in events[3:]:
        cache.frame("s1", event)
    assert cache.built == 6 and len(cache) == 3  # bounded: the oldest went
    cache.frame("s1", events[0])  # a stream far behind builds its frame again
    assert cache.built == 7
