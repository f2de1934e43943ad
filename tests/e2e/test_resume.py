"""Sessions that outlive a runtime's own state: each task's input is compiled from CodeSDK's transcript (calls that
never finished answered as interrupted, the whole fitted to a context budget), a task may move the session to
another runtime, and ``model.input`` says how the runtime was given the earlier turns. Through the real supervisor
and worker, on the scripted runtime (which keeps nothing between tasks: it is always given the transcript)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from codesdk.testing.invariants import check_session
from codesdk.protocol import (
    EventType,
    InteractionMode,
    Message,
    NormalizedEvent,
    PermissionMode,
    ResumeMode,
    TaskFailureCode,
    canonical_hash,
)
from codesdk.supervisor.engine import (
    ApprovalRequest,
    ApproverAnswer,
    Engine,
    InvalidTaskInput,
    session_events,
)
from codesdk.supervisor.store import TaskState

from tests.conftest import MakeEngine
from tests.e2e.conftest import of_type, said, the_model_input

#: Says what the runtime was given of the earlier turns.
RECALL = {"scenario_inline": {"name": "recall", "steps": [{"text": "I recall: {{history}}"}]}}


def _read(path: str) -> dict[str, Any]:
    return {"scenario_inline": {"name": "read", "steps": [
        {"tool_calls": [{"id": "read1", "name": "workspace.read", "input": {"path": path}}]},
        {"text": "read it"}]}}


async def _task(engine: Engine, session_id: str, prompt: str, **kwargs: Any) -> tuple[str, list[NormalizedEvent]]:
    """Run one task to its end: (its terminal state, its events)."""
    task = await engine.start_task(session_id, prompt, **kwargs)
    record = await engine.wait_task(task.task_id)
    events = [e for e in await session_events(engine.store, session_id) if e.trace.task_id == task.task_id]
    return record.state, events




async def test_a_task_is_given_the_transcript_and_model_input_says_so(make_engine: MakeEngine) -> None:
    with trio.fail_after(60):
        async with make_engine() as engine:
            session = await engine.create_session()
            state, first = await _task(engine, session.session_id, "remember marker-5521")
            assert state == TaskState.COMPLETED
            state, second = await _task(engine, session.session_id, "what did I say?", runtime_config=RECALL)
            assert state == TaskState.COMPLETED
            compiled = json.loads(await engine.store.get_blob(the_model_input(second).input_ref))
            check_session(await session_events(engine.store, session.session_id))
    assert the_model_input(first).resume == ResumeMode.NEW
    given = the_model_input(second)
    assert given.resume == ResumeMode.RECONSTRUCTED and given.message_count == 3
    assert given.sent_hash == canonical_hash(compiled["messages"])  # what the runtime was sent, exactly
    recalled = said(second)
    assert "<user>\nremember marker-5521\n</user>" in recalled
    assert "<assistant>\nYou said: remember marker-5521\n</assistant>" in recalled


async def test_a_call_that_never_finished_is_answered_as_interrupted_and_never_run_again(
        make_engine: MakeEngine, tmp_path: Path) -> None:
    asked = trio.Event()

    async def never_decides(request: ApprovalRequest) -> ApproverAnswer:
        asked.set()
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    write = {"scenario": "write-or-deny"}
    workspace = tmp_path / "ws"
    workspace.mkdir()
    with trio.fail_after(60):
        async with make_engine() as engine:
            session = await engine.create_session(workspace=workspace)
            task = await engine.start_task(session.session_id, "write notes", runtime_config=write,
                                           interaction_mode=InteractionMode.INTERACTIVE, approver=never_decides)
            await asked.wait()
            await engine.stop_task(task.task_id, reason="the user left")
            state, second = await _task(engine, session.session_id, "what happened?", runtime_config=RECALL)
            events = await session_events(engine.store, session.session_id)
    check_session(events)
    assert state == TaskState.COMPLETED
    assert [(c.tool_call_id, c.tool_name) for c in the_model_input(second).interrupted_calls] == [("call_write",
                                                                                        "workspace.write")]
    assert '<tool_result id="call_write" status="interrupted">interrupted: this tool call never finished' \
        in said(second)
    assert not (workspace / "notes.txt").exists()
    assert len(of_type(events, EventType.TOOL_CALL_REQUESTED)) == 1  # asked for once, by the first task only


async def test_a_switch_to_a_runtime_the_worker_cannot_host_fails_and_leaves_the_session_where_it_was(
        make_engine: MakeEngine) -> None:
    with trio.fail_after(60):
        async with make_engine() as engine:
            session = await engine.create_session()
            await _task(engine, session.session_id, "remember marker-77")
            state, events = await _task(engine, session.session_id, "go on", runtime="no-such-runtime")
            assert state == TaskState.FAILED
            (failed,) = of_type(events, EventType.TASK_FAILED)
            assert failed.code == TaskFailureCode.RUNTIME_UNAVAILABLE and "no-such-runtime" in failed.message
            assert (await engine.store.get_session(session.session_id)).runtime == "scripted"
            with pytest.raises(InvalidTaskInput, match="not a runtime name"):
                await engine.start_task(session.session_id, "go on", runtime="../scripted")
            state, events = await _task(engine, session.session_id, "go on", runtime_config=RECALL)
    assert state == TaskState.COMPLETED and "marker-77" in said(events)
    assert the_model_input(events).switched_from is None


async def test_the_context_budget_leaves_out_large_outputs_then_old_turns_and_keeps_the_whole_transcript(
        make_engine: MakeEngine, tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "big.log").write_text("a line of the build log\n" * 2000)  # 48 000 bytes
    with trio.fail_after(60):
        async with make_engine() as engine:
            session = await engine.create_session(workspace=workspace)
            sid = session.session_id
            state, reading = await _task(engine, sid, "read big.log", runtime_config=_read("big.log"),
                                         permission_mode=PermissionMode.AUTO)
            assert state == TaskState.COMPLETED
            (completed,) = of_type(reading, EventType.TOOL_CALL_COMPLETED)
            await _task(engine, sid, "remember marker-31")
            _, shrunk = await _task(engine, sid, "what was in it?", runtime_config=RECALL, max_input_tokens=2000)
            _, dropped = await _task(engine, sid, "and before?", runtime_config=RECALL, max_input_tokens=150)
            _, whole = await _task(engine, sid, "everything", runtime_config=RECALL)
            events = await session_events(engine.store, sid)
    check_session(events)
    report = the_model_input(shrunk).context
    assert report is not None and report.max_input_tokens == 2000 and report.window_tokens == 100_000
    assert not report.omitted_turns
    assert [(s.tool_call_id, s.ref) for s in report.shrunk_outputs] == [("read1", completed.result_ref)]
    assert report.sent_tokens <= 2000 < report.transcript_tokens
    assert "bytes of output left out to fit the context window" in said(shrunk)
    assert "marker-31" in said(shrunk)
    report = the_model_input(dropped).context
    assert report is not None and report.sent_tokens <= 150
    assert [t.preview for t in report.omitted_turns][:2] == ["read big.log", "remember marker-31"]
    assert "marker-31" not in said(dropped).split("[CodeSDK] The request")[0]
    # what was left out of one task's input is not lost: the next task without a cap is given all of it
    assert the_model_input(whole).context is not None and not the_model_input(whole).context.omitted  # type: ignore[union-attr]
    assert json.dumps("a line of the build log\n" * 2000)[1:-1] in said(whole) and "marker-31" in said(whole)


async def test_a_request_larger_than_the_budget_fails_with_a_hint_and_leaves_the_session_usable(
        make_engine: MakeEngine) -> None:
    with trio.fail_after(60):
        async with make_engine() as engine:
            session = await engine.create_session()
            sid = session.session_id
            state, capped = await _task(engine, sid, "word " * 200, max_input_tokens=100)
            assert state == TaskState.FAILED
            state, windowed = await _task(engine, sid, "x" * 300_000)  # the scripted runtime's window: 100 000
            assert state == TaskState.FAILED
            state, after = await _task(engine, sid, "a short one")
            events = await session_events(engine.store, sid)
    check_session(events)
    (failed,) = of_type(capped, EventType.TASK_FAILED)
    assert failed.code == TaskFailureCode.CONTEXT_TOO_LARGE and not failed.retryable
    assert failed.details["budget_tokens"] == 100 and failed.details["needed_tokens"] > 100
    assert "raise max_input_tokens" in failed.message and "Shorten the prompt" in failed.message
    (failed,) = of_type(windowed, EventType.TASK_FAILED)
    assert failed.code == TaskFailureCode.CONTEXT_TOO_LARGE and failed.details["budget_tokens"] == 75_000
    assert "context window of 100000 tokens" in failed.message
    assert not of_type(capped + windowed, EventType.MODEL_INPUT)  # nothing was sent
    assert state == TaskState.COMPLETED and the_model_input(after).message_count == 1  # the failed requests are not history
    assert Message.user_text("a short one").text() in said(after)
