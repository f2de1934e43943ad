"""The Python client (codesdk.client) against the real API over the unix socket."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from codesdk import AsyncClient, Client, Conflict, InvalidRequest, NotFound, ServiceUnreachable, Unauthorized
from codesdk.client import _Call
from codesdk.protocol import EventType, ModelInput, TaskFailed

from tests.api.conftest import Api


async def test_async_client_runs_a_task_and_streams_it(api: Api) -> None:
    with trio.fail_after(30):
        async with AsyncClient(socket=api.socket, token=api.alice) as client:
            session = await client.create_session(namespace="user:alice")
            events = [e async for e in client.run(session.session_id, "hi client",
                                                  runtime_config={"scenario": "echo"})]
            assert events[0].type == EventType.TASK_STARTED and events[-1].type == EventType.TASK_COMPLETED
            assert [e.seq for e in events] == list(range(events[0].seq, events[-1].seq + 1))
            stored = await client.events(session.session_id)
            assert stored[-len(events):] == events
            task_id = events[0].trace.task_id
            assert task_id is not None
            task = await client.get_task(task_id)
            assert task.state == "completed"


async def test_a_task_may_move_the_session_and_cap_its_input(api: Api) -> None:
    """``runtime`` moves the session (one the worker cannot host fails that task and leaves the session as it was);
    ``max_input_tokens`` caps the compiled input (a request over it fails with a hint); bad values are refused."""
    with trio.fail_after(30):
        async with AsyncClient(socket=api.socket, token=api.alice) as client:
            session = await client.create_session(namespace="user:alice")
            sid = session.session_id
            [e async for e in client.run(sid, "remember marker-404")]
            with pytest.raises(InvalidRequest, match="it can run: .*scripted"):  # refused before it is stored
                [e async for e in client.run(sid, "go on", runtime="no-such-runtime")]
            assert (await client.get_session(sid)).runtime == "scripted"
            capped = [e async for e in client.run(sid, "word " * 100, max_input_tokens=20)]
            assert isinstance(capped[-1].payload, TaskFailed) and capped[-1].payload.code == "CONTEXT_TOO_LARGE"
            fits = [e async for e in client.run(sid, "short", max_input_tokens=5000)]
            [given] = [e.payload for e in fits if e.type == EventType.MODEL_INPUT]
            assert isinstance(given, ModelInput) and given.resume == "reconstructed"
            assert given.context is not None and given.context.budget_tokens == 5000
            for bad in ({"max_input_tokens": 0}, {"max_input_tokens": 2**53 + 1}, {"runtime": "x" * 65}):
                with pytest.raises(InvalidRequest):
                    await client.start_task(sid, "x", **bad)  # type: ignore[arg-type]
            with pytest.raises(InvalidRequest, match="a runtime's name is lowercase letters"):  # said in words
                await client.start_task(sid, "x", runtime="../claude")
            for raw in ({"max_input_tokens": True}, {"max_input_tokens": "5"}, {"max_input_tokens": 1.0},
                        {"runtime": 7}):  # only what it says: no true for 1, no strings for numbers
                with pytest.raises(InvalidRequest):
                    await client._send(_Call("POST", f"/v1/sessions/{sid}/tasks", dict, json={"prompt": "x", **raw}))


async def test_async_client_errors_are_typed(api: Api) -> None:
    with trio.fail_after(30):
        async with AsyncClient(socket=api.socket, token=api.bob) as client:
            with pytest.raises(NotFound):
                await client.get_session("ses_does_not_exist")
            session = await client.create_session(namespace="user:bob")
            await client.start_task(session.session_id, "x", runtime_config={"scenario": "hang"})
            with pytest.raises(Conflict):
                await client.start_task(session.session_id, "y")
            with pytest.raises(InvalidRequest):
                await client.start_task(session.session_id, "")
        async with AsyncClient(socket=api.socket, token="wrong") as client:
            with pytest.raises(Unauthorized):
                await client.get_session(session.session_id)


async def test_sync_client(api: Api) -> None:
    def use_sync_client() -> list[str]:
        with Client(socket=api.socket, token=api.alice) as client:
            session = client.create_session(namespace="user:alice")
            client.start_task(session.session_id, "sync", runtime_config={"scenario": "echo"})
            return [e.type.value for e in client.stream(session.session_id, until_terminal=True)]

    with trio.fail_after(30):
        types = await trio.to_thread.run_sync(use_sync_client)
    assert types[0] == "session.created" and types[-1] == "task.completed"


async def test_client_decides_approvals(api: Api) -> None:
    with trio.fail_after(30):
        async with AsyncClient(socket=api.socket, token=api.alice) as client:
            session = await client.create_session(namespace="user:alice")
            task = await client.start_task(session.session_id, "write", interactive=True,
                                           runtime_config={"scenario": "write-or-deny"})
            while not (pending := await client.approvals()):
                await trio.sleep(0.05)
            decided = await client.decide(pending[0].approval_id, allow=False, reason="client says no")
            assert decided.state == "denied"
            with pytest.raises(Conflict):
                await client.decide(pending[0].approval_id, allow=True)
            while (await client.get_task(task.task_id)).state == "running":
                await trio.sleep(0.05)
            assert (await client.approvals(state="denied"))[0].decision_reason == "client says no"


async def test_a_socket_nobody_listens_on_is_a_clear_unreachable_error(tmp_path: Path) -> None:
    missing = tmp_path / "nobody.sock"
    async with AsyncClient(socket=missing, token="t") as client:
        with pytest.raises(ServiceUnreachable, match="is `codesdk-supervisor serve` running there") as err:
            await client.list_sessions()
    assert (err.value.status, err.value.code) == (503, "service_unreachable") and str(missing) in err.value.message
    with Client(socket=missing, token="t") as sync, pytest.raises(ServiceUnreachable):
        sync.create_session(namespace="user:alice")
