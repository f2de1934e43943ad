"""Worker lifecycle and fault behaviour, against real processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import trio

from protocol import ErrorCode, ErrorResponse, EventType, Method
from supervisor.workers import RpcError, WorkerBroken

from .harness import running_worker


async def test_shutdown_acks_then_exits_zero(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with running_worker(tmp_path) as h:
            assert await h.request(Method.SHUTDOWN) == {"ok": True}
            status = await h.worker.wait_exit()
            assert (status.exit_code, status.signal) == (0, None)
            assert not psutil.pid_exists(h.worker.pid) or psutil.Process(h.worker.pid).status() == "zombie"


async def test_stdin_eof_stops_in_flight_tasks_and_exits_zero(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with running_worker(tmp_path) as h:
            await h.start_task("t1", "hang")
            await h.next_event("t1", lambda e: e.event.type == EventType.MODEL_OUTPUT_COMPLETED)
            await h.conn.close_input()
            events = await h.until_terminal("t1")
            assert events[-1].event.type == EventType.TASK_STOPPED
            assert events[-1].event.payload.reason == "worker shutting down"
            status = await h.worker.wait_exit()
            assert status.exit_code == 0


async def test_requests_before_initialize_are_refused(tmp_path: Path) -> None:
    with trio.fail_after(30):
        env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "LANG": "C.UTF-8"}
        from supervisor.workers import worker_argv

        line = b'{"jsonrpc":"2.0","id":1,"method":"runtime.startTask","params":{}}\n'
        result = await trio.run_process(worker_argv(), stdin=line, capture_stdout=True, capture_stderr=True,
                                        env=env, check=False)
        assert result.returncode == 0
        assert b'"code":-32002' in result.stdout and b"runtime.initialize first" in result.stdout


async def test_protocol_version_mismatch_is_refused(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with running_worker(tmp_path) as h:
            with pytest.raises(RpcError) as err:
                await h.request(Method.INITIALIZE, {"protocol_version": "2.0"})
            assert err.value.code == ErrorCode.PROTOCOL_VERSION_MISMATCH


async def test_oversized_request_frame_is_rejected_and_worker_keeps_serving(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with running_worker(tmp_path, "--max-frame-bytes", "65536") as h:
            big = b'{"jsonrpc":"2.0","id":"big","method":"runtime.stop","params":{"task_id":"' + b"x" * 200_000 + b'"}}\n'
            await h.conn.send_raw(big)
            reply = await h.conn.wait_unmatched(None)
            assert isinstance(reply, ErrorResponse) and reply.error.code == ErrorCode.FRAME_TOO_LARGE
            data = reply.error.data
            assert isinstance(data, dict) and isinstance(data["detail"], str) and "65536" in data["detail"]
            await h.start_task("after", "echo")
            assert (await h.until_terminal("after"))[-1].event.type == EventType.TASK_COMPLETED


@pytest.mark.parametrize(("scenario", "exit_code", "sig"), [("crash-exit", 3, None), ("crash-signal", None, 9)])
async def test_runtime_crash_ends_the_worker_with_its_status(tmp_path: Path, scenario: str,
                                                             exit_code: int | None,
                                                              sig: int | None) -> None:
    with trio.fail_after(30):
        async with running_worker(tmp_path) as h:
            await h.start_task("t1", scenario)
            with pytest.raises(AssertionError, match="output ended"):
                await h.until_terminal("t1")
            # Everything emitted before the crash was flushed first.
            assert EventType.MODEL_OUTPUT_COMPLETED in [e.event.type for e in h.by_task["t1"]]
            status = await h.worker.wait_exit()
            assert (status.exit_code, status.signal) == (exit_code, sig)
            assert "crashing on purpose" in h.worker.stderr.text()
            with pytest.raises(WorkerBroken):
                await h.request(Method.STOP, {"task_id": "t1"})


async def test_flood_arrives_complete_and_in_order(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with running_worker(tmp_path) as h:
            await h.start_task("t1", "flood")
            events = await h.until_terminal("t1")
    assert len(events) == 20_000 + 2
    assert [e.n for e in events] == list(range(1, len(events) + 1))
    assert h.conn.stats.violations == 0


@pytest.mark.parametrize(("scenario", "kind"), [("malformed-line", "bad_frame"), ("oversized-line", "bad_frame")])
async def test_bad_lines_from_the_worker_are_counted_not_fatal(tmp_path: Path, scenario: str, kind: str) -> None:
    with trio.fail_after(60):
        async with running_worker(tmp_path) as h:
            await h.start_task("t1", scenario)
            events = await h.until_terminal("t1")
            texts = [e.event.payload.text for e in events if e.event.type == EventType.MODEL_OUTPUT_COMPLETED]
            assert texts == ["before", "after"]
            assert events[-1].event.type == EventType.TASK_COMPLETED
            assert h.conn.stats.violations == 1
            assert h.conn.stats.recent_violations[-1].kind == kind


def test_stray_output_never_reaches_the_protocol_stream() -> None:
    program = (
        "import os, sys\n"
        "from worker.main import _claim_stdout\n"
        "fd = _claim_stdout()\n"
        "print('stray print')\n"
        "sys.stdout.flush()\n"
        "os.write(1, b'stray write to fd 1\\n')\n"
        "os.write(fd, b'{\"protocol\":true}\\n')\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, timeout=30, check=True)
    assert done.stdout == b'{"protocol":true}\n'
    assert b"stray print" in done.stderr and b"stray write to fd 1" in done.stderr


async def test_stopping_a_flood_leaves_no_ordinal_gap(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with running_worker(tmp_path) as h:
            await h.start_task("t1", "flood")
            await h.next_event("t1", lambda e: e.n == 200)
            await h.request(Method.STOP, {"task_id": "t1", "reason": "enough"})
            events = await h.until_terminal("t1")
    assert [e.n for e in events] == list(range(1, len(events) + 1))
    assert events[-1].event.type == EventType.TASK_STOPPED and len(events) < 20_002
