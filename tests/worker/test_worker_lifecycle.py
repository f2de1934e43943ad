"""Worker lifecycle and fault behaviour, against real processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import trio

from codesdk.testing import WorkerOutputEnded, open_worker
from codesdk.protocol import ErrorCode, ErrorResponse, EventType, Method
from codesdk.worker.client import RpcError, WorkerBroken, worker_argv


async def test_shutdown_acks_then_exits_zero(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with open_worker(home=tmp_path) as worker:
            assert await worker.request(Method.SHUTDOWN) == {"ok": True}
            status = await worker.wait_exit()
            assert (status.exit_code, status.signal) == (0, None)
            assert not psutil.pid_exists(worker.pid) or psutil.Process(worker.pid).status() == "zombie"


async def test_stdin_eof_stops_in_flight_tasks_and_exits_zero(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with open_worker(home=tmp_path) as worker:
            task = await worker.start_task(scenario="hang")
            await task.next_event(EventType.MODEL_OUTPUT_COMPLETED)
            await worker.close_input()
            events = await task.until_terminal()
            assert events[-1].event.type == EventType.TASK_STOPPED
            assert events[-1].event.payload.reason == "worker shutting down"
            status = await worker.wait_exit()
            assert status.exit_code == 0


async def test_requests_before_initialize_are_refused(tmp_path: Path) -> None:
    with trio.fail_after(30):
        env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "LANG": "C.UTF-8"}
        line = b'{"jsonrpc":"2.0","id":1,"method":"runtime.startTask","params":{}}\n'
        result = await trio.run_process(worker_argv(), stdin=line, capture_stdout=True, capture_stderr=True,
                                        env=env, check=False)
        assert result.returncode == 0
        assert b'"code":-32002' in result.stdout and b"runtime.initialize first" in result.stdout


async def test_protocol_version_mismatch_is_refused(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with open_worker(home=tmp_path) as worker:
            with pytest.raises(RpcError) as err:
                await worker.request(Method.INITIALIZE, {"protocol_version": "2.0"})
            assert err.value.code == ErrorCode.PROTOCOL_VERSION_MISMATCH


async def test_oversized_request_frame_is_rejected_and_worker_keeps_serving(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with open_worker(worker_argv("--max-frame-bytes", "65536"), home=tmp_path) as worker:
            big = b'{"jsonrpc":"2.0","id":"big","method":"runtime.stop","params":{"task_id":"' + b"x" * 200_000 + b'"}}\n'
            await worker.send_raw(big)
            reply = await worker.answer_to(None)
            assert isinstance(reply, ErrorResponse) and reply.error.code == ErrorCode.FRAME_TOO_LARGE
            data = reply.error.data
            assert isinstance(data, dict) and isinstance(data["detail"], str) and "65536" in data["detail"]
            after = await worker.start_task(scenario="echo")
            assert (await after.until_terminal())[-1].event.type == EventType.TASK_COMPLETED


@pytest.mark.parametrize(("scenario", "exit_code", "sig"), [("crash-exit", 3, None), ("crash-signal", None, 9)])
async def test_runtime_crash_ends_the_worker_with_its_status(tmp_path: Path, scenario: str,
                                                             exit_code: int | None,
                                                              sig: int | None) -> None:
    with trio.fail_after(30):
        async with open_worker(home=tmp_path) as worker:
            task = await worker.start_task(scenario=scenario)
            with pytest.raises(WorkerOutputEnded, match="output ended"):
                await task.until_terminal()
            # Everything emitted before the crash was flushed first.
            assert EventType.MODEL_OUTPUT_COMPLETED in [e.event.type for e in task.events]
            status = await worker.wait_exit()
            assert (status.exit_code, status.signal) == (exit_code, sig)
            assert "crashing on purpose" in worker.stderr
            with pytest.raises(WorkerOutputEnded) as ended:  # at once: the connection knows the worker is gone
                await task.stop()
            assert isinstance(ended.value.__cause__, WorkerBroken)


async def test_flood_arrives_complete_and_in_order(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with open_worker(home=tmp_path) as worker:
            events = await (await worker.start_task(scenario="flood")).until_terminal(timeout=60)
    assert len(events) == 20_000 + 2
    assert [e.n for e in events] == list(range(1, len(events) + 1))
    assert worker.violations == []


@pytest.mark.parametrize(("scenario", "kind"), [("malformed-line", "bad_frame"), ("oversized-line", "bad_frame")])
async def test_bad_lines_from_the_worker_are_counted_not_fatal(tmp_path: Path, scenario: str, kind: str) -> None:
    with trio.fail_after(60):
        async with open_worker(home=tmp_path) as worker:
            events = await (await worker.start_task(scenario=scenario)).until_terminal(timeout=60)
            texts = [e.event.payload.text for e in events if e.event.type == EventType.MODEL_OUTPUT_COMPLETED]
            assert texts == ["before", "after"]
            assert events[-1].event.type == EventType.TASK_COMPLETED
            assert [violation.kind for violation in worker.violations] == [kind]  # one, and of this kind


def test_stray_output_never_reaches_the_protocol_stream() -> None:
    program = (
        "import os, sys\n"
        "from codesdk.worker._stdio import claim_stdout as _claim_stdout\n"
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
        async with open_worker(home=tmp_path) as worker:
            task = await worker.start_task(scenario="flood")
            while (await task.next_event()).n < 200:
                pass
            await task.stop("enough")
            events = await task.until_terminal(timeout=60)
    assert [e.n for e in events] == list(range(1, len(events) + 1))
    assert events[-1].event.type == EventType.TASK_STOPPED and len(events) < 20_002
