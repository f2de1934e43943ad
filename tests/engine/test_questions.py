"""Questions at the engine: a runtime's question is recorded, answered once, and the answer reaches the runtime —
or it is declined: by a task nobody can be asked in, by the operator's fallback at expiry, by the task's end."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio.testing

from codesdk.protocol import (
    AnsweredVia,
    EventType,
    InteractionMode,
    Method,
    Question,
    QuestionAnswered,
    QuestionOption,
    QuestionReply,
    QuestionRequested,
    QuestionSource,
    QuestionState,
)
from codesdk.supervisor.engine import Engine
from codesdk.supervisor.engine._questions import MAX_OPEN_QUESTIONS, InvalidAnswer, QuestionFallback, QuestionPolicy
from codesdk.supervisor.store import QuestionRecord, QuestionSettled
from codesdk.testing.invariants import check_session

from tests.engine.doubles import engine_with_doubles, running_task
from tests.waits import real_time_limit

ASKED = QuestionRequested(question_id="ask-1", source=QuestionSource.SCRIPTED, message="before I start", questions=(
    Question(id="colour", text="Which colour?", options=(QuestionOption(label="red"), QuestionOption(label="blue")),
             default="blue"),
    Question(id="token", text="Your token?", secret=True, required=False)))


async def _answered(engine: Engine, session_id: str) -> QuestionAnswered:
    events = await engine.store.read(session_id)
    return next(e.payload for e in events if isinstance(e.payload, QuestionAnswered))


async def _pending(engine: Engine) -> QuestionRecord:
    records: list[QuestionRecord] = []

    async def listed() -> None:
        while not (found := await engine.store.list_questions()):
            await trio.sleep(0.01)
        records.extend(found)

    await listed()
    return records[0]


async def test_a_task_nobody_can_be_asked_in_declines_the_question_saying_why(tmp_path: Path) -> None:
    with real_time_limit("a refused question"):
        async with engine_with_doubles(tmp_path) as (engine, workers):
            session_id, task_id, worker = await running_task(engine, workers)
            await worker.emit(task_id, EventType.QUESTION_REQUESTED, ASKED)
            [sent] = await worker.connection.wait_for(Method.SEND_ANSWER)
            answered = await _answered(engine, session_id)
    assert sent["question_id"] == "ask-1" and sent["declined"] and "not interactive" in sent["reason"]
    assert answered.declined and answered.answered_via == AnsweredVia.REFUSED


async def test_an_answer_is_checked_given_once_and_reaches_the_runtime_with_its_secret(tmp_path: Path) -> None:
    with real_time_limit("an answered question"):
        async with engine_with_doubles(tmp_path) as (engine, workers):
            session_id, task_id, worker = await running_task(engine, workers, durable_approvals=True)
            await worker.emit(task_id, EventType.QUESTION_REQUESTED, ASKED)
            record = await _pending(engine)
            assert record.ask_id == "ask-1" and record.question_id != "ask-1" and record.expires_at is not None
            with pytest.raises(InvalidAnswer, match="answers.colour: 'green' is not a choice"):
                await engine.questions.answer(record.question_id, QuestionReply(answers={"colour": "green"}), "me")
            settled = await engine.questions.answer(
                record.question_id, QuestionReply(answers={"colour": "red", "token": "s3cret"}), "api:me")
            with pytest.raises(QuestionSettled):
                await engine.questions.answer(record.question_id, QuestionReply(decline=True), "api:me")
            [sent] = await worker.connection.wait_for(Method.SEND_ANSWER)
            answered = await _answered(engine, session_id)
    assert settled.state == QuestionState.ANSWERED and settled.answers == {"colour": "red", "token": "[secret]"}
    assert sent["answers"] == {"colour": "red", "token": "s3cret"} and not sent.get("declined")
    assert (answered.answers, answered.answered_via, answered.answered_by) == (
        {"colour": "red", "token": "[secret]"}, AnsweredVia.USER, "api:me")


@pytest.mark.parametrize("fallback", list(QuestionFallback))
async def test_an_unanswered_question_settles_by_the_operators_fallback(
        tmp_path: Path, autojump_clock: trio.testing.MockClock, fallback: QuestionFallback) -> None:
    with real_time_limit("a question's fallback"):
        async with engine_with_doubles(tmp_path, questions=QuestionPolicy(timeout_s=60, fallback=fallback)) as (
                engine, workers):
            session_id, task_id, worker = await running_task(engine, workers, durable_approvals=True)
            await worker.emit(task_id, EventType.QUESTION_REQUESTED, ASKED)
            [sent] = await worker.connection.wait_for(Method.SEND_ANSWER)
            answered = await _answered(engine, session_id)
    assert answered.answered_via == AnsweredVia.FALLBACK and "no answer within 60 s" in answered.reason
    if fallback == QuestionFallback.DEFAULT:
        assert sent["answers"] == {"colour": "blue"} and not answered.declined
    else:
        assert sent["declined"] and answered.declined


async def test_the_tasks_end_closes_its_open_question_before_its_terminal_event(tmp_path: Path) -> None:
    with real_time_limit("a question closed by its task's end"):
        async with engine_with_doubles(tmp_path) as (engine, workers):
            session_id, task_id, worker = await running_task(engine, workers,
                                                             interaction_mode=InteractionMode.INTERACTIVE,
                                                             durable_approvals=True)
            await worker.emit(task_id, EventType.QUESTION_REQUESTED, ASKED)
            record = await _pending(engine)
            await engine.stop_task(task_id)
            await engine.wait_task(task_id)
            events = await engine.store.read(session_id)
            final = await engine.store.get_question(record.question_id)
    types = [e.type for e in events]
    assert types[-2:] == [EventType.QUESTION_ANSWERED, EventType.TASK_STOPPED]
    assert final.state == QuestionState.DECLINED and final.answered_via == AnsweredVia.TASK_END
    check_session(events)


async def test_a_supervisor_shutting_down_declines_its_open_questions(tmp_path: Path) -> None:
    with real_time_limit("questions closed at shutdown"):
        async with engine_with_doubles(tmp_path) as (engine, workers):
            session_id, task_id, worker = await running_task(engine, workers, durable_approvals=True)
            await worker.emit(task_id, EventType.QUESTION_REQUESTED, ASKED)
            record = await _pending(engine)
        async with engine_with_doubles(tmp_path) as (engine, _):
            final = await engine.store.get_question(record.question_id)
            events = await engine.store.read(session_id)
    assert final.state == QuestionState.DECLINED and final.answered_via == AnsweredVia.TASK_END
    assert [e.type for e in events][-2] == EventType.QUESTION_ANSWERED
    check_session(events)


async def test_a_flood_of_questions_is_declined_past_the_open_limit(tmp_path: Path) -> None:
    with real_time_limit("a flood of questions"):
        async with engine_with_doubles(tmp_path) as (engine, workers):
            session_id, task_id, worker = await running_task(engine, workers, durable_approvals=True)
            for n in range(MAX_OPEN_QUESTIONS + 1):
                await worker.emit(task_id, EventType.QUESTION_REQUESTED, ASKED.model_copy(
                    update={"question_id": f"ask-{n}"}))
            [refused] = await worker.connection.wait_for(Method.SEND_ANSWER)
            pending = await engine.store.list_questions()
    assert refused["question_id"] == f"ask-{MAX_OPEN_QUESTIONS}" and "waiting already" in refused["reason"]
    assert len(pending) == MAX_OPEN_QUESTIONS
