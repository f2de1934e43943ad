"""The adapter contract: every runtime adapter, driven through the real supervisor and worker, behaves alike."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import psutil
import pytest
import trio

from codesdk.testing.invariants import check_session
from codesdk.protocol import (
    EventType,
    InteractionMode,
    NormalizedEvent,
    PermissionMode,
    ResumeMode,
    TaskStoppedEvent,
    WorkerAnswer,
)
from codesdk.supervisor.engine import ApprovalRequest, ApproverAnswer, Engine, session_events
from codesdk.supervisor.store import TaskRecord, TaskState

from tests.conftest import MakeEngine
from tests.e2e.conftest import of_type
from tests.contract.cases import Case, ScriptedCase, Turn, workspace


async def _run(make_engine: MakeEngine, case: Case, turn: Turn, ws: Path | None = None,
               **kwargs: Any) -> tuple[TaskRecord, list[NormalizedEvent], dict[str, Any]]:
    async with make_engine(worker_env={"*": case.worker_env()}) as engine:
        session = await engine.create_session(runtime=case.runtime, workspace=ws)
        task = await engine.start_task(session.session_id, turn.prompt, runtime_config=turn.runtime_config,
                                       **kwargs)
        record = await engine.wait_task(task.task_id)
        events = await session_events(engine.store, session.session_id)
        check_session(events)
        blobs: dict[str, Any] = {}
        for payload in of_type(events, EventType.MODEL_INPUT):
            if payload.implicit_sources_ref:
                blobs["implicit"] = json.loads(await engine.store.get_blob(payload.implicit_sources_ref))
        return record, events, blobs


def _texts(events: list[NormalizedEvent]) -> list[str]:
    return [p.text for p in of_type(events, EventType.MODEL_OUTPUT_COMPLETED) if p.kind == "text"]


async def test_streams_deltas_then_completes(make_engine: MakeEngine, case: Case) -> None:
    with trio.fail_after(120):
        record, events, _ = await _run(make_engine, case, case.stream("hello contract"))
    assert record.state == TaskState.COMPLETED
    deltas = of_type(events, EventType.MODEL_OUTPUT_DELTA)
    assert len(deltas) >= 2
    by_block: dict[str, list[str]] = {}
    for delta in deltas:
        by_block.setdefault(delta.block_id, []).append(delta.delta)
    completed = {p.block_id: p.text for p in of_type(events, EventType.MODEL_OUTPUT_COMPLETED)}
    assert all("".join(parts) == completed[block] for block, parts in by_block.items())
    assert any("hello contract" in text for text in _texts(events))
    assert of_type(events, EventType.USAGE_REPORTED)


async def test_denial_reason_reaches_the_runtime(make_engine: MakeEngine, case: Case, tmp_path: Path) -> None:
    ws = workspace(tmp_path)

    async def deny(request: ApprovalRequest) -> ApproverAnswer:
        return ApproverAnswer(allow=False, reason="no-writes-today-4711")

    turn = case.tools(("workspace.write", {"path": "notes.txt", "content": "x"}))
    with trio.fail_after(120):
        record, events, _ = await _run(make_engine, case, turn, ws, permission_mode=PermissionMode.ASK,
                                       interaction_mode=InteractionMode.INTERACTIVE, approver=deny)
    assert record.state == TaskState.COMPLETED
    assert not (ws / "notes.txt").exists()
    assert not of_type(events, EventType.TOOL_CALL_STARTED)
    assert "no-writes-today-4711" in _texts(events)[-1]


async def test_forbidden_tools_never_execute(make_engine: MakeEngine, case: Case, tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    turn = case.tools(("workspace.exec", {"argv": ["touch", str(ws / "pwned")]}),
                      ("Bash", {"command": f"touch {ws / 'pwned2'}"}))
    with trio.fail_after(120):
        record, events, _ = await _run(make_engine, case, turn, ws, permission_mode=PermissionMode.YOLO)
    assert record.state in (TaskState.COMPLETED, TaskState.FAILED)
    assert not (ws / "pwned").exists() and not (ws / "pwned2").exists()
    assert not of_type(events, EventType.TOOL_CALL_STARTED)


async def test_implicit_sources_are_recorded_with_the_model_input(make_engine: MakeEngine,
                                                                  case: Case) -> None:
    with trio.fail_after(120):
        _, events, blobs = await _run(make_engine, case, case.stream("hi"))
    assert of_type(events, EventType.MODEL_INPUT)[0].implicit_sources_ref
    assert blobs["implicit"]["policy"] and isinstance(blobs["implicit"]["found"], list)


@pytest.mark.conversation
async def test_the_next_task_carries_the_sessions_history(make_engine: MakeEngine, case: Case,
                                                         tmp_path: Path) -> None:
    """The session's second task is taken up by the runtime's own session: the model is sent the first turn, and
    only the new prompt was sent for it. Then the runtime's stored sessions are deleted: the third task starts a
    new runtime session whose first prompt carries the earlier turns (model.input says which way each went)."""
    fake = getattr(case, "fake")  # noqa: B009 (set by the fixture on cases with a fake model)
    turns = [case.stream("remember marker-7741"), case.stream("and now marker-7742"), case.stream("then marker-7743")]
    sessions: list[str | None] = []
    with trio.fail_after(120):
        async with make_engine(worker_env={"*": case.worker_env()}) as engine:
            session = await engine.create_session(runtime=case.runtime, workspace=workspace(tmp_path))
            for number, turn in enumerate(turns):
                if number == 2:
                    dirs = engine.config.pool.data_dir / "namespaces" / "default"
                    case.forget_sessions(dirs / "home", dirs / "data")
                task = await engine.start_task(session.session_id, turn.prompt, runtime_config=turn.runtime_config)
                assert (await engine.wait_task(task.task_id)).state == TaskState.COMPLETED
                sessions.append((await engine.store.get_session(session.session_id)).runtime_session_id)
                if number == 1:
                    native = json.dumps(fake.requests()[-1]["body"])
            events = await session_events(engine.store, session.session_id)
    check_session(events)
    assert [t for t in _texts(events) if t.startswith("Echo:") and "marker-774" in t][:2] == [
        "Echo: remember marker-7741", "Echo: and now marker-7742"]
    assert "marker-7741" in native and "marker-7742" in native
    assert "conversation_record" not in native  # taken up natively: only the new prompt was sent
    rebuilt = json.dumps(fake.requests()[-1]["body"])
    assert all(f"marker-774{i}" in rebuilt for i in (1, 2, 3)) and "conversation_record" in rebuilt
    given = of_type(events, EventType.MODEL_INPUT)
    assert [p.resume for p in given] == [ResumeMode.NEW, ResumeMode.NATIVE, ResumeMode.RECONSTRUCTED]
    assert sessions[0] == sessions[1] and sessions[2] not in (None, sessions[1])  # a new runtime session, kept


async def test_stop_mid_stream(make_engine: MakeEngine, case: Case, tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    turn = case.slow()
    with trio.fail_after(120):
        async with make_engine(worker_env={"*": case.worker_env()}) as engine:
            session = await engine.create_session(runtime=case.runtime, workspace=ws)
            task = await engine.start_task(session.session_id, turn.prompt, runtime_config=turn.runtime_config,
                                           permission_mode=PermissionMode.YOLO)
            await _deltas(engine, session.session_id, 3)
            await engine.stop_task(task.task_id, reason="enough")  # returns once the worker has ended the task
            events = await session_events(engine.store, session.session_id)
    check_session(events)
    last = events[-1]
    assert isinstance(last, TaskStoppedEvent) and last.payload.reason == "enough"
    receipt = last.payload.receipt  # what the stop did: the runtime was interrupted, and its processes are gone
    assert receipt is not None and receipt.worker == WorkerAnswer.CONFIRMED and receipt.interrupt_sent
    assert receipt.processes_gone is not False and all(p.gone for p in receipt.processes)
    if not isinstance(case, ScriptedCase):
        assert receipt.processes, "a runtime with a process of its own reports how it ended"
    assert not [e for e in events if e.type.value.startswith("tool.")]
    assert not (ws / "late.txt").exists()


async def test_worker_crash_mid_task_fails_it_once(make_engine: MakeEngine, case: Case) -> None:
    turn = case.slow()
    with trio.fail_after(120):
        async with make_engine(worker_env={"*": case.worker_env()}) as engine:
            session = await engine.create_session(runtime=case.runtime)
            task = await engine.start_task(session.session_id, turn.prompt, runtime_config=turn.runtime_config)
            await _deltas(engine, session.session_id, 2)
            worker = engine.pool.worker_of("default")
            assert worker is not None
            os.kill(worker.pid, signal.SIGKILL)
            record = await engine.wait_task(task.task_id)
            events = await session_events(engine.store, session.session_id)
    check_session(events)
    failed = of_type(events, EventType.TASK_FAILED)
    assert record.state == TaskState.FAILED and len(failed) == 1 and failed[0].code == "WORKER_CRASHED"


async def test_runtime_process_killed_mid_task_is_a_retryable_runtime_crash(make_engine: MakeEngine,
                                                                            case: Case,
                                                                            tmp_path: Path) -> None:
    """The runtime's own process dies (SIGKILL): the task fails RUNTIME_CRASHED, retryable, with the signal and
    the process's stderr tail as a blob; the worker lives on and serves the next task."""
    ready = tmp_path / "runtime-ready"
    turn = case.with_runtime_process(ready)
    with trio.fail_after(120):
        async with make_engine(worker_env={"*": case.worker_env()}) as engine:
            session = await engine.create_session(runtime=case.runtime)
            task = await engine.start_task(session.session_id, turn.prompt, runtime_config=turn.runtime_config)
            await _deltas(engine, session.session_id, 2)
            worker = engine.pool.worker_of("default")
            assert worker is not None
            found: list[psutil.Process] = []
            while not found:  # the process may still be starting
                found = [p for p in psutil.Process(worker.pid).children(recursive=True) if case.is_runtime_process(p)]
                await trio.sleep(0.05)
            assert len(found) == 1
            while not case.runtime_ready(ready):  # it has written what its crash report must show
                await trio.sleep(0.02)
            found[0].kill()
            record = await engine.wait_task(task.task_id)
            events = await session_events(engine.store, session.session_id)
            failed = of_type(events, EventType.TASK_FAILED)
            assert record.state == TaskState.FAILED and len(failed) == 1, failed
            crash = failed[0]
            assert (crash.code, crash.retryable, crash.details["signal"]) == ("RUNTIME_CRASHED", True, "SIGKILL")
            assert crash.details["pid"] == found[0].pid and "killed by signal SIGKILL" in crash.message
            assert "stderr_tail" not in crash.details  # moved into a blob
            if case.stderr_before_crash is not None:
                tail = await engine.store.get_blob(crash.details["stderr_tail_ref"])
                assert case.stderr_before_crash in tail.decode()
            assert engine.pool.worker_of("default") is worker and not worker.exited.is_set()
            again = case.stream("after the crash")
            nxt = await engine.start_task(session.session_id, again.prompt, runtime_config=again.runtime_config)
            assert (await engine.wait_task(nxt.task_id)).state == TaskState.COMPLETED
    check_session(events)


async def _deltas(engine: Engine, session_id: str, count: int) -> None:
    seen = 0
    async with engine.store.subscribe(session_id) as sub:
        async for event in sub:
            seen += event.type == EventType.MODEL_OUTPUT_DELTA
            if seen >= count:
                return


@pytest.mark.builtin_tools
async def test_runtime_builtin_tool_runs_only_when_the_supervisor_approves(make_engine: MakeEngine,
                                                                           case: Case,
                                                                           tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    target = ws / "by-builtin.txt"
    with trio.fail_after(120):
        record, events, _ = await _run(make_engine, case, case.builtin_write(target, "hi\n"), ws,
                                       permission_mode=PermissionMode.AUTO)
    assert record.state == TaskState.COMPLETED
    requested = of_type(events, EventType.TOOL_CALL_REQUESTED)
    assert [(r.tool_name, r.executed_by) for r in requested] == [("Write", "runtime")]
    assert of_type(events, EventType.TOOL_CALL_APPROVED)[0].policy_snapshot["tool_class"] == "write"
    started, completed = of_type(events, EventType.TOOL_CALL_STARTED), of_type(events, EventType.TOOL_CALL_COMPLETED)
    assert [(s.executed_by, c.executed_by, c.is_error) for s, c in zip(started, completed)] == [
        ("runtime", "runtime", False)]
    assert target.exists() == case.builtins_touch_files


@pytest.mark.builtin_tools
async def test_runtime_builtin_tool_denied_never_runs(make_engine: MakeEngine, case: Case,
                                                      tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    target = ws / "by-builtin.txt"
    with trio.fail_after(120):
        record, events, _ = await _run(make_engine, case, case.builtin_write(target, "hi\n"), ws,
                                       permission_mode=PermissionMode.ASK)
    assert record.state == TaskState.COMPLETED
    denied = of_type(events, EventType.TOOL_CALL_DENIED)
    assert len(denied) == 1 and "non-interactive" in denied[0].reason
    assert not of_type(events, EventType.TOOL_CALL_STARTED) and not target.exists()
    assert "non-interactive" in _texts(events)[-1]
