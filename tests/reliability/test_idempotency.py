"""Repeats never act twice: a retried append is stored once, a repeated event or tool request is not handled
again, and input the store cannot hash ends only its own task — never a dropped batch and a hung task.

The engine-level cases feed the supervisor's real event handler with what a hostile or buggy worker could
send, through the engine's worker seam (a double holds the task open: a real process adds nothing here).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from codesdk.protocol import (
    EventType,
    Method,
    ModelOutputDelta,
    RuntimeEventParams,
    RuntimeInfo,
    TaskCompleted,
    TaskStopped,
    ToolCallRequested,
    WorkerEvent,
    canonical_hash,
)
from codesdk.supervisor.engine import session_events
from codesdk.supervisor.store import EventDraft, EventStore, TaskState, TaskUpdate
from codesdk.testing.invariants import check_session
from tests.engine.doubles import engine_with_doubles, running_task


def _draft(text: str) -> EventDraft:
    return EventDraft(type=EventType.SESSION_CREATED, runtime=RuntimeInfo(name="scripted"),
                      payload={"contract_version": "1.0", "runtime": "scripted", "namespace": "default",
                               "metadata": {"text": text}})


async def test_a_retried_append_is_stored_once_also_across_a_restart(tmp_path: Path) -> None:
    async with EventStore.open(tmp_path) as store:
        session = await store.create_session(runtime="scripted", namespace="default")
        sid = session.session_id
        seen: list[int] = []

        async def follow() -> None:
            async with store.subscribe(sid) as events:
                async for event in events:
                    seen.append(event.seq)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(follow)
            first = await store.append(sid, [_draft("a"), _draft("b")], idempotency_key="batch-1")
            again = await store.append(sid, [_draft("a"), _draft("b")], idempotency_key="batch-1")
            other = await store.append(sid, [_draft("c")], idempotency_key="batch-2")
            await trio.sleep(0.2)
            nursery.cancel_scope.cancel()
        assert [e.seq for e in again] == [e.seq for e in first] == [1, 2]
        assert again == first
        assert [e.seq for e in other] == [3]
        assert seen == [1, 2, 3], "a subscriber was handed a repeat"
    async with EventStore.open(tmp_path) as store:  # the key outlives the process
        again = await store.append(sid, [_draft("a"), _draft("b")], idempotency_key="batch-1")
        assert [e.seq for e in again] == [1, 2]
        assert await store.last_seq(sid) == 3


async def test_an_append_cancelled_after_it_was_queued_then_retried_is_stored_once(tmp_path: Path) -> None:
    """The ambiguous failure a key exists for: the caller gave up, not knowing whether the batch was committed."""
    async with EventStore.open(tmp_path) as store:
        sid = (await store.create_session(runtime="scripted", namespace="default")).session_id
        with trio.move_on_after(0) as scope:
            await store.append(sid, [_draft("x")] * 3, idempotency_key="k")
        assert scope.cancelled_caught
        retried = await store.append(sid, [_draft("x")] * 3, idempotency_key="k")
        assert [e.seq for e in retried] == [1, 2, 3]
        assert await store.last_seq(sid) == 3


async def test_a_key_needs_events(tmp_path: Path) -> None:
    async with EventStore.open(tmp_path) as store:
        sid = (await store.create_session(runtime="scripted", namespace="default")).session_id
        with pytest.raises(ValueError, match="at least one event"):
            await store.append(sid, [], idempotency_key="k", task_update=TaskUpdate(task_id="task_x"))


# -- the engine, fed repeats and poison by a worker ------------------------------------------------


def _event(type_: EventType, payload: Any) -> WorkerEvent:
    return WorkerEvent(type=type_, runtime=RuntimeInfo(name="scripted"), payload=payload)


async def test_a_repeated_event_ordinal_is_stored_once(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with engine_with_doubles(tmp_path / "data") as (engine, workers):
            sid, task_id, worker = await running_task(engine, workers, tmp_path / "ws")
            n = worker.next_n(task_id)
            delta = _event(EventType.MODEL_OUTPUT_DELTA, ModelOutputDelta(block_id="b9", delta="once"))
            batch = [RuntimeEventParams(task_id=task_id, n=n, event=delta)] * 3
            await worker.emit_batch(batch)
            await worker.emit_batch(batch[:1])
            events = await session_events(engine.store, sid)
            assert [getattr(e.payload, "delta", None) for e in events].count("once") == 1
            assert engine.stats.duplicate_events == 3
            await engine.stop_task(task_id)


async def test_a_repeated_tool_request_never_runs_a_write_twice(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    with trio.fail_after(60):
        async with engine_with_doubles(tmp_path / "data") as (engine, workers):
            sid, task_id, worker = await running_task(engine, workers, workspace, permission_mode="yolo")
            tool_input = {"path": "log.txt", "content": "written\n"}
            request = ToolCallRequested(tool_call_id="call_w", attempt=1, input_hash=canonical_hash(tool_input),
                                        tool_name="workspace.write", input=tool_input)
            for _ in range(3):  # the same request, sent again under new ordinals
                await worker.emit(task_id, EventType.TOOL_CALL_REQUESTED, request)
            await worker.connection.wait_for(Method.SEND_TOOL_RESULT)
            # A genuine retry (the runtime's next attempt) is a new call and may run.
            retry = request.model_copy(update={"attempt": 2})
            await worker.emit(task_id, EventType.TOOL_CALL_REQUESTED, retry)
            await worker.connection.wait_for(Method.SEND_TOOL_RESULT, count=2)
            await engine.stop_task(task_id)
            events = await session_events(engine.store, sid)
    check_session(events)
    started = [e.payload for e in events if e.type == EventType.TOOL_CALL_STARTED]
    assert [(s.tool_call_id, s.attempt) for s in started] == [("call_w", 1), ("call_w", 2)]  # type: ignore[attr-defined]
    assert (workspace / "log.txt").read_text() == "written\n"


async def test_input_the_store_cannot_hash_ends_only_that_task(tmp_path: Path) -> None:
    """An integer beyond 2**53 cannot be canonically hashed: the task fails with a clear protocol error, the
    events before it in the same batch are kept, and the worker and other tasks go on."""
    with trio.fail_after(60):
        async with engine_with_doubles(tmp_path / "data") as (engine, workers):
            sid, task_id, worker = await running_task(engine, workers, tmp_path / "ws")
            poison = ToolCallRequested(tool_call_id="call_p", attempt=1, input_hash="sha256:" + "0" * 64,
                                       tool_name="workspace.read", input={"path": "a", "offset": 2**60})
            await worker.emit_batch([
                worker.event(task_id, EventType.MODEL_OUTPUT_DELTA, ModelOutputDelta(block_id="b8", delta="kept")),
                worker.event(task_id, EventType.TOOL_CALL_REQUESTED, poison),
            ])
            record = await engine.wait_task(task_id)
            assert record.state == TaskState.FAILED and record.error is not None
            assert record.error["code"] == "PROTOCOL_ERROR"
            assert "tool.call.requested" in record.error["message"] and "cannot be stored" in record.error["message"]
            events = await session_events(engine.store, sid)
            check_session(events)
            assert any(getattr(e.payload, "delta", None) == "kept" for e in events)
            await worker.connection.wait_for(Method.STOP)  # the runtime is told to stop, and lets go of the task
            await worker.emit(task_id, EventType.TASK_STOPPED, TaskStopped(reason="stop requested"))
            nxt = await engine.start_task(sid, "next")
            await worker.connection.wait_for(Method.START_TASK, count=2)  # the same worker serves on
            await worker.emit(nxt.task_id, EventType.TASK_COMPLETED, TaskCompleted())
            assert (await engine.wait_task(nxt.task_id)).state == TaskState.COMPLETED
            assert workers.worker("default") is worker
