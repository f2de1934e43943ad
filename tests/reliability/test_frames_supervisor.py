"""Frames, supervisor side: whatever a worker writes, the supervisor only counts it and keeps serving.

First the connection alone over in-memory streams (fast enough for hypothesis), then against a real
hostile peer process (hostile_worker.py), then the engine with a real worker torn mid-write by SIGKILL.
"""

from __future__ import annotations

import base64
import logging
import signal
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from functools import partial
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from codesdk.protocol import (
    ErrorObject,
    ErrorResponse,
    EventType,
    MessageReader,
    Method,
    ModelOutputCompleted,
    Notification,
    Request,
    Response,
    RuntimeEventParams,
    TaskFailed,
    encode_message,
)
from codesdk.supervisor.engine import Engine, session_events
from codesdk.supervisor.store import TaskState
from codesdk.testing import WorkerDriver, WorkerOutputEnded, open_worker
from codesdk.testing.invariants import check_session
from codesdk.worker.client import WorkerBroken, WorkerConnection
from tests.conftest import MakeEngine
from tests.e2e.conftest import worker_of
from tests.reliability.hostile_traps import TRAPS

HOSTILE_WORKER = Path(__file__).with_name("hostile_worker.py")
SMALL_FRAME_LIMIT = 4096


def _event_obj(n: int, *, time: str = "2026-01-01T00:00:00Z", raw: Any = None, **changes: Any) -> dict[str, Any]:
    event: dict[str, Any] = {"type": "model.output.delta", "time": time, "runtime": {"name": "hostile"},
                             "payload": {"block_id": "t1:b1", "delta": f"d{n}", "index": n - 1}}
    if raw is not None:
        event["raw"] = raw
    event.update(changes)
    return {"task_id": "t1", "n": n, "event": event}


def _event_line(n: int) -> bytes:
    return encode_message(Notification(method=Method.EVENT, params=_event_obj(n)))


def _expected(n: int) -> RuntimeEventParams:
    return RuntimeEventParams.model_validate(_event_obj(n))


def _deep(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = [value]
    return value


# -- the connection alone, over in-memory pipes -----------------------------------------------------


class _FakePeer:
    """The worker's end of a WorkerConnection: reads its requests, writes whatever the test says."""

    def __init__(self, requests: trio.abc.ReceiveStream, output: trio.abc.SendStream) -> None:
        self._requests = requests
        self._reader = MessageReader()
        self._pending: list[Request] = []
        self.output = output

    async def next_request(self) -> Request:
        while not self._pending:
            chunk = await self._requests.receive_some()
            self._pending += [m for m in self._reader.feed(chunk) if isinstance(m, Request)]
        return self._pending.pop(0)


@asynccontextmanager
async def _connection(max_frame_bytes: int = SMALL_FRAME_LIMIT) -> AsyncIterator[tuple[WorkerConnection, _FakePeer]]:
    to_worker_send, to_worker_receive = trio.testing.memory_stream_one_way_pair()
    from_worker_send, from_worker_receive = trio.testing.memory_stream_one_way_pair()
    connection = WorkerConnection(to_worker_send, from_worker_receive, max_frame_bytes, name="fake-worker")
    async with trio.open_nursery() as nursery:
        await nursery.start(connection.run_reader)
        yield connection, _FakePeer(to_worker_receive, from_worker_send)
        await from_worker_send.aclose()


async def _ask_while_peer_writes(connection: WorkerConnection, peer: _FakePeer,
                                 write: Callable[[int], bytes], cuts: Sequence[int] = ()) -> Any:
    """Send a request; the peer answers it after writing ``write(request_id)``, cut into pieces at ``cuts``."""
    answer: dict[str, Any] = {}

    async def ask() -> None:
        answer["result"] = await connection.request("hostile.ping", {})

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ask)
        request = await peer.next_request()
        assert isinstance(request.id, int)
        data = write(request.id)
        points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
        for start, end in pairwise(points):
            await peer.output.send_all(data[start:end])
    return answer["result"]


def _drain(connection: WorkerConnection) -> list[RuntimeEventParams]:
    out = []
    while True:
        try:
            out.append(connection.events.receive_nowait().model())
        except trio.WouldBlock:
            return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300), st.lists(st.integers(0, 2000), max_size=8))
def test_the_reader_survives_any_bytes_and_still_answers_the_next_request(garbage: bytes, cuts: list[int]) -> None:
    """Any bytes from a worker are violations at worst: the reader never raises, and the frames after them work."""

    async def main() -> None:
        with trio.fail_after(10):
            async with _connection(max_frame_bytes=64) as (connection, peer):
                result = await _ask_while_peer_writes(connection, peer, lambda request_id: (
                    garbage + b"\n" + encode_message(Response(id=request_id, result="pong"))),
                    cuts)
                assert result == "pong"
                from_garbage = MessageReader(64).feed(garbage + b"\n")
                assert connection.stats.violations == len(from_garbage)
                assert _drain(connection) == []

    trio.run(main)


_HOSTILE_MESSAGES: list[tuple[str, str, bytes]] = [
    ("unknown_notification", "unknown_notification",
     encode_message(Notification(method="runtime.log", params={"line": "hi"}))),
    ("request_from_the_worker", "unexpected_request", encode_message(Request(id=5, method="runtime.startTask"))),
    ("response_to_nobody", "unmatched_response", encode_message(Response(id=999_999, result=1))),
    ("error_without_id", "error_without_id",
     encode_message(ErrorResponse(id=None, error=ErrorObject(code=-32700, message="Parse error")))),
    ("event_of_unknown_type", "invalid_event",
     encode_message(Notification(method=Method.EVENT, params=_event_obj(1, type="model.output.sneeze")))),
    ("supervisor_only_event", "invalid_event",
     encode_message(Notification(method=Method.EVENT, params=_event_obj(1, type="task.started")))),
    ("event_with_naive_time", "invalid_event",
     encode_message(Notification(method=Method.EVENT, params=_event_obj(1, time="2026-01-01T00:00:00")))),
    # These two made the UTC normalization raise OverflowError, which killed the reader (and the supervisor).
    ("event_time_before_year_one_in_utc", "invalid_event",
     encode_message(Notification(method=Method.EVENT, params=_event_obj(1, time="0001-01-01T00:00:00+14:00")))),
    ("event_time_after_year_9999_in_utc", "invalid_event",
     encode_message(Notification(method=Method.EVENT, params=_event_obj(1, time="9999-12-31T23:59:59-14:00")))),
    ("event_params_as_a_list", "invalid_event", encode_message(Notification(method=Method.EVENT, params=[1, 2]))),
    ("event_with_an_extra_member", "invalid_event",
     encode_message(Notification(method=Method.EVENT, params={**_event_obj(1), "extra": True}))),
    # Validates, but is nested past what the models can serialize: it used to reach the engine and break there.
    ("event_nested_too_deep_to_store", "bad_frame",
     encode_message(Notification(method=Method.EVENT, params=_event_obj(1, raw=_deep(250))))),
]


@pytest.mark.parametrize(("kind", "message"), [(k, m) for _, k, m in _HOSTILE_MESSAGES],
                         ids=[name for name, _, _ in _HOSTILE_MESSAGES])
async def test_a_well_framed_hostile_message_is_one_violation_and_the_next_event_arrives(
        kind: str, message: bytes) -> None:
    with trio.fail_after(10):
        async with _connection() as (connection, peer):
            result = await _ask_while_peer_writes(connection, peer, lambda request_id: (
                message + _event_line(2) + encode_message(Response(id=request_id, result="pong"))))
            assert result == "pong"
            assert [v.kind for v in connection.stats.recent_violations] == [kind]
            delivered = _drain(connection)
    assert delivered == [_expected(2)]
    for params in delivered:  # whatever reaches the engine can be stored
        params.to_json_obj()


# -- a real hostile peer process ----------------------------------------------------------------------


@asynccontextmanager
async def _hostile_worker(tmp_path: Path, max_frame_bytes: int = SMALL_FRAME_LIMIT) -> AsyncIterator[WorkerDriver]:
    async with open_worker([sys.executable, str(HOSTILE_WORKER)], home=tmp_path / "hostile-home",
                           max_frame_bytes=max_frame_bytes, name="hostile-worker") as worker:
        yield worker


async def _write(worker: WorkerDriver, data: bytes, *, bytewise: bool = False, then: str = "reply") -> Any:
    return await worker.request("hostile.write", {
        "data": base64.b64encode(data).decode(), "bytewise": bytewise, "then": then})


async def _write_ends_the_output(worker: WorkerDriver, data: bytes, then: str) -> None:
    """``_write`` with a ``then`` that ends the worker: the request fails as the supervisor sees it fail."""
    with pytest.raises(WorkerOutputEnded) as ended:
        await _write(worker, data, then=then)
    assert isinstance(ended.value.__cause__, WorkerBroken)


async def test_every_trap_from_a_worker_is_counted_and_the_connection_keeps_serving(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with _hostile_worker(tmp_path, max_frame_bytes=8 * 1024 * 1024) as worker:
            stats, events = worker.process.connection.stats, worker.task("t1")
            for n, trap in enumerate(TRAPS, start=1):
                before = stats.violations
                data = trap.line + b"\n" + _event_line(n)
                assert await _write(worker, data) == {"written": len(data)}, trap.name
                assert await events.next_event() == _expected(n), trap.name
                assert stats.violations == before + 1, trap.name
                assert stats.recent_violations[-1].kind == "bad_frame", trap.name
            assert await _write(worker, b"") == {"written": 0}  # still answering


async def test_frames_written_one_byte_at_a_time_arrive_intact(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with _hostile_worker(tmp_path) as worker:
            data = b"".join(_event_line(n) for n in (1, 2, 3))
            await _write(worker, data, bytewise=True)
            events = worker.task("t1")
            received = [await events.next_event() for _ in range(3)]
            assert received == [_expected(n) for n in (1, 2, 3)]
            assert worker.violations == []


async def test_thousands_of_frames_in_one_write_arrive_complete_and_in_order(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with _hostile_worker(tmp_path) as worker:
            count = 3000
            # the event buffer is bounded: this answer comes only because the driver takes events meanwhile
            await _write(worker, b"".join(_event_line(n) for n in range(1, count + 1)))
            events = worker.task("t1")
            received = [await events.next_event() for _ in range(count)]
            assert [p.n for p in received] == list(range(1, count + 1))
            assert received[-1] == _expected(count) and worker.violations == []


async def test_an_oversized_line_between_valid_frames_costs_only_itself(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with _hostile_worker(tmp_path) as worker:
            data = _event_line(1) + b'{"pad":"' + b"x" * (20 * SMALL_FRAME_LIMIT) + b'"}\n' + _event_line(2)
            assert await _write(worker, data) == {"written": len(data)}
            events = worker.task("t1")
            assert [await events.next_event() for _ in range(2)] == [_expected(1), _expected(2)]
            [violation] = worker.violations
            assert violation.kind == "bad_frame" and "too_large" in violation.detail


async def test_an_oversized_line_without_newline_at_exit_ends_the_stream_cleanly(tmp_path: Path) -> None:
    """A valid frame, then an over-long line the worker never finishes: the frame counts, the rest is cut off."""
    with trio.fail_after(30):
        async with _hostile_worker(tmp_path) as worker:
            await _write_ends_the_output(worker, _event_line(1) + b"y" * (5 * SMALL_FRAME_LIMIT), then="exit")
            assert await worker.until_output_ends() == [_expected(1)]
            assert (await worker.wait_exit()).exit_code == 0
            assert [v.kind for v in worker.violations] == ["bad_frame"]
            with pytest.raises(WorkerOutputEnded) as later:  # later requests fail at once, typed: nothing hangs
                await worker.request("hostile.write", {"data": ""})
            assert isinstance(later.value.__cause__, WorkerBroken)


async def test_a_frame_torn_by_sigkill_is_one_violation_and_fails_pending_requests(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with _hostile_worker(tmp_path) as worker:
            torn = _event_line(2)[: len(_event_line(2)) // 2]
            await _write_ends_the_output(worker, _event_line(1) + torn, then="sigkill")
            assert await worker.until_output_ends() == [_expected(1)]
            assert (await worker.wait_exit()).signal == signal.SIGKILL
            [violation] = worker.violations
            assert violation.kind == "bad_frame"


async def test_one_workers_garbage_does_not_disturb_another_worker(tmp_path: Path) -> None:
    """Two namespaces, two processes: one spews every trap byte by byte while the other runs a task."""
    garbage = b"".join(trap.line + b"\n" for trap in TRAPS if len(trap.line) < 10_000)
    with trio.fail_after(60):
        async with _hostile_worker(tmp_path, 8 * 1024 * 1024) as hostile, \
                open_worker(home=tmp_path / "home", name="bystander-worker") as real:
            async with trio.open_nursery() as both:
                both.start_soon(partial(_write, hostile, garbage, bytewise=True))
                task = await real.start_task("still here", scenario="echo")
                events = await task.until_terminal()
            assert events[-1].event.type == EventType.TASK_COMPLETED
            assert [e.n for e in events] == list(range(1, len(events) + 1))
            assert real.violations == []
            assert hostile.process.connection.stats.violations == garbage.count(b"\n")
            assert await _write(hostile, b"") == {"written": 0}


# -- the engine: a real worker torn mid-write by SIGKILL -----------------------------------------------


async def _wait_for_event(engine: Engine, session_id: str, event_type: EventType) -> None:
    async with engine.store.subscribe(session_id) as subscription:
        async for event in subscription:
            if event.type == event_type:
                return


async def test_a_frame_torn_by_a_killed_worker_fails_its_task_exactly_once_and_others_keep_serving(
        make_engine: MakeEngine) -> None:
    with trio.fail_after(60):
        async with make_engine() as engine:
            bystander = await engine.create_session(namespace="user:bystander")
            waiting = await engine.start_task(bystander.session_id, "x", runtime_config={"scenario": "hang"})
            await _wait_for_event(engine, bystander.session_id, EventType.MODEL_OUTPUT_COMPLETED)
            bystander_pid = worker_of(engine, "user:bystander").pid

            session = await engine.create_session()
            task = await engine.start_task(session.session_id, "x", runtime_config={"scenario": "torn-frame"})
            record = await engine.wait_task(task.task_id)
            events = await session_events(engine.store, session.session_id)
            check_session(events)
            failed = [e for e in events if e.type == EventType.TASK_FAILED]
            assert record.state == TaskState.FAILED and len(failed) == 1 and events[-1] is failed[0]
            payload = failed[0].payload
            assert isinstance(payload, TaskFailed)
            assert payload.code == "WORKER_CRASHED" and payload.details["signal"] == "SIGKILL"
            texts = [e.payload.text for e in events if isinstance(e.payload, ModelOutputCompleted)]
            assert texts == ["About to be torn."]  # everything before the tear was stored

            # The other namespace never noticed: same worker, and it still answers.
            assert worker_of(engine, "user:bystander").pid == bystander_pid
            await engine.stop_task(waiting.task_id)
            assert (await engine.wait_task(waiting.task_id)).state == TaskState.STOPPED
            again = await engine.start_task(bystander.session_id, "y", runtime_config={"scenario": "echo"})
            assert (await engine.wait_task(again.task_id)).state == TaskState.COMPLETED
            # And the crashed namespace gets a fresh worker for its next task.
            retry = await engine.start_task(session.session_id, "z", runtime_config={"scenario": "echo"})
            assert (await engine.wait_task(retry.task_id)).state == TaskState.COMPLETED
            check_session(await session_events(engine.store, session.session_id))



async def test_a_worker_writing_thousands_of_bad_lines_cannot_flood_the_log(
        caplog: pytest.LogCaptureFixture) -> None:
    """Each bad line is counted; only the first few per minute are logged one by one, the rest in one line."""
    from codesdk.worker.client import VIOLATION_LOGS_PER_WINDOW

    with trio.fail_after(60), caplog.at_level(logging.WARNING, logger="codesdk.supervisor.worker"):
        async with _connection() as (connection, peer):
            await peer.output.send_all(b"".join(b"garbage %d\n" % n for n in range(5000)))
            assert await _ask_while_peer_writes(connection, peer, lambda rid: encode_message(
                Response(id=rid, result="pong"))) == "pong"  # everything before the answer was read
            assert connection.stats.violations == 5000
    one_by_one = [r for r in caplog.records if "protocol violation (bad_frame)" in r.getMessage()]
    summaries = [r.getMessage() for r in caplog.records if "more protocol violations not logged" in r.getMessage()]
    assert len(one_by_one) == VIOLATION_LOGS_PER_WINDOW
    expected = (f"fake-worker: {5000 - VIOLATION_LOGS_PER_WINDOW} more protocol violations not logged one by one "
                "(5000 in all; the last 100 are kept)")
    assert summaries == [expected]
