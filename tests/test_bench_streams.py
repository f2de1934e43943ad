"""The streams benchmark's subscriber reads the emit times back from the service's own SSE frames.

``scripts/benchmarks/streams_subscriber.py`` parses frames with a regular expression rather than building event
models (so that it stays far from being the benchmark's bottleneck); this keeps it in step with the frames the API
really writes (``StoredEvent.frame``), however the bytes are cut into chunks.
"""

from __future__ import annotations

from datetime import UTC, datetime

from codesdk.protocol import EventType, ModelOutputDelta, NormalizedEvent, TaskCompleted, Trace
from codesdk.supervisor.store._stored import StoredEvent
from scripts.benchmarks.streams_subscriber import emitted_times

_T = datetime(2026, 1, 1, tzinfo=UTC)


def _frames() -> tuple[bytes, list[int]]:
    sent = [1_795_000_000_000_000_000 + k for k in range(5)]
    events = [NormalizedEvent(seq=k + 1, time=_T, type=EventType.MODEL_OUTPUT_DELTA, trace=Trace(session_id="s"),
                              runtime={"name": "bench"},
                              payload=ModelOutputDelta(block_id="paced", delta=str(ns), index=k))
              for k, ns in enumerate(sent)]
    events.insert(2, NormalizedEvent(seq=9, time=_T, type=EventType.MODEL_OUTPUT_DELTA, trace=Trace(session_id="s"),
                                     runtime={"name": "bench"},
                                     payload=ModelOutputDelta(block_id="other", delta="123", index=0)))
    events.append(NormalizedEvent(seq=10, time=_T, type=EventType.TASK_COMPLETED, trace=Trace(session_id="s"),
                                  runtime={"name": "bench"}, payload=TaskCompleted()))
    return b"".join(StoredEvent.of(event).frame for event in events) + b": keep-alive\n\n", sent


def test_every_paced_delta_is_read_once_wherever_the_chunks_are_cut() -> None:
    data, sent = _frames()
    for cut in range(len(data) + 1):
        first, tail = emitted_times(data[:cut])
        second, rest = emitted_times(tail + data[cut:])
        assert first + second == sent, f"cut at {cut}"
        assert rest == b""


def test_an_unfinished_frame_is_kept_whole_for_the_next_chunk() -> None:
    data, sent = _frames()
    partial = data[:data.index(b"\n\n") - 1]
    assert emitted_times(partial) == ([], partial)
