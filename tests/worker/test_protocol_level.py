"""Protocol-level tests: a real codesdk-worker process, driven over its stdin/stdout pipes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from protocol import PROTOCOL_VERSION, ErrorCode, EventType, Method, RuntimeEventParams
from supervisor.workers import RpcError

from .harness import WorkerHarness, running_worker


def types(events: list[RuntimeEventParams]) -> list[str]:
    return [e.event.type.value for e in events]


async def test_initialize_reports_runtimes_and_pid(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with running_worker(tmp_path) as h:
            info = h.worker.info
            assert info is not None
            assert info.protocol_version == PROTOCOL_VERSION
            assert info.pid == h.worker.pid
            scripted = {r.name: r for r in info.runtimes}["scripted"]
            assert scripted.available and scripted.capabilities.parallel_tool_calls
            auth = await h.request(Method.GET_AUTH_STATUS, {"runtime": "scripted"})
            assert auth["state"] == "not_required"


async def test_streaming_task_events_are_ordered_and_complete(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with running_worker(tmp_path) as h:
            accepted = await h.start_task("t1", "echo", prompt="hello worker")
            assert accepted == {"accepted": True, "task_id": "t1", "runtime_session_id": "scripted-s-t1",
                                "implicit_sources": {"policy": "the scripted runtime loads nothing implicitly",
                                                     "found": []}}
            events = await h.until_terminal("t1")
    assert [e.n for e in events] == list(range(1, len(events) + 1))  # per-task ordinal, gap-free
    assert types(events)[0] == "runtime.request.started"
    assert types(events)[-1] == "task.completed"
    deltas = [e.event.payload for e in events if e.event.type == EventType.MODEL_OUTPUT_DELTA]
    assert len(deltas) > 1 and len({d.block_id for d in deltas}) == 1
    assert [d.index for d in deltas] == list(range(len(deltas)))
    completed = next(e.event.payload for e in events if e.event.type == EventType.MODEL_OUTPUT_COMPLETED)
    assert completed.text == "".join(d.delta for d in deltas) == "You said: hello worker"
    assert all(e.event.runtime.runtime_session_id == "scripted-s-t1" for e in events)


async def test_parallel_tool_calls_answered_out_of_order(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with running_worker(tmp_path) as h:
            await h.start_task("t1", "parallel-tools")
            first = await h.next_event("t1", lambda e: e.event.type == EventType.TOOL_CALL_REQUESTED)
            second = await h.next_event("t1", lambda e: e.event.type == EventType.TOOL_CALL_REQUESTED)
            assert first.event.type == second.event.type == EventType.TOOL_CALL_REQUESTED
            assert (first.event.payload.tool_call_id, second.event.payload.tool_call_id) == ("call_a", "call_b")
            # Both are outstanding at once; answer the second first.
            await h.request(Method.SEND_TOOL_RESULT, {"task_id": "t1", "tool_call_id": "call_b", "result": {"text": "BEE"}})
            # A second answer to the same call (or to an unknown one) is refused with a clear error.
            for call_id in ("call_b", "call_zzz"):
                with pytest.raises(RpcError) as err:
                    await h.request(Method.SEND_TOOL_RESULT, {"task_id": "t1", "tool_call_id": call_id, "result": 1})
                assert err.value.code == ErrorCode.UNKNOWN_TOOL_CALL
            await h.request(Method.SEND_TOOL_RESULT, {"task_id": "t1", "tool_call_id": "call_a", "result": {"text": "AYE"}})
            events = await h.until_terminal("t1")
    texts = [e.event.payload.text for e in events if e.event.type == EventType.MODEL_OUTPUT_COMPLETED]
    assert "a.txt says AYE and b.txt says BEE" in texts
    assert types(events)[-1] == "task.completed"
    requested = next(e.event.payload for e in events if e.event.type == EventType.TOOL_CALL_REQUESTED)
    assert requested.input == {"path": "a.txt"} and requested.input_hash.startswith("sha256:")


async def test_denial_takes_the_denied_branch(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with running_worker(tmp_path) as h:
            await h.start_task("t1", "write-or-deny")
            call = await h.next_event("t1", lambda e: e.event.type == EventType.TOOL_CALL_REQUESTED)
            assert call.event.type == EventType.TOOL_CALL_REQUESTED
            await h.request(Method.SEND_TOOL_DENIED, {"task_id": "t1", "tool_call_id": call.event.payload.tool_call_id,
                                                      "reason": "writes need approval"})
            events = await h.until_terminal("t1")
    texts = [e.event.payload.text for e in events if e.event.type == EventType.MODEL_OUTPUT_COMPLETED]
    assert texts[-1] == "Understood, I did not write the file: writes need approval"
    assert types(events)[-1] == "task.completed"


async def test_stop_ends_a_hanging_task_with_task_stopped(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with running_worker(tmp_path) as h:
            await h.start_task("t1", "hang")
            await h.next_event("t1", lambda e: e.event.type == EventType.MODEL_OUTPUT_COMPLETED)
            assert await h.request(Method.STOP, {"task_id": "t1", "reason": "user pressed stop"}) == {"ok": True}
            events = await h.until_terminal("t1")
            assert events[-1].event.type == EventType.TASK_STOPPED
            assert events[-1].event.payload.reason == "user pressed stop"
            with pytest.raises(RpcError) as err:  # the task is gone now
                await h.request(Method.STOP, {"task_id": "t1"})
            assert err.value.code == ErrorCode.UNKNOWN_TASK


async def test_stop_ignored_by_runtime_is_forced_after_grace(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with running_worker(tmp_path) as h:
            await h.start_task("t1", "ignore-stop", stop_grace_s=0.3)
            await h.next_event("t1", lambda e: e.event.type == EventType.MODEL_OUTPUT_DELTA)
            await h.request(Method.STOP, {"task_id": "t1"})
            events = await h.until_terminal("t1")
    assert events[-1].event.type == EventType.TASK_STOPPED
    assert EventType.TASK_COMPLETED not in [e.event.type for e in events]


async def test_concurrent_tasks_in_different_sessions(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with running_worker(tmp_path) as h:
            await h.start_task("t1", "hang", session_id="s1")
            await h.start_task("t2", "echo", session_id="s2", prompt="second")
            with pytest.raises(RpcError) as err:
                await h.start_task("t3", "echo", session_id="s1")
            assert err.value.code == ErrorCode.SESSION_BUSY
            assert err.value.data == {"active_task_id": "t1"}
            with pytest.raises(RpcError) as err:
                await h.start_task("t1", "echo", session_id="s9")
            assert err.value.code == ErrorCode.DUPLICATE_TASK
            events2 = await h.until_terminal("t2")
            assert events2[-1].event.type == EventType.TASK_COMPLETED
            await h.request(Method.STOP, {"task_id": "t1"})
            events1 = await h.until_terminal("t1")
            assert events1[-1].event.type == EventType.TASK_STOPPED


async def test_runtime_failure_is_reported_as_task_failed(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with running_worker(tmp_path) as h:
            await h.start_task("t1", "fail")
            events = await h.until_terminal("t1")
    failed = events[-1].event
    assert failed.type == EventType.TASK_FAILED
    assert (failed.payload.code, failed.payload.retryable) == ("RATE_LIMITED", True)
    assert failed.payload.details == {"status": 429}


def _answered_id(line: bytes, code: int) -> str | None:
    """The id an error carries: the request's whenever the line is a JSON object with a readable id; null when
    the line does not parse or is not an object (a batch)."""
    readable = b'"r7"' in line and not line.startswith(b"[") and code != ErrorCode.PARSE_ERROR
    return "r7" if readable else None


@pytest.mark.parametrize(
    ("line", "code"),
    [
        (b"{not json\n", ErrorCode.PARSE_ERROR),
        (b"\xff\xfe\n", ErrorCode.PARSE_ERROR),
        (b'{"jsonrpc":"2.0","id":1,"method":"a","params":{"x":NaN}}\n', ErrorCode.PARSE_ERROR),
        (b'[' * 50000 + b'\n', ErrorCode.PARSE_ERROR),
        (b'{"jsonrpc":"2.0","id":"r7"}\n', ErrorCode.INVALID_REQUEST),
        (b'{"jsonrpc":"1.0","id":"r7","method":"runtime.stop"}\n', ErrorCode.INVALID_REQUEST),
        (b'[{"jsonrpc":"2.0","id":"r7","method":"runtime.stop"}]\n', ErrorCode.INVALID_REQUEST),
        (b'{"jsonrpc":"2.0","id":"r7","method":"runtime.nope"}\n', ErrorCode.METHOD_NOT_FOUND),
        (b'{"jsonrpc":"2.0","id":"r7","method":"runtime.startTask","params":{"runtime":"scripted"}}\n',
         ErrorCode.INVALID_PARAMS),
        (b'{"jsonrpc":"2.0","id":"r7","method":"runtime.stop","params":["t1"]}\n', ErrorCode.INVALID_PARAMS),
        ((b'{"jsonrpc":"2.0","id":"r7","method":"runtime.startTask","params":{"runtime":"nope","session":'
          b'{"session_id":"s"},"task_id":"t"}}\n'), ErrorCode.UNKNOWN_RUNTIME),
        ((b'{"jsonrpc":"2.0","id":"r7","method":"runtime.startTask","params":{"runtime":"scripted","session":'
          b'{"session_id":"s"},"task_id":"t","runtime_config":{"scenario":"../etc/passwd"}}}\n'),
         ErrorCode.INVALID_SCENARIO),
        ((b'{"jsonrpc":"2.0","id":"r7","method":"runtime.startTask","params":{"runtime":"scripted","session":'
          b'{"session_id":"s"},"task_id":"t","runtime_config":{"stop_grace_s":-1}}}\n'),
         ErrorCode.INVALID_RUNTIME_CONFIG),
        ((b'{"jsonrpc":"2.0","id":"r7","method":"runtime.sendToolResult","params":{"task_id":"zz",'
          b'"tool_call_id":"c"}}\n'), ErrorCode.UNKNOWN_TASK),
    ],
)
async def test_bad_input_gets_the_right_error_and_the_worker_keeps_serving(
        tmp_path: Path, line: bytes, code: int) -> None:
    with trio.fail_after(30):
        async with running_worker(tmp_path) as h:
            await h.conn.send_raw(line)
            reply = await _raw_reply(h, _answered_id(line, code))
            assert reply["error"]["code"] == code, reply
            await h.start_task("after", "echo")  # still serving
            assert (await h.until_terminal("after"))[-1].event.type == EventType.TASK_COMPLETED


async def _raw_reply(h: WorkerHarness, request_id: str | None) -> dict[str, Any]:
    reply = await h.conn.wait_unmatched(request_id)
    return reply.to_json_obj()
