"""``POST /v1/tasks/{id}/input`` (steering) over the API and both clients: into a running task only, bad input
refused naming the field, another tenant's task not found."""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest
import trio

from codesdk.client import AsyncClient, Client, Conflict, InvalidRequest, NotFound
from codesdk.protocol import EventType
from tests.api.conftest import Api


async def _paused(api: Api, token: str, sid: str) -> None:
    """Until the steer scenario has ended its first request: it waits for an input then."""
    while not any(e["type"] == EventType.RUNTIME_REQUEST_COMPLETED for e in (await api.client.get(
            f"/v1/sessions/{sid}/events", headers=api.auth(token))).json()["events"]):
        await trio.sleep(0.05)


async def test_an_input_reaches_the_running_task_once_per_idempotency_key(api: Api) -> None:
    with trio.fail_after(60):
        sid = (await api.create_session(api.alice, "user:alice"))["session_id"]
        tid = (await api.run_task(api.alice, sid, "steer"))["task_id"]
        await _paused(api, api.alice, sid)
        headers = {**api.auth(api.alice), "Idempotency-Key": "k-1"}
        body = {"input": [{"type": "text", "text": "and the docs"}], "input_id": "in-1"}
        first = await api.client.post(f"/v1/tasks/{tid}/input", json=body, headers=headers)
        assert first.status_code == 202, first.text
        assert first.json() == {"task_id": tid, "input_id": "in-1", "delivery": "mid_turn"}
        again = await api.client.post(f"/v1/tasks/{tid}/input", json=body, headers=headers)
        assert (again.status_code, again.json()) == (202, first.json())
        assert (await api.ended(api.alice, tid))["state"] == "completed"
        r = await api.client.post(f"/v1/tasks/{tid}/input", json={"input": "late"}, headers=api.auth(api.alice))
        assert (r.status_code, r.json()["error"]["code"]) == (409, "task_not_active")
        assert "start a new task" in r.json()["error"]["message"]
        events = (await api.client.get(f"/v1/sessions/{sid}/events", headers=api.auth(api.alice))).json()["events"]
    appended = [e["payload"] for e in events if e["type"] == "model.input.appended"]
    assert [(a["input_id"], a["text"], a["delivery"]) for a in appended] == [("in-1", "and the docs", "mid_turn")]


@pytest.mark.parametrize(("body", "field"), [
    ({}, "input"),
    ({"input": ""}, "input"),
    ({"input": "   "}, "input"),
    ({"input": []}, "input"),
    ({"input": 7}, "input"),
    ({"input": [{"type": "image", "url": "x"}]}, "input"),
    ({"input": "x" * 100_001}, "input"),
    ({"input": "x", "input_id": ""}, "input_id"),
    ({"input": "x", "input_id": "has space"}, "input_id"),
    ({"input": "x", "colour": "red"}, "colour"),
])
async def test_a_malformed_input_is_422_naming_the_field(api: Api, body: dict[str, Any], field: str) -> None:
    with trio.fail_after(30):
        sid = (await api.create_session(api.alice, "user:alice"))["session_id"]
        tid = (await api.run_task(api.alice, sid, "hang"))["task_id"]
        r = await api.client.post(f"/v1/tasks/{tid}/input", json=body, headers=api.auth(api.alice))
        assert r.status_code == 422, r.text
        assert f"'{field}'" in r.json()["error"]["message"], r.json()
        await api.client.post(f"/v1/tasks/{tid}/stop", headers=api.auth(api.alice))


async def test_both_clients_send_inputs_and_map_refusals(api: Api) -> None:
    with trio.fail_after(60):
        sid = (await api.create_session(api.alice, "user:alice"))["session_id"]
        tid = (await api.run_task(api.alice, sid, "steer"))["task_id"]
        await _paused(api, api.alice, sid)
        async with AsyncClient(socket=api.socket, token=api.alice) as client:
            with pytest.raises(InvalidRequest, match="'input'"):
                await client.send_input(tid, " ")
            answer = await client.send_input(tid, "async one", input_id="in-a")
            assert (answer.input_id, answer.delivery) == ("in-a", "mid_turn")
            await api.ended(api.alice, tid)
            with pytest.raises(Conflict, match="not running"):
                await client.send_input(tid, "late")

        def sync_calls() -> None:
            with Client(socket=api.socket, token=api.bob) as other:
                with pytest.raises(NotFound):
                    other.send_input(tid, "not yours")
            with Client(socket=api.socket, token=api.alice) as own:
                with pytest.raises(Conflict, match="not running"):
                    own.send_input(tid, [{"type": "code", "code": "late"}])
        await trio.to_thread.run_sync(sync_calls)


async def test_the_command_line_steers_a_task_of_the_service_with_piped_lines(api: Api) -> None:
    """``codesdk run --url … --steer``: each line on stdin goes to the task (``tests/cli`` tests the rest)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CODESDK_")} | {"NO_COLOR": "1"}
    with trio.fail_after(90):
        ran = await trio.run_process([sys.executable, "-m", "codesdk.supervisor.cli.front", "--url",
                                      f"unix:{api.socket}", "--token", api.alice, "run", "go", "--namespace",
                                      "user:alice", "--scenario", "steer", "--steer"],
                                     stdin=b"through the service\n", capture_stdout=True, capture_stderr=True,
                                     check=False, env=env)
    assert ran.returncode == 0, ran.stderr.decode()
    assert "You added: through the service" in ran.stdout.decode()
