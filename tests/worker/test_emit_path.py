"""The worker's emit path (issue 35): a flood's lines leave in few writes, a lone line leaves at once, a slow reader
still holds the emitter back, and the line built from parts is byte for byte ``protocol.encode_event``'s."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from codesdk.protocol import (
    AuthState,
    AuthStatus,
    EventType,
    ExecutedBy,
    ModelOutputDelta,
    RuntimeCapabilities,
    RuntimeInfo,
    StartTaskParams,
    ToolCallRequested,
    WorkerEvent,
    canonical_hash,
    encode_event,
)
from codesdk.worker._event_line import event_line, runtime_json, task_json
from codesdk.worker.adapters.base import AdapterRegistry, RuntimeAdapter, TaskHandle, TaskIO, TaskOutcome
from codesdk.worker.server import OUTGOING_BUFFER_LINES, WorkerServer


class _Emitter(TaskHandle):
    """Emits ``count`` deltas (counting them in ``emitted``), then waits for ``release`` before it completes."""

    def __init__(self, io: TaskIO, count: int, release: trio.Event) -> None:
        self.io, self.count, self.release, self.emitted = io, count, release, 0

    async def run(self) -> TaskOutcome:
        for index in range(self.count):
            await self.io.emit(EventType.MODEL_OUTPUT_DELTA, ModelOutputDelta(block_id="b", delta="d", index=index))
            self.emitted += 1
        await self.release.wait()
        return TaskOutcome.success()

    def send_tool_result(self, tool_call_id: str, result: Any, is_error: bool = False) -> None:
        raise AssertionError("no tools here")

    def send_tool_denied(self, tool_call_id: str, reason: str) -> None:
        raise AssertionError("no tools here")

    def stop(self, reason: str | None) -> None:
        pass


class _Adapter(RuntimeAdapter):
    name = "emitter"

    def __init__(self, count: int, handle_class: type[_Emitter] = _Emitter) -> None:
        self.count, self.release, self.handle_class = count, trio.Event(), handle_class
        self.handle: _Emitter | None = None

    def capabilities(self) -> RuntimeCapabilities:
        return RuntimeCapabilities(name=self.name, version="1", requires_auth=False)

    async def auth_status(self) -> AuthStatus:
        return AuthStatus(runtime=self.name, state=AuthState.NOT_REQUIRED, method="none", message="none needed")

    def start_task(self, params: StartTaskParams, io: TaskIO) -> TaskHandle:
        self.handle = self.handle_class(io, self.count, self.release)
        return self.handle


class _Output(trio.abc.SendStream):
    """Records each write; writes wait while ``gate`` is not set (a supervisor that does not read)."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.gate = trio.Event()
        self.gate.set()

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.gate.wait()
        self.writes.append(bytes(data))

    async def wait_send_all_might_not_block(self) -> None:
        await self.gate.wait()

    async def aclose(self) -> None:
        pass

    def lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for write in self.writes for line in write.splitlines()]

    def events(self) -> list[dict[str, Any]]:
        return [line["params"] for line in self.lines() if line.get("method") == "runtime.event"]


_REQUESTS = (b'{"jsonrpc":"2.0","id":1,"method":"runtime.initialize","params":{"protocol_version":"1.0"}}\n'
             b'{"jsonrpc":"2.0","id":2,"method":"runtime.startTask","params":{"runtime":"emitter",'
             b'"session":{"session_id":"s"},"task_id":"t"}}\n')


async def _serve(adapter: _Adapter, output: _Output, check: Any) -> None:
    registry = AdapterRegistry()
    registry.add(adapter)
    server = WorkerServer(registry, output)
    send, receive = trio.testing.memory_stream_one_way_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.serve, receive)
        await send.send_all(_REQUESTS)
        await check(server)
        adapter.release.set()
        await trio.testing.wait_all_tasks_blocked()
        await send.aclose()


async def _serve_until_emitted(adapter: _Adapter, output: _Output, count: int) -> None:
    """Serve the adapter's task until it has emitted ``count`` events (and then to its end)."""
    async def check(server: WorkerServer) -> None:
        while adapter.handle is None or adapter.handle.emitted < count:
            await trio.testing.wait_all_tasks_blocked()

    with trio.fail_after(60):
        await _serve(adapter, output, check)


async def test_a_flood_leaves_in_few_writes_in_order() -> None:
    count = 5_000
    adapter, output = _Adapter(count), _Output()
    await _serve_until_emitted(adapter, output, count)
    events = output.events()
    assert [e["n"] for e in events] == list(range(1, count + 2))
    assert events[-1]["event"]["type"] == "task.completed"
    flood_writes = [w for w in output.writes if b'"model.output.delta"' in w]
    assert len(flood_writes) <= count // 50, f"{len(flood_writes)} writes for {count} lines"


async def test_a_lone_event_is_written_before_the_next_one_is_emitted() -> None:
    adapter, output = _Adapter(1), _Output()

    async def check(server: WorkerServer) -> None:
        # the task emitted one line and now waits (for release): the line is out without anything else happening
        while not any(b'"model.output.delta"' in w for w in output.writes):
            await trio.testing.wait_all_tasks_blocked()
        assert adapter.handle is not None and adapter.handle.emitted == 1
        assert not adapter.release.is_set()

    with trio.fail_after(30):
        await _serve(adapter, output, check)
    assert [e["n"] for e in output.events()] == [1, 2]


async def test_a_reader_that_does_not_read_holds_the_emitter_back() -> None:
    count = 20_000
    adapter, output = _Adapter(count), _Output()

    output.gate = trio.Event()  # the supervisor does not read

    async def check(server: WorkerServer) -> None:
        await trio.testing.wait_all_tasks_blocked()
        assert adapter.handle is not None
        held = adapter.handle.emitted
        assert held < count, "the emitter was never held back"
        written = len([line for w in output.writes for line in w.splitlines()])
        assert held - written <= 2 * OUTGOING_BUFFER_LINES + 1  # queued + one batch in the writer, no more
        output.gate.set()
        while adapter.handle.emitted < count:
            await trio.testing.wait_all_tasks_blocked()

    with trio.fail_after(60):
        await _serve(adapter, output, check)
    assert [e["n"] for e in output.events()] == list(range(1, count + 2))


_TIMES = st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC))
_RUNTIMES = st.builds(RuntimeInfo, name=st.sampled_from(["scripted", "claude"]),
                      runtime_session_id=st.none() | st.text(max_size=8), model=st.none() | st.text(max_size=8))
_JSON = st.recursive(st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1) | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
                     max_leaves=8)


@settings(max_examples=200, deadline=None)
@given(task_id=st.text(min_size=1, max_size=12), n=st.integers(1, 2**40), time=_TIMES, runtime=_RUNTIMES,
       delta=st.text(max_size=20), index=st.integers(0, 2**31))
def test_the_line_from_parts_is_encode_events_line_for_a_delta(task_id: str, n: int, time: datetime,
                                                               runtime: RuntimeInfo, delta: str,
                                                               index: int) -> None:
    payload = ModelOutputDelta(block_id="b", delta=delta, index=index)
    event = WorkerEvent(type=EventType.MODEL_OUTPUT_DELTA, time=time, runtime=runtime, payload=payload)
    try:
        expected = encode_event(task_id, n, event)
    except ValueError:  # unencodable (a lone surrogate): the fast path must refuse it too, and so it does
        try:
            event_line(task_json(task_id), n, EventType.MODEL_OUTPUT_DELTA, time, runtime_json(runtime), payload)
        except ValueError:
            return
        raise AssertionError("the fast path encoded what encode_event refused") from None
    assert event_line(task_json(task_id), n, EventType.MODEL_OUTPUT_DELTA, time, runtime_json(runtime),
                      payload) == expected


@settings(max_examples=100, deadline=None)
@given(time=_TIMES, runtime=_RUNTIMES, tool_input=st.dictionaries(st.text(max_size=6), _JSON, max_size=4))
def test_the_line_from_parts_is_encode_events_line_for_a_tool_call(time: datetime, runtime: RuntimeInfo,
                                                                   tool_input: dict[str, Any]) -> None:
    payload = ToolCallRequested(tool_call_id="c", runtime_tool_call_id="c", input_hash=canonical_hash(tool_input),
                                tool_name="workspace.read", input=tool_input, executed_by=ExecutedBy.SUPERVISOR)
    event = WorkerEvent(type=EventType.TOOL_CALL_REQUESTED, time=time, runtime=runtime, payload=payload)
    try:
        expected = encode_event("t", 7, event)
    except ValueError:
        return
    assert event_line(task_json("t"), 7, EventType.TOOL_CALL_REQUESTED, time, runtime_json(runtime),
                      payload) == expected


async def test_a_cancelled_put_has_queued_nothing() -> None:
    from codesdk.worker._outgoing import OutgoingLines

    queue = OutgoingLines(2)
    await queue.put(b"1\n")
    await queue.put(b"2\n")
    with trio.move_on_after(0) as waited:  # full: parks, and is cancelled while parked
        await queue.put(b"3\n")
    assert waited.cancelled_caught and len(queue) == 2
    with trio.CancelScope() as scope:  # cancelled before it is called: raises before queuing, though there is room
        scope.cancel()
        await queue.take(1 << 16)
        await queue.put(b"4\n")
    assert len(queue) == 0
    queue.close()
    assert await queue.take(1 << 16) == ([], None)


class _TwoEmitters(_Emitter):
    """Emits from two child tasks at once: ordinals stay gapless and the lines leave in ordinal order."""

    async def run(self) -> TaskOutcome:
        async def half(block: str) -> None:
            for index in range(self.count // 2):
                await self.io.emit(EventType.MODEL_OUTPUT_DELTA,
                                   ModelOutputDelta(block_id=block, delta="d", index=index))
                self.emitted += 1
                if index % 7 == 0:
                    await trio.sleep(0)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(half, "a")
            nursery.start_soon(half, "b")
        await self.release.wait()
        return TaskOutcome.success()


async def test_concurrent_emitters_of_one_task_keep_ordinals_in_order() -> None:
    count = 3_000
    adapter, output = _Adapter(count, _TwoEmitters), _Output()
    await _serve_until_emitted(adapter, output, count)
    events = output.events()
    assert [e["n"] for e in events] == list(range(1, count + 2))
    for block in ("a", "b"):
        assert [e["event"]["payload"]["index"] for e in events if e["event"]["payload"].get("block_id") == block] \
            == list(range(count // 2))
