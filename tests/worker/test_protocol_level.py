"""Protocol-level tests: a real codesdk-worker process, driven over its stdin/stdout pipes."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from codesdk.testing import open_worker
from codesdk.protocol import (
    PROTOCOL_VERSION,
    DescribeEnvResult,
    ErrorCode,
    EventType,
    Message,
    Method,
    ModelInputAppended,
    RuntimeEventParams,
    RuntimeRequestStarted,
    canonical_hash,
)
from codesdk.worker.client import RpcError


def types(events: list[RuntimeEventParams]) -> list[str]:
    return [e.event.type.value for e in events]


async def test_initialize_reports_runtimes_and_pid(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with open_worker(home=tmp_path) as worker:
            info = worker.info
            assert info.protocol_version == PROTOCOL_VERSION
            assert info.pid == worker.pid
            scripted = {r.name: r for r in info.runtimes}["scripted"]
            assert scripted.available and scripted.capabilities.parallel_tool_calls
            auth = await worker.request(Method.GET_AUTH_STATUS, {"runtime": "scripted"})
            assert auth["state"] == "not_required"


async def test_streaming_task_events_are_ordered_and_complete(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with open_worker(home=tmp_path) as worker:
            task = await worker.start_task("hello worker", scenario="echo", task_id="t1", session_id="s-t1")
            sent = canonical_hash([Message.user_text("hello worker").to_json_obj()])
            assert task.accepted == {"accepted": True, "task_id": "t1", "runtime_session_id": "scripted-s-t1",
                                     "implicit_sources": {"policy": "the scripted runtime loads nothing implicitly",
                                                          "found": []}, "resume": "new", "sent_hash": sent}
            events = await task.until_terminal()
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
        async with open_worker(home=tmp_path) as worker:
            task = await worker.start_task(scenario="parallel-tools")
            first = await task.next_event(EventType.TOOL_CALL_REQUESTED)
            second = await task.next_event(EventType.TOOL_CALL_REQUESTED)
            assert first.event.type == second.event.type == EventType.TOOL_CALL_REQUESTED
            assert (first.event.payload.tool_call_id, second.event.payload.tool_call_id) == ("call_a", "call_b")
            # Both are outstanding at once; answer the second first.
            await task.send_result("call_b", {"text": "BEE"})
            # A second answer to the same call (or to an unknown one) is refused with a clear error.
            for call_id in ("call_b", "call_zzz"):
                with pytest.raises(RpcError) as err:
                    await task.send_result(call_id, 1)
                assert err.value.code == ErrorCode.UNKNOWN_TOOL_CALL
            await task.send_result("call_a", {"text": "AYE"})
            events = await task.until_terminal()
    texts = [e.event.payload.text for e in events if e.event.type == EventType.MODEL_OUTPUT_COMPLETED]
    assert "a.txt says AYE and b.txt says BEE" in texts
    assert types(events)[-1] == "task.completed"
    requested = next(e.event.payload for e in events if e.event.type == EventType.TOOL_CALL_REQUESTED)
    assert requested.input == {"path": "a.txt"} and requested.input_hash.startswith("sha256:")


async def test_denial_takes_the_denied_branch(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with open_worker(home=tmp_path) as worker:
            task = await worker.start_task(scenario="write-or-deny")
            call = await task.next_event(EventType.TOOL_CALL_REQUESTED)
            assert call.event.type == EventType.TOOL_CALL_REQUESTED
            await task.deny(call.event.payload.tool_call_id, "writes need approval")
            events = await task.until_terminal()
    texts = [e.event.payload.text for e in events if e.event.type == EventType.MODEL_OUTPUT_COMPLETED]
    assert texts[-1] == "Understood, I did not write the file: writes need approval"
    assert types(events)[-1] == "task.completed"


async def test_stop_ends_a_hanging_task_with_task_stopped(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with open_worker(home=tmp_path) as worker:
            task = await worker.start_task(scenario="hang")
            await task.next_event(EventType.MODEL_OUTPUT_COMPLETED)
            assert await task.stop("user pressed stop") == {"ok": True}
            events = await task.until_terminal()
            assert events[-1].event.type == EventType.TASK_STOPPED
            assert events[-1].event.payload.reason == "user pressed stop"
            with pytest.raises(RpcError) as err:  # the task is gone now
                await task.stop()
            assert err.value.code == ErrorCode.UNKNOWN_TASK


async def test_stop_ignored_by_runtime_is_forced_after_grace(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with open_worker(home=tmp_path) as worker:
            task = await worker.start_task(scenario="ignore-stop", runtime_config={"stop_grace_s": 0.3})
            await task.next_event(EventType.MODEL_OUTPUT_DELTA)
            await task.stop()
            events = await task.until_terminal()
    assert events[-1].event.type == EventType.TASK_STOPPED
    assert EventType.TASK_COMPLETED not in [e.event.type for e in events]


async def test_concurrent_tasks_in_different_sessions(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with open_worker(home=tmp_path) as worker:
            t1 = await worker.start_task(scenario="hang", task_id="t1", session_id="s1")
            t2 = await worker.start_task("second", scenario="echo", task_id="t2", session_id="s2")
            with pytest.raises(RpcError) as err:
                await worker.start_task(scenario="echo", task_id="t3", session_id="s1")
            assert err.value.code == ErrorCode.SESSION_BUSY
            assert err.value.data == {"active_task_id": "t1"}
            with pytest.raises(RpcError) as err:
                await worker.start_task(scenario="echo", task_id="t1", session_id="s9")
            assert err.value.code == ErrorCode.DUPLICATE_TASK
            events2 = await t2.until_terminal()
            assert events2[-1].event.type == EventType.TASK_COMPLETED
            await t1.stop()
            events1 = await t1.until_terminal()
            assert events1[-1].event.type == EventType.TASK_STOPPED


async def test_runtime_failure_is_reported_as_task_failed(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with open_worker(home=tmp_path) as worker:
            events = await (await worker.start_task(scenario="fail")).until_terminal()
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
        ((b'{"jsonrpc":"2.0","id":"r7","method":"runtime.startTask","params":{"runtime":"scripted","session":'
          b'{"session_id":"s"},"task_id":"t","runtime_config":{"stop_grace_s":1000000}}}\n'),
         ErrorCode.INVALID_RUNTIME_CONFIG),  # a stop waits out the grace: it may not hold a session for long
        ((b'{"jsonrpc":"2.0","id":"r7","method":"runtime.sendToolResult","params":{"task_id":"zz",'
          b'"tool_call_id":"c"}}\n'), ErrorCode.UNKNOWN_TASK),
    ],
)
async def test_bad_input_gets_the_right_error_and_the_worker_keeps_serving(
        tmp_path: Path, line: bytes, code: int) -> None:
    with trio.fail_after(30):
        async with open_worker(home=tmp_path) as worker:
            await worker.send_raw(line)
            reply = (await worker.answer_to(_answered_id(line, code))).to_json_obj()
            assert reply["error"]["code"] == code, reply
            after = await worker.start_task(scenario="echo")  # still serving
            assert (await after.until_terminal())[-1].event.type == EventType.TASK_COMPLETED


async def test_describe_env_names_what_each_runtime_would_load_and_looks_in_cwd_only_when_asked(
        tmp_path: Path) -> None:
    home, workspace = tmp_path / "home", tmp_path / "ws"
    (home / ".codex").mkdir(parents=True)
    (home / ".codex" / "AGENTS.md").write_text("user rules\n")
    workspace.mkdir()
    (workspace / "AGENTS.md").write_text("project rules\n")
    with trio.fail_after(30):
        async with open_worker(home=home) as worker:
            plain = DescribeEnvResult.model_validate(await worker.request(Method.DESCRIBE_ENV, {}))
            asked = DescribeEnvResult.model_validate(await worker.request(Method.DESCRIBE_ENV, {"cwd": str(workspace)}))
            with pytest.raises(RpcError) as err:
                await worker.request(Method.DESCRIBE_ENV, {"cwd": "relative/ws"})
            assert err.value.code == ErrorCode.INVALID_PARAMS and "absolute" in err.value.message
            assert await worker.request(Method.PING) == {"ok": True}  # still serving

    def found(answer: DescribeEnvResult, runtime: str) -> dict[str, tuple[str, bool]]:
        [entry] = [r for r in answer.runtimes if r.runtime == runtime]
        return {source.kind: (source.path, source.used) for source in entry.found}

    user = (str(home / ".codex" / "AGENTS.md"), False)
    assert found(plain, "codex") == {"user_instructions": user}
    assert found(asked, "codex") == {"user_instructions": user,
                                     "project_instructions": (str(workspace / "AGENTS.md"), False)}
    assert found(asked, "codex-acp")["user_instructions"] == (user[0], True)  # codex-acp loads it (recorded)
    assert found(asked, "scripted") == {}


async def test_an_input_sent_mid_turn_goes_into_the_next_request_and_is_reported(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with open_worker(home=tmp_path) as worker:
            info = {r.name: r for r in worker.info.runtimes}["scripted"]
            assert info.capabilities.steering == "mid_turn"
            task = await worker.start_task("fix the tests", scenario="steer")
            await task.next_event(EventType.RUNTIME_REQUEST_COMPLETED)  # it waits for the input now
            blocks = [{"type": "text", "text": "also update"}, {"type": "code", "code": "the docs"}]
            assert await task.send_input(blocks, "in-1") == {"input_id": "in-1", "delivery": "mid_turn"}
            events = await task.until_terminal()
            with pytest.raises(RpcError) as err:  # the task is over: it takes no more input
                await task.send_input("too late", "in-2")
            assert err.value.code == ErrorCode.UNKNOWN_TASK
    [payload] = [e.event.payload for e in events if isinstance(e.event.payload, ModelInputAppended)]
    assert (payload.input_id, payload.text, payload.delivery) == ("in-1", "also update\n\nthe docs", "mid_turn")
    assert payload.input_hash == canonical_hash(blocks)
    after = types(events)[types(events).index("model.input.appended") + 1]
    assert after == "runtime.request.started"
    started = events[types(events).index("model.input.appended") + 1].event.payload
    assert isinstance(started, RuntimeRequestStarted) and payload.before_request_id == started.request_id
    texts = [e.event.payload.text for e in events if e.event.type == EventType.MODEL_OUTPUT_COMPLETED]
    assert texts[-1] == "You added: also update\n\nthe docs"


async def test_a_bad_input_is_refused_naming_the_field(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with open_worker(home=tmp_path) as worker:
            task = await worker.start_task("go", scenario="hang")
            await task.next_event(EventType.MODEL_OUTPUT_COMPLETED)
            for bad in ("  ", [], [{"type": "tool_use", "tool_call_id": "x", "name": "y"}]):
                with pytest.raises(RpcError) as err:
                    await task.send_input(bad, "in-bad")
                assert err.value.code == ErrorCode.INVALID_PARAMS
                assert "input" in str(err.value.data)
            await task.send_input("fine", "in-1")
            with pytest.raises(RpcError) as err:  # an input id is used once
                await task.send_input("again", "in-1")
            assert err.value.code == ErrorCode.INVALID_PARAMS
            await task.stop()
            assert types(await task.until_terminal())[-1] == "task.stopped"
