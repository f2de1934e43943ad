"""Task deadlines through the HTTP API and the Python client, with a real worker: a task past ``timeout_s`` or
``idle_timeout_s`` (the scripted runtime's ``hang``: it says something, then waits forever) is stopped and fails
``TASK_TIMEOUT`` with the stop's receipt; bad values and values over the operator's maximum are refused 422 before
anything is stored. Nothing here waits for a duration: each test waits for the task's terminal event."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import trio

from codesdk import AsyncClient, InvalidRequest
from codesdk.protocol import EventType, NormalizedEvent, StopReceipt, TaskFailed, TaskFailureCode, WorkerAnswer
from codesdk.supervisor.engine import DeadlineLimits
from codesdk.testing.invariants import check_session

from tests.api.conftest import Api


def _timed_out(events: list[NormalizedEvent], deadline: str, limit_s: float) -> TaskFailed:
    assert events[0].type == EventType.TASK_STARTED and events[-1].type == EventType.TASK_FAILED, \
        [e.type.value for e in events]
    payload = events[-1].payload
    assert isinstance(payload, TaskFailed) and payload.code == TaskFailureCode.TASK_TIMEOUT and not payload.retryable
    assert payload.details["deadline"] == deadline and payload.details["limit_s"] == limit_s
    receipt = StopReceipt.model_validate(payload.details["receipt"])
    assert receipt.worker == WorkerAnswer.CONFIRMED, receipt  # the worker stopped the runtime and said so
    assert receipt.interrupt_sent and receipt.processes_gone is not False, receipt
    return payload


@pytest.mark.parametrize(("field", "deadline"), [("timeout_s", "timeout_s"), ("idle_timeout_s", "idle_timeout_s")])
async def test_a_hanging_task_past_its_deadline_fails_task_timeout_with_a_receipt(api: Api, field: str,
                                                                                 deadline: str) -> None:
    with trio.fail_after(60):
        async with AsyncClient(socket=api.socket, token=api.alice) as client:
            session = await client.create_session(namespace="user:alice")
            deadline_arg: dict[str, Any] = {field: 0.5}
            events = [e async for e in client.run(session.session_id, "hang on", runtime_config={"scenario": "hang"},
                                                  **deadline_arg)]
            _timed_out(events, deadline, 0.5)
            check_session(await client.events(session.session_id, limit=1000))
            task = await client.get_task(events[0].trace.task_id or "")
            assert task.state == "failed" and task.error is not None and task.error["code"] == "TASK_TIMEOUT"


async def test_a_task_that_ends_in_time_is_not_touched_by_its_deadline(api: Api) -> None:
    with trio.fail_after(60):
        async with AsyncClient(socket=api.socket, token=api.alice) as client:
            session = await client.create_session(namespace="user:alice")
            events = [e async for e in client.run(session.session_id, "hi", runtime_config={"scenario": "echo"},
                                                  timeout_s=3600, idle_timeout_s=3600)]
            assert events[-1].type == EventType.TASK_COMPLETED
            assert events[0].payload.model_dump()["timeout_s"] == 3600  # stored with the task


BAD: list[dict[str, Any]] = [
    {"timeout_s": 0}, {"timeout_s": -1}, {"timeout_s": "5"}, {"timeout_s": True}, {"idle_timeout_s": 0},
    {"idle_timeout_s": -0.5}, {"idle_timeout_s": "none"}, {"idle_timeout_s": [1]},
]


async def test_bad_deadlines_are_refused_422_and_nothing_is_stored(api: Api) -> None:
    session = await api.create_session(api.alice, "user:alice")
    path = f"/v1/sessions/{session['session_id']}/tasks"
    for bad in BAD:
        r = await api.client.post(path, headers=api.auth(api.alice), json={"prompt": "x", **bad})
        assert r.status_code == 422, (bad, r.text)
        assert next(iter(bad)) in r.json()["error"]["message"], (bad, r.text)
    for raw in (b'{"prompt": "x", "timeout_s": 1e999}', b'{"prompt": "x", "idle_timeout_s": NaN}'):
        r = await api.client.post(path, headers={**api.auth(api.alice), "Content-Type": "application/json"},
                                  content=raw)
        assert r.status_code == 422, (raw, r.text)
    assert await api.engine.store.list_active_tasks() == []


async def test_a_deadline_above_the_operators_maximum_is_refused_422_saying_the_maximum(api: Api) -> None:
    api.engine.config = dataclasses.replace(api.engine.config, deadlines=DeadlineLimits(
        timeout_max_s=600, idle_max_s=60))
    async with AsyncClient(socket=api.socket, token=api.alice) as client:
        session = await client.create_session(namespace="user:alice")
        with pytest.raises(InvalidRequest, match=r"timeout_s 601 s is above this supervisor's maximum of 600 s"):
            await client.start_task(session.session_id, "x", timeout_s=601)
        with pytest.raises(InvalidRequest, match=r"idle_timeout_s 61 s is above this supervisor's maximum of 60 s"):
            await client.start_task(session.session_id, "x", idle_timeout_s=61)
        assert await api.engine.store.list_active_tasks() == []
        events = [e async for e in client.run(session.session_id, "hi", runtime_config={"scenario": "echo"})]
        started = events[0].payload.model_dump()
        assert (started["timeout_s"], started["idle_timeout_s"]) == (600, 60)  # no default: the maximum


async def test_the_openapi_document_describes_the_deadlines(api: Api) -> None:
    r = await api.client.get("/v1/openapi.json", headers=api.auth(api.alice))
    body = r.json()["components"]["schemas"]["StartTaskRequest"]["properties"]
    for field in ("timeout_s", "idle_timeout_s"):
        assert {"exclusiveMinimum": 0, "type": "number"} in body[field]["anyOf"], body[field]
