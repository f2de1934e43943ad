"""Steering through the engine, with a real worker and the scripted runtime: an input sent while a task runs is
delivered into its turn, or — if the runtime never took it — carried into the session's next task."""

from __future__ import annotations

import pytest
import trio

from codesdk.protocol import (
    EventType,
    InputDelivery,
    ModelInput,
    ModelInputAppended,
    ModelOutputCompleted,
    Role,
    TextBlock,
)
from codesdk.supervisor.engine import InvalidTaskInput, TaskNotActive, derive_transcript, session_events
from codesdk.supervisor.store import TaskState
from codesdk.testing.invariants import check_session
from tests.conftest import MakeEngine
from codesdk.supervisor.engine import Engine
from tests.waits import until

CARRY = {"name": "carry", "steps": [{"text": "thinking"}, {"await_input": "hold"}, {"complete": {}}]}


async def _waiting_for_input(engine: Engine, session_id: str) -> None:
    """Until the session's running task has ended its first request (the steer scenarios then wait for input)."""
    try:
        while not any(e.type == EventType.RUNTIME_REQUEST_COMPLETED and e.trace.task_id == engine.active_task(session_id)
                      for e in await session_events(engine.store, session_id)):
            await trio.sleep(0.02)
    except trio.Cancelled as exc:
        exc.add_note("while waiting for the task to wait for input")
        raise


async def test_an_input_goes_into_the_running_turn_and_the_transcript(make_engine: MakeEngine) -> None:
    with trio.fail_after(60):
        async with make_engine() as engine:
            session = await engine.create_session()
            sid = session.session_id
            task = await engine.start_task(sid, "fix the tests", runtime_config={"scenario": "steer"})
            await _waiting_for_input(engine, sid)
            answer = await engine.send_input(task.task_id, "and the docs", input_id="in-1")
            assert (answer.input_id, answer.delivery) == ("in-1", InputDelivery.MID_TURN)
            assert (await engine.wait_task(task.task_id)).state == TaskState.COMPLETED
            with pytest.raises(TaskNotActive, match="not running"):
                await engine.send_input(task.task_id, "too late")
            transcript = await derive_transcript(engine.store, sid)
            recall = {"name": "recall", "steps": [{"text": "I recall: {{history}}"}]}
            later = await engine.start_task(sid, "what came before?", runtime_config={"scenario_inline": recall})
            assert (await engine.wait_task(later.task_id)).state == TaskState.COMPLETED
            events = await session_events(engine.store, sid)
    check_session(events)
    [appended] = [e.payload for e in events if isinstance(e.payload, ModelInputAppended)]
    assert (appended.input_id, appended.text, appended.delivery) == ("in-1", "and the docs", InputDelivery.MID_TURN)
    assert appended.before_request_id is not None
    texts = [e.payload.text for e in events if isinstance(e.payload, ModelOutputCompleted)]
    assert texts[-2] == "You added: and the docs"
    assert "<user>\nand the docs\n</user>" in texts[-1]  # a later task, given the transcript, is given it too
    assert [(m.role, m.text()) for m in transcript] == [
        (Role.USER, "fix the tests"), (Role.ASSISTANT, "Working on: fix the tests"), (Role.USER, "and the docs"),
        (Role.ASSISTANT, "You added: and the docs")]


async def test_an_input_the_runtime_never_took_opens_the_next_tasks_prompt(make_engine: MakeEngine) -> None:
    with trio.fail_after(60):
        async with make_engine() as engine:
            sid = (await engine.create_session()).session_id
            first = await engine.start_task(sid, "one", runtime_config={"scenario_inline": CARRY})
            await _waiting_for_input(engine, sid)
            await engine.send_input(first.task_id, (TextBlock(text="remember this"),), input_id="in-1")
            assert (await engine.wait_task(first.task_id)).state == TaskState.COMPLETED
            second = await engine.start_task(sid, "two", runtime_config={"scenario": "echo"})
            assert (await engine.wait_task(second.task_id)).state == TaskState.COMPLETED
            events = await session_events(engine.store, sid)
    check_session(events)
    [appended] = [e for e in events if isinstance(e.payload, ModelInputAppended)]
    assert appended.trace.task_id == first.task_id
    assert isinstance(appended.payload, ModelInputAppended) and appended.payload.delivery == InputDelivery.QUEUED
    inputs = [e.payload for e in events if isinstance(e.payload, ModelInput)]
    assert inputs[-1].carried_inputs == ("in-1",)
    texts = [e.payload.text for e in events if isinstance(e.payload, ModelOutputCompleted)]
    assert texts[-1] == "You said: remember this\n\ntwo"


async def test_bad_inputs_are_refused_before_anything_is_sent(make_engine: MakeEngine) -> None:
    with trio.fail_after(60):
        async with make_engine() as engine:
            sid = (await engine.create_session()).session_id
            task = await engine.start_task(sid, "x", runtime_config={"scenario": "steer"})
            await _waiting_for_input(engine, sid)
            for bad in ("", "   ", "x" * 100_001):
                with pytest.raises(InvalidTaskInput, match="input"):
                    await engine.send_input(task.task_id, bad)
            await engine.send_input(task.task_id, "ok", input_id="in-1")
            await engine.wait_task(task.task_id)
            second = await engine.start_task(sid, "x", runtime_config={"scenario": "steer"})
            await until("the second task", lambda: engine.active_task(sid) == second.task_id)
            with pytest.raises(InvalidTaskInput, match="used already"):
                await engine.send_input(second.task_id, "again", input_id="in-1")
            await engine.stop_task(second.task_id)
            check_session(await session_events(engine.store, sid))


async def test_two_sends_of_one_input_id_at_once_take_one(make_engine: MakeEngine) -> None:
    with trio.fail_after(60):
        async with make_engine() as engine:
            sid = (await engine.create_session()).session_id
            task = await engine.start_task(sid, "x", runtime_config={"scenario": "hang"})
            outcomes: list[str] = []

            async def send() -> None:
                try:
                    await engine.send_input(task.task_id, "once", input_id="same")
                    outcomes.append("taken")
                except InvalidTaskInput:
                    outcomes.append("refused")

            async with trio.open_nursery() as nursery:
                nursery.start_soon(send)
                nursery.start_soon(send)
            await engine.stop_task(task.task_id)
            events = await session_events(engine.store, sid)
    assert sorted(outcomes) == ["refused", "taken"]
    check_session(events)
    assert [e.payload.input_id for e in events if isinstance(e.payload, ModelInputAppended)] == ["same"]
