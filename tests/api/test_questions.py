"""Questions over the API: a runtime's question is listed, answered once (checked against its choices), hidden from
other tenants, and its answer reaches the runtime; a task nobody can be asked in declines it, saying why."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from codesdk import AsyncClient, Client
from codesdk.client import Conflict, InvalidRequest, NotFound
from codesdk.protocol import EventType, NormalizedEvent, QuestionAnswered, QuestionReply, QuestionRequested
from codesdk.testing.invariants import check_session

from tests.api.conftest import Api


async def _pending(api: Api, token: str) -> list[dict[str, Any]]:
    while True:
        r = await api.client.get("/v1/questions", headers=api.auth(token))
        assert r.status_code == 200, r.text
        if r.json()["questions"]:
            return list(r.json()["questions"])
        await trio.sleep(0.05)


async def _start(api: Api, token: str, session_id: str, interaction_mode: str = "interactive") -> dict[str, Any]:
    r = await api.client.post(f"/v1/sessions/{session_id}/tasks", headers=api.auth(token), json={
        "prompt": "a widget", "interaction_mode": interaction_mode, "runtime_config": {"scenario": "ask-user"}})
    assert r.status_code == 202, r.text
    return dict(r.json())


async def _events(api: Api, token: str, session_id: str) -> list[dict[str, Any]]:
    r = await api.client.get(f"/v1/sessions/{session_id}/events", headers=api.auth(token))
    return list(r.json()["events"])


@pytest.mark.parametrize(("answers", "field", "why"), [
    ({"colour": "green", "name": "w"}, "answers.colour", "'green' is not a choice; choose one of 'red', 'blue'"),
    ({"colour": "red"}, "answers.name", "required"),
    ({"colour": "red", "name": 7}, "answers.name", "must be text"),
    ({"colour": "red", "name": "w", "size": "L"}, "answers.size", "no question 'size' was asked"),
    ({"colour": "red", "name": "  "}, "answers.name", "must not be empty"),
    ({"colour": "red", "name": None}, "answers.name", "must be text, a number, true/false or a list of text"),
], ids=["not-a-choice", "missing", "wrong-type", "not-asked", "empty-text", "null"])
async def test_a_malformed_answer_is_422_naming_the_field(api: Api, answers: dict[str, Any], field: str,
                                                          why: str) -> None:
    with trio.fail_after(30):
        session = await api.create_session(api.alice, "user:alice")
        await _start(api, api.alice, session["session_id"])
        [question] = await _pending(api, api.alice)
        r = await api.client.post(f"/v1/questions/{question['question_id']}", headers=api.auth(api.alice),
                                  json={"answers": answers})
        assert r.status_code == 422 and f"'{field}'" in r.json()["error"]["message"], r.text
        assert why in r.json()["error"]["message"]
        both = await api.client.post(f"/v1/questions/{question['question_id']}", headers=api.auth(api.alice),
                                     json={"answers": {"colour": "red"}, "decline": True})
        assert both.status_code == 422
        still = await api.client.get(f"/v1/questions/{question['question_id']}", headers=api.auth(api.alice))
        assert still.json()["state"] == "pending"


async def test_question_round_trip(api: Api) -> None:
    with trio.fail_after(30):
        session = await api.create_session(api.alice, "user:alice")
        task = await _start(api, api.alice, session["session_id"])
        [question] = await _pending(api, api.alice)
        assert (question["source"], question["state"], question["task_id"]) == ("scripted", "pending",
                                                                               task["task_id"])
        assert [q["id"] for q in question["questions"]] == ["colour", "name"]
        assert question["message"] == "Before I start on: a widget"
        path = f"/v1/questions/{question['question_id']}"
        assert (await api.client.get("/v1/questions", headers=api.auth(api.bob))).json()["questions"] == []
        assert (await api.client.get(path, headers=api.auth(api.bob))).status_code == 404
        hidden = await api.client.post(path, headers=api.auth(api.bob), json={"answers": {"colour": "red"}})
        assert hidden.status_code == 404
        r = await api.client.post(path, headers=api.auth(api.alice),
                                  json={"answers": {"colour": "red", "name": "Widget"}})
        assert r.status_code == 200 and r.json()["state"] == "answered", r.text
        assert r.json()["answered_by"] == "api:alice" and r.json()["answered_via"] == "user"
        again = await api.client.post(path, headers=api.auth(api.alice), json={"decline": True})
        assert again.status_code == 409 and again.json()["error"]["code"] == "already_answered"
        done = await api.ended(api.alice, task["task_id"])
        assert done["state"] == "completed"
        events = await _events(api, api.alice, session["session_id"])
    texts = [e["payload"]["text"] for e in events if e["type"] == "model.output.completed"]
    assert texts[-1] == "Colour red, name Widget."
    answered = [e["payload"] for e in events if e["type"] == "question.answered"]
    assert answered == [{"question_id": question["question_id"], "answers": {"colour": "red", "name": "Widget"},
                         "declined": False, "reason": "", "answered_via": "user", "answered_by": "api:alice"}]
    check_session([NormalizedEvent.model_validate(e) for e in events])


async def test_a_declined_question_tells_the_runtime_why(api: Api) -> None:
    with trio.fail_after(30):
        session = await api.create_session(api.alice, "user:alice")
        task = await _start(api, api.alice, session["session_id"])
        [question] = await _pending(api, api.alice)
        r = await api.client.post(f"/v1/questions/{question['question_id']}", headers=api.auth(api.alice),
                                  json={"decline": True, "reason": "not now"})
        assert r.status_code == 200 and r.json()["state"] == "declined"
        await api.ended(api.alice, task["task_id"])
        events = await _events(api, api.alice, session["session_id"])
    texts = [e["payload"]["text"] for e in events if e["type"] == "model.output.completed"]
    assert texts[-1] == "No answer (not now); I will stop here."


async def test_a_task_nobody_can_be_asked_in_declines_saying_why(api: Api) -> None:
    with trio.fail_after(30):
        session = await api.create_session(api.alice, "user:alice")
        task = await _start(api, api.alice, session["session_id"], interaction_mode="non_interactive")
        done = await api.ended(api.alice, task["task_id"])
        events = await _events(api, api.alice, session["session_id"])
        listed = (await api.client.get("/v1/questions?state=all", headers=api.auth(api.alice))).json()
    assert done["state"] == "completed" and listed["questions"] == []  # nobody was asked: no row
    [answered] = [e["payload"] for e in events if e["type"] == "question.answered"]
    assert answered["declined"] and answered["answered_via"] == "refused" and "not interactive" in answered["reason"]
    texts = [e["payload"]["text"] for e in events if e["type"] == "model.output.completed"]
    assert "not interactive" in texts[-1]


async def test_the_query_state_is_checked(api: Api) -> None:
    r = await api.client.get("/v1/questions?state=maybe", headers=api.auth(api.alice))
    assert r.status_code == 422 and "pending, answered, declined" in r.json()["error"]["message"]


async def test_both_clients_answer_from_the_stream(api: Api) -> None:
    with trio.fail_after(60):
        async with AsyncClient(socket=api.socket, token=api.alice) as client:
            session = await client.create_session(namespace="user:alice")
            task = await client.start_task(session.session_id, "a widget", interactive=True,
                                           runtime_config={"scenario": "ask-user"})
            while not (pending := await client.questions()):
                await trio.sleep(0.05)
            asked = [e for e in await client.events(session.session_id) if e.type == EventType.QUESTION_REQUESTED]
            assert isinstance(asked[0].payload, QuestionRequested)
            assert asked[0].payload.question_id == pending[0].question_id
            with pytest.raises(InvalidRequest, match="answers.colour"):
                await client.reply(asked[0], {"colour": "green", "name": "w"})
            answered = await client.reply(asked[0], {"colour": "blue", "name": "Gadget"})
            with pytest.raises(Conflict):
                await client.answer_question(answered.question_id, decline=True)
            with pytest.raises(TypeError, match="not a question.requested"):
                await client.reply((await client.events(session.session_id))[0], {})
            assert (await client.question(answered.question_id)).answers == {"colour": "blue", "name": "Gadget"}
            await api.ended(api.alice, task.task_id)

        def sync_side() -> None:
            with Client(socket=api.socket, token=api.bob) as bob:
                assert bob.questions(state="all") == []
                with pytest.raises(NotFound):
                    bob.question(answered.question_id)
                with pytest.raises(NotFound):
                    bob.answer_question(answered.question_id, {"colour": "red"})

        await trio.to_thread.run_sync(sync_side)


async def test_run_answers_each_question_as_it_comes(api: Api) -> None:
    asked: list[str] = []

    async def answerer(event: NormalizedEvent) -> dict[str, str]:  # just the answers: a reply without a decline
        assert isinstance(event.payload, QuestionRequested)
        asked.extend(q.id for q in event.payload.questions)
        return {"colour": "red", "name": "Streamed"}

    with trio.fail_after(60):
        async with AsyncClient(socket=api.socket, token=api.alice) as client:
            session = await client.create_session(namespace="user:alice")
            events = [e async for e in client.run(session.session_id, "a widget", answerer=answerer,
                                                  runtime_config={"scenario": "ask-user"})]

        def blocking() -> list[NormalizedEvent]:
            with Client(socket=api.socket, token=api.alice) as sync:
                return list(sync.run(session.session_id, "again", runtime_config={"scenario": "ask-user"},
                                     answerer=lambda event: QuestionReply(decline=True, reason="busy")))

        declined = await trio.to_thread.run_sync(blocking)
    assert asked == ["colour", "name"] and events[-1].type == EventType.TASK_COMPLETED
    texts = [e.payload.text for e in events if e.type == EventType.MODEL_OUTPUT_COMPLETED]  # type: ignore[attr-defined]
    assert texts[-1] == "Colour red, name Streamed."
    again = [e.payload.text for e in declined if e.type == EventType.MODEL_OUTPUT_COMPLETED]  # type: ignore[attr-defined]
    assert again[-1] == "No answer (busy); I will stop here."


async def test_an_answer_body_beyond_its_bounds_is_422(api: Api) -> None:
    with trio.fail_after(30):
        session = await api.create_session(api.alice, "user:alice")
        await _start(api, api.alice, session["session_id"])
        [question] = await _pending(api, api.alice)
        path = f"/v1/questions/{question['question_id']}"
        many = await api.client.post(path, headers=api.auth(api.alice),
                                     json={"answers": {f"q{n}": "x" for n in range(40)}})
        nested = await api.client.post(path, headers=api.auth(api.alice), json={"answers": {"colour": {"a": 1}}})
        long_text = await api.client.post(path, headers=api.auth(api.alice),
                                          json={"answers": {"colour": "red", "name": "x" * 30_000}})
    assert many.status_code == 422 and "'answers'" in many.json()["error"]["message"]
    assert nested.status_code == 422 and "answers.colour" in nested.json()["error"]["message"]
    assert long_text.status_code == 422 and "answers.name" in long_text.json()["error"]["message"]


async def test_a_question_answered_elsewhere_ends_the_prompt_and_the_run_goes_on(api: Api) -> None:
    """The person at ``run``'s answerer never answers: the question is answered over the API by someone else, the
    answerer is cancelled, and the run streams on to the task's end (nothing waits on the prompt)."""
    cancelled: list[bool] = []

    with trio.fail_after(60):
        async with AsyncClient(socket=api.socket, token=api.alice) as client, \
                AsyncClient(socket=api.socket, token=api.alice) as elsewhere:
            async def never_typing(event: NormalizedEvent) -> QuestionReply:
                assert isinstance(event.payload, QuestionRequested)
                await elsewhere.answer_question(event.payload.question_id, {"colour": "blue", "name": "Elsewhere"})
                try:
                    await trio.sleep_forever()
                finally:
                    cancelled.append(True)
                raise AssertionError("unreachable")

            session = await client.create_session(namespace="user:alice")
            events = [e async for e in client.run(session.session_id, "a widget", answerer=never_typing,
                                                  runtime_config={"scenario": "ask-user"})]
    assert cancelled == [True] and events[-1].type == EventType.TASK_COMPLETED
    [answered] = [e.payload for e in events if e.type == EventType.QUESTION_ANSWERED]
    assert isinstance(answered, QuestionAnswered) and answered.answered_by.startswith("api:")
    texts = [e.payload.text for e in events if e.type == EventType.MODEL_OUTPUT_COMPLETED]  # type: ignore[attr-defined]
    assert texts[-1] == "Colour blue, name Elsewhere."
