"""End to end: real supervisor engine, real worker processes, real store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from codesdk.testing.invariants import check_session
from codesdk.protocol import EventType, InteractionMode, PermissionMode, TaskStoppedEvent
from codesdk.supervisor.engine import (
    ApprovalRequest,
    ApproverAnswer,
    EngineError,
    derive_transcript,
    session_events,
)
from codesdk.supervisor.store import SessionBusy, TaskState

from tests.conftest import MakeEngine
from tests.e2e.conftest import of_type, run_task


async def test_streaming_task_is_stored_in_order(make_engine: MakeEngine) -> None:
    with trio.fail_after(60):
        async with make_engine() as engine:
            _, record, events = await run_task(engine, "stream me", runtime_config={"scenario": "echo"})
            assert record.state == TaskState.COMPLETED
            types = [e.type for e in events]
            assert types[:3] == [EventType.TASK_STARTED, EventType.MODEL_INPUT, EventType.RUNTIME_REQUEST_STARTED]
            assert types[-1] == EventType.TASK_COMPLETED
            deltas = of_type(events, EventType.MODEL_OUTPUT_DELTA)
            assert "".join(d.delta for d in deltas) == "You said: stream me"
            model_input = of_type(events, EventType.MODEL_INPUT)[0]
            compiled = json.loads(await engine.store.get_blob(model_input.input_ref))
            assert compiled["messages"][-1]["blocks"][0]["text"] == "stream me"
            from codesdk.protocol import canonical_hash
            assert model_input.input_hash == canonical_hash(compiled)


async def test_parallel_tool_calls_run_and_results_reach_the_runtime(make_engine: MakeEngine,
                                                                     tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("alpha\n")
    (ws / "b.txt").write_text("beta\n")
    with trio.fail_after(60):
        async with make_engine() as engine:
            _, record, events = await run_task(engine, workspace=ws, runtime_config={"scenario": "parallel-tools"})
    assert record.state == TaskState.COMPLETED
    completed = of_type(events, EventType.TOOL_CALL_COMPLETED)
    assert sorted(c.tool_call_id for c in completed) == ["call_a", "call_b"]
    assert all(not c.is_error and c.result_ref and c.executed_by == "supervisor" for c in completed)
    assert all(c.policy_snapshot["permission_mode"] == "ask" and c.sandbox.kind == "workspace" for c in completed)
    texts = [p.text for p in of_type(events, EventType.MODEL_OUTPUT_COMPLETED)]
    assert "a.txt says alpha\n and b.txt says beta\n" in texts


@pytest.mark.parametrize("allow", [True, False])
async def test_interactive_approval_decides_a_write(make_engine: MakeEngine, tmp_path: Path,
                                                    allow: bool) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    asked: list[ApprovalRequest] = []

    async def approver(request: ApprovalRequest) -> ApproverAnswer:
        asked.append(request)
        return ApproverAnswer(allow=allow, reason="ok by test" if allow else "not today")

    with trio.fail_after(60):
        async with make_engine() as engine:
            _, record, events = await run_task(
                engine, workspace=ws, runtime_config={"scenario": "write-or-deny"},
                permission_mode=PermissionMode.ASK, interaction_mode=InteractionMode.INTERACTIVE, approver=approver)
    assert record.state == TaskState.COMPLETED
    assert [r.tool_name for r in asked] == ["workspace.write"]
    evaluations = of_type(events, EventType.TOOL_CALL_POLICY_EVALUATED)
    assert [(e.source, e.decision) for e in evaluations] == [("codesdk", "ask"), ("user", "allow" if allow else "deny")]
    texts = [p.text for p in of_type(events, EventType.MODEL_OUTPUT_COMPLETED)]
    if allow:
        assert (ws / "notes.txt").read_text() == "hello from the scripted runtime\n"
        assert of_type(events, EventType.TOOL_CALL_APPROVED)[0].source == "user"
    else:
        assert not (ws / "notes.txt").exists()
        assert of_type(events, EventType.TOOL_CALL_DENIED)[0].reason == "not today"
        assert texts[-1] == "Understood, I did not write the file: not today"
        assert not of_type(events, EventType.TOOL_CALL_STARTED)


async def test_ask_mode_non_interactive_degrades_to_deny(make_engine: MakeEngine, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    with trio.fail_after(60):
        async with make_engine() as engine:
            _, record, events = await run_task(engine, workspace=ws, runtime_config={"scenario": "write-or-deny"},
                                               permission_mode=PermissionMode.ASK)
    denied = of_type(events, EventType.TOOL_CALL_DENIED)
    assert len(denied) == 1 and "non-interactive" in denied[0].reason
    assert not (ws / "notes.txt").exists()
    assert record.state == TaskState.COMPLETED


async def test_auto_mode_applies_a_patch(make_engine: MakeEngine, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "README.md").write_text("# Demo\n")
    with trio.fail_after(60):
        async with make_engine() as engine:
            _, record, events = await run_task(engine, workspace=ws, runtime_config={"scenario": "edit-file"},
                                               permission_mode=PermissionMode.AUTO)
    assert record.state == TaskState.COMPLETED
    assert (ws / "README.md").read_text() == "# Demo\nEdited by the scripted runtime.\n"
    assert of_type(events, EventType.MODEL_OUTPUT_COMPLETED)[-1].text.endswith("Edited by the scripted runtime.\n")


@pytest.mark.parametrize("path", ["../outside.txt", "/etc/passwd", "link/secret.txt"])
async def test_path_escapes_are_refused(make_engine: MakeEngine, tmp_path: Path, path: str) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("top secret")
    (tmp_path / "outside.txt").write_text("top secret")
    (ws / "link").symlink_to(outside)
    scenario = {"name": "escape", "steps": [
        {"tool_calls": [{"id": "esc", "name": "workspace.read", "input": {"path": path}}]},
        {"text": "got: {{result:esc}}"}, {"complete": {}}]}
    with trio.fail_after(60):
        async with make_engine() as engine:
            _, _, events = await run_task(engine, workspace=ws, runtime_config={"scenario_inline": scenario},
                                               permission_mode=PermissionMode.YOLO)
    completed = of_type(events, EventType.TOOL_CALL_COMPLETED)[0]
    assert completed.is_error
    result = json.loads(await _blob(make_engine, tmp_path, completed.result_ref))
    assert result["error"]["code"] == "path_refused"
    assert "top secret" not in json.dumps([e.to_json_obj() for e in events])


async def _blob(make_engine: MakeEngine, tmp_path: Path, ref: str) -> bytes:
    async with make_engine() as engine:
        return await engine.store.get_blob(ref)


async def test_stop_mid_stream_stops_and_no_tool_runs_after(make_engine: MakeEngine, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    with trio.fail_after(60):
        async with make_engine() as engine:
            session = await engine.create_session(workspace=ws)
            task = await engine.start_task(session.session_id, "count", permission_mode=PermissionMode.YOLO,
                                           runtime_config={"scenario": "slow-stream"})
            async with engine.store.subscribe(session.session_id) as sub:
                deltas = 0
                async for event in sub:
                    deltas += event.type == EventType.MODEL_OUTPUT_DELTA
                    if deltas == 3:
                        break
            stopped = await engine.stop_task(task.task_id, reason="enough")
            assert stopped.state == TaskState.STOPPED
            with pytest.raises(EngineError):
                await engine.stop_task(task.task_id)
            # The stop returned once the worker had ended the task: whatever it sent meanwhile is in (and dropped).
            events = await session_events(engine.store, session.session_id)
    check_session(events)
    last = events[-1]
    assert isinstance(last, TaskStoppedEvent) and last.payload.reason == "enough"
    assert not [e for e in events if e.type.value.startswith("tool.")]
    assert not (ws / "late.txt").exists()


async def test_runtime_that_ignores_stop_has_its_late_events_dropped(make_engine: MakeEngine) -> None:
    with trio.fail_after(60):
        async with make_engine() as engine:
            session = await engine.create_session()
            task = await engine.start_task(session.session_id, "x", runtime_config={"scenario": "ignore-stop",
                                                                                   "stop_grace_s": 0.5})
            async with engine.store.subscribe(session.session_id) as sub:
                async for event in sub:
                    if event.type == EventType.MODEL_OUTPUT_DELTA:
                        break
            await engine.stop_task(task.task_id)
            with trio.fail_after(10):
                while engine.stats.late_events == 0:
                    await trio.sleep(0.05)
            events = await session_events(engine.store, session.session_id)
            check_session(events)
            assert events[-1].type == EventType.TASK_STOPPED
            # The worker forces the stop after its grace; the next task in the session runs normally.
            _, record, _ = await run_task(engine, session_id=session.session_id,
                                          runtime_config={"scenario": "echo"})
            assert record.state == TaskState.COMPLETED


async def test_second_concurrent_task_on_a_session_is_refused(make_engine: MakeEngine) -> None:
    with trio.fail_after(60):
        async with make_engine() as engine:
            session = await engine.create_session()
            first = await engine.start_task(session.session_id, "x", runtime_config={"scenario": "hang"})
            with pytest.raises((EngineError, SessionBusy), match="already has an active task"):
                await engine.start_task(session.session_id, "y")
            await engine.stop_task(first.task_id)
            _, record, _ = await run_task(engine, session_id=session.session_id, runtime_config={"scenario": "echo"})
            assert record.state == TaskState.COMPLETED


async def test_second_task_gets_the_prior_transcript(make_engine: MakeEngine) -> None:
    with trio.fail_after(60):
        async with make_engine() as engine:
            session_id, _, _ = await run_task(engine, "first question", runtime_config={"scenario": "echo"})
            _, _, events = await run_task(engine, "second question", session_id=session_id,
                                               runtime_config={"scenario": "echo"})
            model_input = of_type(events, EventType.MODEL_INPUT)[0]
            compiled = json.loads(await engine.store.get_blob(model_input.input_ref))
            texts = [(m["role"], m["blocks"][0]["text"]) for m in compiled["messages"]]
            assert texts == [("user", "first question"), ("assistant", "You said: first question"),
                             ("user", "second question")]
            transcript = await derive_transcript(engine.store, session_id)
            assert [m.text() for m in transcript][-1] == "You said: second question"


async def test_identical_read_only_call_is_replayed_from_the_store(make_engine: MakeEngine,
                                                                   tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("alpha\n")
    (ws / "b.txt").write_text("beta\n")
    with trio.fail_after(60):
        async with make_engine() as engine:
            session_id, _, first = await run_task(engine, workspace=ws, runtime_config={"scenario": "parallel-tools"})
            (ws / "a.txt").write_text("changed\n")  # a replay answers from the store, not the file
            _, record, second = await run_task(engine, session_id=session_id,
                                               runtime_config={"scenario": "parallel-tools"})
    assert record.state == TaskState.COMPLETED
    assert all(not c.replayed for c in of_type(first, EventType.TOOL_CALL_COMPLETED))
    replayed = of_type(second, EventType.TOOL_CALL_COMPLETED)
    assert len(replayed) == 2 and all(c.replayed and c.execution_env == "store" for c in replayed)
    assert any("a.txt says alpha\n" in p.text for p in of_type(second, EventType.MODEL_OUTPUT_COMPLETED))


async def test_runtime_reported_failure(make_engine: MakeEngine) -> None:
    with trio.fail_after(60):
        async with make_engine() as engine:
            _, record, events = await run_task(engine, runtime_config={"scenario": "fail"})
    assert record.state == TaskState.FAILED
    failed = of_type(events, EventType.TASK_FAILED)[0]
    assert (failed.code, failed.retryable) == ("RATE_LIMITED", True)
    assert record.error is not None and record.error["code"] == "RATE_LIMITED"


async def test_unknown_scenario_fails_the_task_clearly(make_engine: MakeEngine) -> None:
    with trio.fail_after(60):
        async with make_engine() as engine:
            _, _, events = await run_task(engine, runtime_config={"scenario": "no-such-scenario"})
    failed = of_type(events, EventType.TASK_FAILED)[0]
    assert failed.code == "INVALID_SCENARIO" and "no scenario 'no-such-scenario'" in failed.message
