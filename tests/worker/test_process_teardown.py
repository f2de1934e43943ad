"""Teardown of a worker that misbehaves: ignores SIGTERM, leaves a child holding its pipes."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import psutil
import pytest
import trio

from codesdk.worker.client import WorkerProcess, WorkerSpec, WorkerStartError

# A fake worker: answers runtime.initialize, starts a grandchild that inherits its pipes, ignores SIGTERM.
STUBBORN = r"""
import json, os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
open(os.environ["CHILD_PID_FILE"], "w").write(str(child.pid))
line = sys.stdin.readline()
req = json.loads(line)
sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": req["id"], "result": {
    "protocol_version": "1.0", "worker": {"name": "stubborn", "version": "0"}, "pid": os.getpid(), "runtimes": []}}) + "\n")
sys.stdout.flush()
while True:
    time.sleep(1)
"""


async def test_shutdown_kills_a_stubborn_worker_and_its_child(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    env = {"PATH": os.environ["PATH"], "CHILD_PID_FILE": str(pid_file)}
    spec = WorkerSpec(argv=[sys.executable, "-c", STUBBORN], env=env, name="stubborn")
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            worker = await WorkerProcess.start(nursery, spec)
            child_pid = int(pid_file.read_text())
            assert psutil.pid_exists(child_pid)
            status = await worker.shutdown(grace_s=0.5)
    assert status.signal == 9  # SIGTERM was ignored, so it took SIGKILL
    assert not psutil.pid_exists(worker.pid)
    assert not _alive(child_pid)


def _alive(pid: int) -> bool:
    """Running and not a zombie (init reaps the orphaned grandchild a moment later; dead either way)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def test_a_worker_that_never_answers_the_handshake_is_killed(tmp_path: Path) -> None:
    mute = "import sys, time; print('hello', file=sys.stderr, flush=True); time.sleep(600)"
    spec = WorkerSpec(argv=[sys.executable, "-c", mute],
                      env={"PATH": os.environ["PATH"]}, name="mute")
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            with pytest.raises(WorkerStartError, match=r"handshake.*stderr: hello"):
                await WorkerProcess.start(nursery, spec, handshake_timeout_s=0.5)


async def test_a_worker_that_exits_at_once_reports_its_stderr(tmp_path: Path) -> None:
    spec = WorkerSpec(argv=[sys.executable, "-c", "import sys; sys.exit('cannot start: bad config')"],
                      env={"PATH": os.environ["PATH"]}, name="broken")
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            with pytest.raises(WorkerStartError, match="cannot start: bad config"):
                await WorkerProcess.start(nursery, spec)
