"""The engine's handling of worker events, over worker doubles: what is stored, what is dropped (and counted),
and how a task ends — with a real store, and no process where a real one adds nothing."""

from __future__ import annotations

import gc
import json
from pathlib import Path

import trio
import trio.testing

from codesdk.protocol import (
    EventType,
    ExecutedBy,
    Method,
    ModelOutputDelta,
    PermissionMode,
    RuntimeEventParams,
    TaskCompleted,
    TaskFailed,
    ToolCallCompleted,
    ToolCallRequested,
    ToolCallStarted,
    canonical_hash,
    named_blobs,
)
from codesdk.supervisor.engine import session_events
from codesdk.supervisor.store import Quotas, TaskState
from codesdk.testing.invariants import check_session
from tests.conftest import MakeEngine
from tests.engine.doubles import FakeWorkers, engine_with_doubles, rpc_error, running_task


def _delta(text: str) -> ModelOutputDelta:
    return ModelOutputDelta(block_id="b1", delta=text)


async def test_a_batch_is_stored_in_the_order_the_worker_sent_it(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with engine_with_doubles(tmp_path) as (engine, workers):
            sid, task_id, worker = await running_task(engine, workers)
            tool_input = {"path": "a.txt"}
            await worker.emit_batch([
                worker.event(task_id, EventType.MODEL_OUTPUT_DELTA, _delta("one ")),
                worker.event(task_id, EventType.MODEL_OUTPUT_DELTA, _delta("two")),
                worker.event(task_id, EventType.TOOL_CALL_REQUESTED, ToolCallRequested(
                    tool_call_id="call_1", input_hash=canonical_hash(tool_input), tool_name="workspace.read",
                    input=tool_input)),
                worker.event(task_id, EventType.MODEL_OUTPUT_DELTA, _delta(" three")),
            ])
            await worker.connection.wait_for(Method.SEND_TOOL_RESULT)
            await worker.emit(task_id, EventType.TASK_COMPLETED, TaskCompleted())
            assert (await engine.wait_task(task_id)).state == TaskState.COMPLETED
            events = await session_events(engine.store, sid)
    check_session(events)
    types = [e.type for e in events if e.type != EventType.TOOL_CALL_POLICY_EVALUATED]
    assert types[:8] == [EventType.SESSION_CREATED, EventType.TASK_STARTED, EventType.MODEL_INPUT,
                         EventType.MODEL_OUTPUT_DELTA, EventType.MODEL_OUTPUT_DELTA, EventType.TOOL_CALL_REQUESTED,
                         EventType.TOOL_CALL_APPROVED, EventType.TOOL_CALL_STARTED]
    assert [getattr(e.payload, "delta", None) for e in events if e.type == EventType.MODEL_OUTPUT_DELTA] == [
        "one ", "two", " three"]
    assert types[-1] == EventType.TASK_COMPLETED


async def test_repeats_late_and_unknown_events_are_dropped_and_counted(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with engine_with_doubles(tmp_path) as (engine, workers):
            sid, task_id, worker = await running_task(engine, workers)
            once = worker.event(task_id, EventType.MODEL_OUTPUT_DELTA, _delta("once"))
            await worker.emit_batch([once, once, once])
            await worker.emit_batch([once])
            await worker.emit("task_nobody", EventType.MODEL_OUTPUT_DELTA, _delta("whose?"))
            await engine.stop_task(task_id)
            await worker.emit(task_id, EventType.MODEL_OUTPUT_DELTA, _delta("too late"))
            events = await session_events(engine.store, sid)
            stats = engine.stats
    check_session(events)
    deltas = [getattr(e.payload, "delta", None) for e in events if e.type == EventType.MODEL_OUTPUT_DELTA]
    assert deltas == ["once"]
    assert (stats.duplicate_events, stats.unknown_task_events, stats.late_events) == (3, 1, 1)


async def test_raw_runtime_messages_become_blobs_even_when_json_cannot_canonicalize_them(tmp_path: Path) -> None:
    raw = {"id": 2**64, "text": "big ids are fine"}
    big = {"text": "x" * 100_000}  # over the inline limit: written on its own
    with trio.fail_after(30):
        async with engine_with_doubles(tmp_path) as (engine, workers):
            sid, task_id, worker = await running_task(engine, workers)
            await worker.emit(task_id, EventType.MODEL_OUTPUT_DELTA, _delta("a"), raw=raw)
            await worker.emit(task_id, EventType.MODEL_OUTPUT_DELTA, _delta("b"), raw=big)
            deltas = [e for e in await session_events(engine.store, sid) if e.type == EventType.MODEL_OUTPUT_DELTA]
            kept = [json.loads(await engine.store.get_blob(str(e.runtime.raw_ref))) for e in deltas]
            await engine.stop_task(task_id)
    assert kept == [raw, big]


async def test_a_runtime_tool_event_nobody_approved_is_never_stored(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with engine_with_doubles(tmp_path) as (engine, workers):
            sid, task_id, worker = await running_task(engine, workers)
            await worker.emit(task_id, EventType.TOOL_CALL_COMPLETED, ToolCallCompleted(
                tool_call_id="call_x", input_hash=canonical_hash({}), tool_name="Bash", executed_by="runtime"))
            events = await session_events(engine.store, sid)
            await engine.stop_task(task_id)
            assert engine.stats.invalid_events == 1
    assert EventType.TOOL_CALL_COMPLETED not in [e.type for e in events]


async def test_a_blob_ref_a_worker_names_is_never_stored(tmp_path: Path) -> None:
    """A worker has no store: any blob ref in its events is not its own (it could name another tenant's), so the
    session's events name only blobs the supervisor put there (what GET .../blobs/{ref} serves)."""
    foreign = canonical_hash({"another": "tenant's"})
    with trio.fail_after(30):
        async with engine_with_doubles(tmp_path) as (engine, workers):
            sid, task_id, worker = await running_task(engine, workers, permission_mode=PermissionMode.YOLO)
            await worker.emit(task_id, EventType.TOOL_CALL_REQUESTED, ToolCallRequested(
                tool_call_id="call_r", input_hash=canonical_hash({"command": "ls"}), tool_name="Bash",
                input={"command": "ls"}, input_ref=foreign, executed_by=ExecutedBy.RUNTIME))
            await worker.connection.wait_for(Method.SEND_TOOL_APPROVED)
            await worker.emit(task_id, EventType.TOOL_CALL_STARTED, ToolCallStarted(
                tool_call_id="call_r", input_hash=canonical_hash({"command": "ls"}), tool_name="Bash",
                executed_by=ExecutedBy.RUNTIME))
            await worker.emit(task_id, EventType.TOOL_CALL_COMPLETED, ToolCallCompleted(
                tool_call_id="call_r", input_hash=canonical_hash({"command": "ls"}), tool_name="Bash",
                executed_by=ExecutedBy.RUNTIME, result_preview="ok", result_ref=foreign))
            await worker.emit(task_id, EventType.TASK_FAILED, TaskFailed(
                code="RUNTIME_CRASHED", message="it died", details={"stderr_tail_ref": foreign}))
            record = await engine.wait_task(task_id)
            events = await session_events(engine.store, sid)
    check_session(events)
    types = [e.type for e in events]
    assert EventType.TOOL_CALL_REQUESTED in types and EventType.TOOL_CALL_COMPLETED in types
    assert all(foreign not in named_blobs(e) for e in events)
    assert foreign not in json.dumps([e.to_json_obj() for e in events])
    assert record.error is not None and "stderr_tail_ref" not in record.error["details"]


async def test_a_task_whose_events_pass_a_quota_fails_once_and_its_runtime_is_stopped(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with engine_with_doubles(tmp_path, quotas=Quotas(session_events=6)) as (engine, workers):
            sid, task_id, worker = await running_task(engine, workers)
            for text in "abcdefgh":  # session.created, task.started, model.input: three are left
                await worker.emit(task_id, EventType.MODEL_OUTPUT_DELTA, _delta(text))
            record = await engine.wait_task(task_id)
            await worker.connection.wait_for(Method.STOP)
            events = await session_events(engine.store, sid)
    check_session(events)
    assert record.state == TaskState.FAILED and record.error is not None
    assert record.error["code"] == "QUOTA_EXCEEDED" and record.error["details"]["quota"] == "session_events"


async def test_a_failed_tasks_stderr_tail_is_kept_as_a_blob(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with engine_with_doubles(tmp_path) as (engine, workers):
            _sid, task_id, worker = await running_task(engine, workers)
            await worker.emit(task_id, EventType.TASK_FAILED, TaskFailed(
                code="RUNTIME_CRASHED", message="it died", details={"stderr_tail": "panic: oops\n"}))
            record = await engine.wait_task(task_id)
            assert record.error is not None
            ref = record.error["details"]["stderr_tail_ref"]
            assert await engine.store.get_blob(ref) == b"panic: oops\n"
            assert "stderr_tail" not in record.error["details"]


async def test_a_worker_that_exits_fails_its_running_task_with_its_stderr(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with engine_with_doubles(tmp_path) as (engine, workers):
            _sid, task_id, worker = await running_task(engine, workers)
            await worker.exit(-9, stderr=b"killed\n")
            record = await engine.wait_task(task_id)
            assert engine.stats.worker_crashes == 1
            assert record.error is not None and record.error["code"] == "WORKER_CRASHED"
            assert await engine.store.get_blob(record.error["details"]["stderr_tail_ref"]) == b"killed\n"


async def test_a_task_fails_clearly_when_no_worker_can_be_had_or_the_worker_refuses_it(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with engine_with_doubles(tmp_path) as (engine, workers):
            workers.unavailable["user:q"] = "namespace 'user:q' is quarantined"
            session = await engine.create_session(namespace="user:q")
            task = await engine.start_task(session.session_id, "x")
            unavailable = await engine.wait_task(task.task_id)
            workers.worker().connection.answers[Method.START_TASK] = rpc_error(-32004, "unknown runtime 'nope'")
            session = await engine.create_session()
            task = await engine.start_task(session.session_id, "x")
            refused = await engine.wait_task(task.task_id)
    assert unavailable.error is not None and refused.error is not None
    assert (unavailable.error["code"], unavailable.error["message"]) == (
        "WORKER_UNAVAILABLE", "namespace 'user:q' is quarantined")
    assert refused.error["code"] == "RUNTIME_UNAVAILABLE" and "unknown runtime 'nope'" in refused.error["message"]


async def test_the_engine_over_doubles_has_no_pool(tmp_path: Path) -> None:
    async with engine_with_doubles(tmp_path) as (engine, workers):
        assert isinstance(workers, FakeWorkers)
        try:
            engine.pool  # noqa: B018
        except TypeError as exc:
            assert "worker doubles" in str(exc)
        else:
            raise AssertionError("an engine over doubles has no pool of processes")


async def test_events_handed_over_are_not_kept_alive_while_the_worker_is_quiet(make_engine: MakeEngine) -> None:
    """Once a worker's events are stored, nothing of them stays in memory until that worker sends again: the pool's
    pump held on to its last batch (thousands of events after a burst of many streams, kept for as long as the
    worker stayed quiet)."""
    async with make_engine() as engine:
        session = await engine.create_session()
        flood = {"name": "flood", "steps": [{"flood": 2_000, "delta": "f" * 16}, {"complete": {}}]}
        task = await engine.start_task(session.session_id, "x", runtime_config={"scenario_inline": flood})
        assert (await engine.wait_task(task.task_id)).state == TaskState.COMPLETED
        await trio.testing.wait_all_tasks_blocked()  # the pump is back waiting for the worker's next line
        gc.collect()
        alive = sum(1 for obj in gc.get_objects() if isinstance(obj, RuntimeEventParams))
        assert alive == 0, f"{alive} events of a finished task still held"
