"""Frames, worker side: a real codesdk-worker fed hostile stdin answers each bad line and keeps serving.

An error about a line that is a JSON object with a readable id carries that id; only a line whose id cannot
be read is answered with ``"id": null`` (JSON-RPC 2.0, section 5).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from codesdk.protocol import ErrorCode, EventType, Method, Request, encode_message
from codesdk.testing import WorkerDriver, open_worker
from codesdk.worker.client import VIOLATIONS_KEPT, RpcError, worker_argv
from tests.reliability.hostile_traps import TRAPS

FRAME_LIMIT = 4096


def _auth_request(request_id: str) -> bytes:
    return encode_message(Request(id=request_id, method=Method.GET_AUTH_STATUS, params={"runtime": "scripted"}))


async def _reply(worker: WorkerDriver, request_id: str | None) -> dict[str, Any]:
    return (await worker.answer_to(request_id)).to_json_obj()


async def _still_serving(worker: WorkerDriver) -> None:
    task = await worker.start_task(scenario="echo")
    assert (await task.until_terminal())[-1].event.type == EventType.TASK_COMPLETED


async def test_every_trap_gets_its_json_rpc_error_and_the_worker_keeps_serving(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with open_worker(home=tmp_path) as worker:
            for index, trap in enumerate(TRAPS):
                await worker.send_raw(trap.line + b"\n" + _auth_request(f"after-{index}"))
                reply = await _reply(worker, "r7" if trap.echoes_id else None)
                assert reply["error"]["code"] == trap.code, (trap.name, reply)
                answered = await _reply(worker, f"after-{index}")
                assert answered["result"]["state"] == "not_required", trap.name
            await _still_serving(worker)
            assert list(worker.process.connection.unmatched) == []  # every reply was accounted for, none extra


async def test_a_request_written_one_byte_at_a_time_is_served(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with open_worker(home=tmp_path) as worker:
            line = _auth_request("bytewise")
            for index in range(len(line)):
                await worker.send_raw(line[index:index + 1])
            assert (await _reply(worker, "bytewise"))["result"]["state"] == "not_required"


async def test_many_requests_in_one_chunk_are_each_answered(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with open_worker(home=tmp_path) as worker:
            ids = [f"m{n}" for n in range(VIOLATIONS_KEPT)]  # replies by raw id are kept up to this many
            await worker.send_raw(b"".join(_auth_request(i) for i in ids))
            for request_id in ids:
                assert (await _reply(worker, request_id))["result"]["state"] == "not_required"


def _start_task_line(request_id: str, task_id: str, padding: int) -> bytes:
    """A startTask request whose prompt pads it to about ``padding`` bytes (over the limit: never executed)."""
    request = Request(id=request_id, method=Method.START_TASK, params={
        "runtime": "scripted", "session": {"session_id": f"s-{task_id}"}, "task_id": task_id,
        "messages": [{"role": "user", "blocks": [{"type": "text", "text": "p" * padding}]}]})
    return encode_message(request)


async def test_an_oversized_request_is_refused_unread_between_two_that_are_served(tmp_path: Path) -> None:
    """A valid frame, an over-long one and a valid one in one chunk: only the middle one is lost."""
    with trio.fail_after(30):
        async with open_worker(worker_argv("--max-frame-bytes", str(FRAME_LIMIT)), home=tmp_path) as worker:
            await worker.send_raw(_auth_request("before") + _start_task_line("big", "t-big", 4 * FRAME_LIMIT)
                                  + _auth_request("after"))
            assert (await _reply(worker, "before"))["result"]["state"] == "not_required"
            refused = await _reply(worker, None)
            assert refused["error"]["code"] == ErrorCode.FRAME_TOO_LARGE
            assert (await _reply(worker, "after"))["result"]["state"] == "not_required"
            with pytest.raises(RpcError) as err:  # the over-long startTask never ran
                await worker.request(Method.STOP, {"task_id": "t-big"})
            assert err.value.code == ErrorCode.UNKNOWN_TASK
            await _still_serving(worker)


async def test_an_oversized_request_is_refused_before_its_newline_arrives(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with open_worker(worker_argv("--max-frame-bytes", str(FRAME_LIMIT)), home=tmp_path) as worker:
            line = _start_task_line("big", "t-big", 4 * FRAME_LIMIT)
            await worker.send_raw(line[:-1])  # everything but the newline
            assert (await _reply(worker, None))["error"]["code"] == ErrorCode.FRAME_TOO_LARGE
            await worker.send_raw(b"more of the same line, still discarded\n" + _auth_request("next"))
            assert (await _reply(worker, "next"))["result"]["state"] == "not_required"
            assert list(worker.process.connection.unmatched) == []  # the rest of the long line drew no second reply
            await _still_serving(worker)


async def test_a_request_torn_by_the_supervisor_closing_its_pipe_is_answered_and_the_worker_exits_cleanly(
        tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with open_worker(home=tmp_path) as worker:
            line = _auth_request("torn")
            await worker.send_raw(line[: len(line) // 2])
            await worker.close_input()
            reply = await _reply(worker, None)
            assert reply["error"]["code"] == ErrorCode.PARSE_ERROR
            assert (await worker.wait_exit()).exit_code == 0
