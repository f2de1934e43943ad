"""How both clients follow a stream across its connections, against a real HTTP server on a unix socket that
plays a scripted service: a connection that drops or ends early (the service's store failing: an ``error``
frame) is resumed by ``Last-Event-ID`` with nothing handed out twice; connections that keep bringing nothing new
end in the service's own error; a service that is not there is said at once."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

import codesdk.client
from codesdk import ApiError, AsyncClient, Client, ServiceUnreachable

SESSION = "s1"


def _event(seq: int, terminal: bool = False, task: str | None = None) -> dict[str, Any]:
    payload = {"stop_reason": "end_turn"} if terminal else {"block_id": "b1", "delta": f"d{seq}", "index": seq - 1}
    trace = {"session_id": SESSION} | ({"task_id": task} if task else {})
    return {"seq": seq, "time": "2026-01-01T00:00:00Z", "type": "task.completed" if terminal else "model.output.delta",
            "trace": trace, "runtime": {"name": "scripted"}, "payload": payload}


def _frames(items: list[dict[str, Any]]) -> Iterator[bytes]:
    for item in items:
        if "error" in item:
            yield f"event: error\ndata: {json.dumps(item)}\n\n".encode()
        else:
            yield f"id: {item['seq']}\nevent: {item['type']}\ndata: {json.dumps(item)}\n\n".encode()


STORE_FAILING = {"error": {"code": "store_failing", "message": "reading events failed: the database is away"}}


@dataclass
class ScriptedService:
    """Answers the n-th connection to the session's stream with ``script[n]`` (the last one again after the end)
    and closes it; keeps each connection's ``Last-Event-ID``."""

    socket: Path
    script: list[list[dict[str, Any]]]
    resumed_from: list[str] = field(default_factory=list)

    async def stream(self, request: Request) -> Response:
        self.resumed_from.append(request.headers.get("last-event-id", ""))
        answer = self.script[min(len(self.resumed_from), len(self.script)) - 1]
        return StreamingResponse(_frames(answer), media_type="text/event-stream")


@pytest.fixture
async def scripted(tmp_path: Path) -> AsyncIterator[ScriptedService]:
    service = ScriptedService(tmp_path / "api.sock", [])
    app = Starlette(routes=[Route(f"/v1/sessions/{SESSION}/events/stream", service.stream)])
    config = Config()
    config.bind = [f"unix:{service.socket}"]
    config.accesslog = config.errorlog = None
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(partial(serve, app, config, shutdown_trigger=stop.wait))  # type: ignore[arg-type]
        while not service.socket.exists():
            await trio.sleep(0.01)
        yield service
        stop.set()


@pytest.fixture(autouse=True)
def quick_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(codesdk.client, "RECONNECT_BACKOFF_S", 0.01)


async def _follow_async(socket: Path, **kwargs: Any) -> list[int]:
    async with AsyncClient(socket=socket, token="t") as client:
        return [event.seq async for event in client.stream(SESSION, **kwargs)]


def _follow_sync(socket: Path, **kwargs: Any) -> list[int]:
    with Client(socket=socket, token="t") as client:
        return [event.seq for event in client.stream(SESSION, **kwargs)]


async def _both(service: ScriptedService, **kwargs: Any) -> list[tuple[list[int], list[str]]]:
    """Each client's events and the ``Last-Event-ID`` of each of its connections, the script played anew for each."""
    async_seqs = await _follow_async(service.socket, **kwargs)
    async_resumed, service.resumed_from = service.resumed_from, []
    sync_seqs = await trio.to_thread.run_sync(partial(_follow_sync, service.socket, **kwargs))
    return [(async_seqs, async_resumed), (sync_seqs, service.resumed_from)]


async def test_a_stream_ended_by_the_service_is_resumed_where_it_left_off(scripted: ScriptedService) -> None:
    scripted.script = [[_event(1), _event(2), STORE_FAILING], [], [_event(2), _event(3), _event(4, terminal=True)]]
    with trio.fail_after(30):
        for seqs, resumed_from in await _both(scripted, until_terminal=True):
            assert seqs == [1, 2, 3, 4]  # no gap, nothing twice
            assert resumed_from == ["0", "2", "2"]  # after the error frame from 2, an empty answer, then the rest


async def test_a_stream_that_keeps_failing_ends_in_the_services_error(scripted: ScriptedService) -> None:
    scripted.script = [[_event(1), STORE_FAILING], [STORE_FAILING]]
    fruitless = codesdk.client.MAX_RECONNECTS + 1
    with trio.fail_after(30):
        async with AsyncClient(socket=scripted.socket, token="t") as client:
            seen: list[int] = []
            with pytest.raises(ApiError) as failed:
                async for event in client.stream(SESSION):
                    seen.append(event.seq)
        assert seen == [1] and scripted.resumed_from == ["0"] + ["1"] * fruitless
        scripted.resumed_from = []
        with pytest.raises(ApiError) as failed_sync:
            await trio.to_thread.run_sync(partial(_follow_sync, scripted.socket))
        assert scripted.resumed_from == ["0"] + ["1"] * fruitless
    for error in (failed.value, failed_sync.value):
        assert (error.status, error.code) == (503, "store_failing") and "database is away" in error.message


async def test_progress_starts_the_count_of_fruitless_connections_again(scripted: ScriptedService) -> None:
    many = codesdk.client.MAX_RECONNECTS * 2
    scripted.script = [[_event(n), STORE_FAILING] for n in range(1, many + 1)] + [[_event(many + 1, terminal=True)]]
    with trio.fail_after(30):
        for seqs, resumed_from in await _both(scripted, until_terminal=True):
            assert seqs == list(range(1, many + 2)) and len(resumed_from) == many + 1


async def test_a_stream_that_ends_without_a_word_is_lost_after_the_reconnects(scripted: ScriptedService) -> None:
    scripted.script = [[]]
    with trio.fail_after(30):
        async with AsyncClient(socket=scripted.socket, token="t") as client:
            with pytest.raises(ApiError) as failed:
                [event async for event in client.stream(SESSION)]
    assert failed.value.code == "stream_lost" and "without a new event" in failed.value.message
    assert len(scripted.resumed_from) == codesdk.client.MAX_RECONNECTS + 1


async def test_following_a_service_that_is_not_there_fails_at_once(tmp_path: Path) -> None:
    with trio.fail_after(30):
        with pytest.raises(ServiceUnreachable, match="is `codesdk-supervisor serve` running there"):
            await _follow_async(tmp_path / "nobody.sock")
    # (the sync client takes the same path; not driven here, as its HTTP library leaves the socket of a failed
    # unix connect to the garbage collector, which pytest reports as a warning of whichever test comes next)


async def test_following_one_task_passes_over_another_tasks_end(scripted: ScriptedService) -> None:
    """The end of a task left running by a supervisor that is gone may be stored just before the new task starts
    (the namespace taken over): following the new task goes past it, up to the new task's own end."""
    scripted.script = [[_event(1, terminal=True, task="t-orphan")],  # the service's until_terminal ends here
                       [_event(2, task="t-new"), _event(3, terminal=True, task="t-new")]]
    with trio.fail_after(30):
        for seqs, resumed_from in await _both(scripted, until_terminal=True, task_id="t-new"):
            assert seqs == [2, 3] and resumed_from == ["0", "1"]
