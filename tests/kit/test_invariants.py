"""The event-stream checks of codesdk.testing.invariants: every well-formed worker stream passes, and each kind of
breakage is caught and named — whatever the interleaving of tasks."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from codesdk.testing import InvariantError, check_worker_events
from codesdk.protocol import RuntimeEventParams, canonical_hash

_T0 = datetime(2026, 11, 24, tzinfo=UTC)
_TERMINALS = [("task.completed", {}), ("task.failed", {"code": "RUNTIME_ERROR", "message": "x"}),
              ("task.stopped", {"reason": "enough"})]


def _body(task: str, kind: str, k: int) -> tuple[str, dict[str, Any]]:
    if kind == "delta":
        return "model.output.delta", {"block_id": f"{task}:b1", "delta": f"d{k}", "index": k}
    if kind == "tool":
        tool_input = {"path": f"{task}-{k}.txt"}
        return "tool.call.requested", {"tool_call_id": f"{task}-call{k}", "input_hash": canonical_hash(tool_input),
                                       "tool_name": "workspace.read", "input": tool_input}
    return "usage.reported", {"input_tokens": k}


@st.composite
def streams(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Several tasks' well-formed events, interleaved at random, as the wire carries them (JSON objects)."""
    tasks = {f"t{i}": draw(st.lists(st.sampled_from(["delta", "tool", "usage"]), max_size=8))
             for i in range(draw(st.integers(1, 4)))}
    terminals = {task: draw(st.sampled_from(_TERMINALS)) for task in tasks}
    queues = {task: [*(_body(task, kind, k) for k, kind in enumerate(kinds)), terminals[task]]
              for task, kinds in tasks.items()}
    sent = dict.fromkeys(tasks, 0)
    stream: list[dict[str, Any]] = []
    while any(queues.values()):
        task = draw(st.sampled_from(sorted(t for t, q in queues.items() if q)))
        event_type, payload = queues[task].pop(0)
        sent[task] += 1
        stream.append({"task_id": task, "n": sent[task], "event": {
            "type": event_type, "time": (_T0 + timedelta(seconds=len(stream))).isoformat(),
            "runtime": {"name": "scripted"}, "payload": payload}})
    return stream


def _events(stream: list[dict[str, Any]]) -> list[RuntimeEventParams]:
    return [RuntimeEventParams.model_validate(item) for item in stream]


@given(streams())
def test_every_well_formed_stream_passes(stream: list[dict[str, Any]]) -> None:
    check_worker_events(_events(stream))


@given(streams(), st.data())
def test_a_missing_event_is_a_gap(stream: list[dict[str, Any]], data: st.DataObject) -> None:
    last = {item["task_id"]: item["n"] for item in stream}
    inner = [i for i, item in enumerate(stream) if 1 < item["n"] < last[item["task_id"]]]
    if not inner:
        return
    del stream[data.draw(st.sampled_from(inner))]
    with pytest.raises(InvariantError, match="without gaps or repeats"):
        check_worker_events(_events(stream))


@given(streams(), st.data())
def test_an_event_after_the_terminal_one_is_caught(stream: list[dict[str, Any]], data: st.DataObject) -> None:
    task = data.draw(st.sampled_from(sorted({item["task_id"] for item in stream})))
    last = max(item["n"] for item in stream if item["task_id"] == task)
    stream.append({"task_id": task, "n": last + 1, "event": {
        "type": "usage.reported", "time": (_T0 + timedelta(days=1)).isoformat(), "runtime": {"name": "scripted"},
        "payload": {}}})
    with pytest.raises(InvariantError, match=f"task '{task}': events after its terminal event"):
        check_worker_events(_events(stream))


@given(streams(), st.data())
def test_a_second_terminal_event_is_caught(stream: list[dict[str, Any]], data: st.DataObject) -> None:
    task = data.draw(st.sampled_from(sorted({item["task_id"] for item in stream})))
    last = max(item["n"] for item in stream if item["task_id"] == task)
    stream.append({"task_id": task, "n": last + 1, "event": {
        "type": "task.completed", "time": (_T0 + timedelta(days=1)).isoformat(), "runtime": {"name": "scripted"},
        "payload": {}}})
    with pytest.raises(InvariantError, match=f"task '{task}': 2 terminal events"):
        check_worker_events(_events(stream))


@given(streams(), st.data())
def test_a_task_without_its_terminal_event_is_caught_unless_cut_short(stream: list[dict[str, Any]],
                                                                       data: st.DataObject) -> None:
    longer = sorted({item["task_id"] for item in stream if item["n"] > 1})  # a task of one event would vanish
    if not longer:
        return
    task = data.draw(st.sampled_from(longer))
    terminal = max(i for i, item in enumerate(stream) if item["task_id"] == task)
    del stream[terminal]
    with pytest.raises(InvariantError, match=f"task '{task}': no terminal event"):
        check_worker_events(_events(stream))
    check_worker_events(_events(stream), ended=False)


@given(streams(), st.data())
def test_an_input_hash_that_is_not_the_input_s_is_caught(stream: list[dict[str, Any]], data: st.DataObject) -> None:
    calls = [item for item in stream if item["event"]["type"] == "tool.call.requested"]
    if not calls:
        return
    call = data.draw(st.sampled_from(calls))
    call["event"]["payload"]["input"] = {"path": "swapped.txt"}
    with pytest.raises(InvariantError, match="but its input hashes to"):
        check_worker_events(_events(stream))


def test_time_running_backwards_within_a_task_is_caught() -> None:
    stream = [{"task_id": "t", "n": n, "event": {"type": kind, "time": (_T0 - timedelta(seconds=n)).isoformat(),
                                                 "runtime": {"name": "scripted"}, "payload": {}}}
              for n, kind in ((1, "usage.reported"), (2, "task.completed"))]
    with pytest.raises(InvariantError, match="is timed .* before n=1"):
        check_worker_events(_events(stream))
