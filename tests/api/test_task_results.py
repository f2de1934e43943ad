"""A task's result, from its stored events: its final answer, its tool calls, its usage totals — on
``GET /v1/tasks/{id}``, a stop's answer, and what both clients' ``run`` end with."""

from __future__ import annotations

import trio

from codesdk import AsyncClient, Client

from tests.api.conftest import Api


async def test_an_ended_task_says_its_final_answer_tool_calls_and_usage(api: Api) -> None:
    with trio.fail_after(60):
        sid = (await api.create_session(api.alice, "user:alice"))["session_id"]
        async with AsyncClient(socket=api.socket, token=api.alice) as client:
            run = client.run(sid, "read both", runtime_config={"scenario": "parallel-tools"})
            assert run.task is None
            events = [event async for event in run]
            task = run.task
        assert task is not None and task.state == "completed" and task.result is not None
        assert task.task_id == events[0].trace.task_id
        result = task.result
        assert result.tool_calls == 2 and result.stop_reason == "end_turn"
        assert [block.kind for block in result.output] == ["text", "code"]  # after the tools; thinking left out
        assert result.output[0].text.startswith("a.txt says ") and result.output[1].text == "print('done')\n"
        assert result.text == result.output[0].text + result.output[1].text
        assert (result.usage.reports, result.usage.input_tokens, result.usage.output_tokens) == (1, 120, 48)
        assert result.usage.cost_usd is None  # the scripted runtime reports no cost
        assert task.started_at is not None and task.ended_at is not None  # the duration is theirs, not a clock's
        assert result.duration_ms == (task.ended_at - task.started_at).total_seconds() * 1000
        raw = (await api.client.get(f"/v1/tasks/{task.task_id}", headers=api.auth(api.alice))).json()
        assert raw["result"]["usage"]["input_tokens"] == 120 and raw["result"]["tool_calls"] == 2


async def test_a_running_task_has_no_result_and_a_stopped_one_has_it(api: Api) -> None:
    with trio.fail_after(60):
        sid = (await api.create_session(api.alice, "user:alice"))["session_id"]
        async with AsyncClient(socket=api.socket, token=api.alice) as client:
            task = await client.start_task(sid, "wait", runtime_config={"scenario": "hang"})
            assert task.result is None and (await client.get_task(task.task_id)).result is None
            stopped = await client.stop_task(task.task_id)
        assert stopped.state == "stopped" and stopped.result is not None and stopped.result.stop_reason is None
        assert stopped.result.output == () or stopped.result.output[0].text.startswith("Thinking")


async def test_the_blocking_client_runs_a_task_to_its_end(api: Api) -> None:
    with trio.fail_after(60):
        sid = (await api.create_session(api.alice, "user:alice"))["session_id"]

        def blocking() -> tuple[str, str]:
            with Client(socket=api.socket, token=api.alice) as client:
                ended = client.run(sid, "hello there", runtime_config={"scenario": "echo"}).wait()
                assert ended.result is not None
                return str(ended.state), ended.result.text

        state, text = await trio.to_thread.run_sync(blocking)
    assert state == "completed" and "hello there" in text
