"""The event invariants of the contract, checked over a session's stored events."""

from __future__ import annotations

from collections import defaultdict

from protocol import TERMINAL_EVENT_TYPES, EventType, NormalizedEvent

_TOOL_ORDER = {
    EventType.TOOL_CALL_REQUESTED: 0,
    EventType.TOOL_CALL_POLICY_EVALUATED: 1,
    EventType.APPROVAL_REQUESTED: 1,  # between the "ask" and the user's evaluation
    EventType.TOOL_CALL_APPROVED: 2,
    EventType.TOOL_CALL_DENIED: 2,
    EventType.TOOL_CALL_STARTED: 3,
    EventType.TOOL_OUTPUT_DELTA: 4,
    EventType.TOOL_OUTPUT_COMPLETED: 5,
    EventType.TOOL_CALL_COMPLETED: 6,
}


def check_session(events: list[NormalizedEvent]) -> None:
    assert [e.seq for e in events] == list(range(1, len(events) + 1)), "seq must be gap-free from 1"
    assert events[0].type == EventType.SESSION_CREATED
    by_task: dict[str, list[NormalizedEvent]] = defaultdict(list)
    for event in events[1:]:
        assert event.trace.task_id, f"event {event.seq} has no task"
        by_task[event.trace.task_id].append(event)
    active: str | None = None
    for event in events[1:]:
        if event.type == EventType.TASK_STARTED:
            assert active is None, "one active task per session"
            active = event.trace.task_id
        assert event.trace.task_id == active, f"event {event.seq} outside its task's lifetime"
        if event.type in TERMINAL_EVENT_TYPES:
            active = None
    for task_events in by_task.values():
        check_task(task_events)


def check_task(events: list[NormalizedEvent]) -> None:
    types = [e.type for e in events]
    assert types[0] == EventType.TASK_STARTED
    # model.input follows once the runtime accepted the task; a task refused before that ends right away.
    assert types[1] == EventType.MODEL_INPUT or (len(types) == 2 and types[1] in TERMINAL_EVENT_TYPES)
    assert types.count(EventType.MODEL_INPUT) <= 1
    terminals = [t for t in types if t in TERMINAL_EVENT_TYPES]
    assert len(terminals) <= 1, f"more than one terminal event: {terminals}"
    if terminals:
        assert types[-1] in TERMINAL_EVENT_TYPES, "nothing may follow the terminal event"
    attempts: dict[tuple[str, int], list[EventType]] = defaultdict(list)
    for event in events:
        if event.type in _TOOL_ORDER:
            p = event.payload
            attempts[(p.tool_call_id, p.attempt)].append(event.type)  # type: ignore[attr-defined]
    for key, seen in attempts.items():
        ranks = [_TOOL_ORDER[t] for t in seen]
        assert ranks == sorted(ranks), f"tool call {key} out of order: {seen}"
        assert seen[0] == EventType.TOOL_CALL_REQUESTED and seen.count(EventType.TOOL_CALL_REQUESTED) == 1
        decisions = [t for t in seen if t in (EventType.TOOL_CALL_APPROVED, EventType.TOOL_CALL_DENIED)]
        assert len(decisions) <= 1, f"tool call {key}: more than one decision"
        if EventType.TOOL_CALL_STARTED in seen or EventType.TOOL_CALL_COMPLETED in seen:
            assert decisions == [EventType.TOOL_CALL_APPROVED], f"tool call {key} ran without approval"
        if EventType.TOOL_CALL_COMPLETED in seen:
            assert EventType.TOOL_CALL_STARTED in seen
