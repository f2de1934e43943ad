"""Hung workers and what they leave behind: killed after the grace period, reaped, nothing orphaned.

The trap tested here is real: a runtime that starts a background process (``sleep 600 &`` from a shell tool,
a language server) hands it the worker's stdout/stderr. When the worker then dies, its pipes never reach EOF
— the supervisor must still notice the exit, fail the task once, and kill and reap what held the pipes.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import psutil
import pytest
import trio

from codesdk.procs.tree import has_children
from codesdk.protocol import EventType
from codesdk.supervisor.store import TaskState
from codesdk.supervisor.workers.launch import WorkerPolicy
from codesdk.worker.client import WorkerProcess, worker_argv
from codesdk.worker.client import _process as worker_process_module
from tests.conftest import MakeEngine
from tests.e2e.conftest import of_type, run_task

#: Starts a grandchild that inherits the worker's pipes (in its own session when asked), records its pid,
#: then becomes the real worker.
WRAPPER = """
import os, subprocess, sys
child = subprocess.Popen(["sleep", "600"], start_new_session=os.environ["PROBE_SETSID"] == "1")
with open(os.environ["PROBE_PIDFILE"], "a") as f:
    f.write(f"{child.pid}\\n")
os.execv(sys.argv[1], sys.argv[1:])
"""


def _gone(pid: int) -> bool:
    """Not running and not a zombie waiting for us: really gone, or reaped by someone who owns it."""
    try:
        process = psutil.Process(pid)
        return process.status() == psutil.STATUS_ZOMBIE and process.ppid() != os.getpid()
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("setsid", [False, True], ids=["same-group", "own-session"])
async def test_a_crash_is_reported_though_a_grandchild_holds_the_pipes(make_engine: MakeEngine,
                                                                       tmp_path: Path,
                                                                       setsid: bool) -> None:
    pidfile = tmp_path / "grandchildren"
    argv = (sys.executable, "-c", WRAPPER, *worker_argv())
    env = {"*": {"PROBE_PIDFILE": str(pidfile), "PROBE_SETSID": "1" if setsid else "0"}}
    with trio.fail_after(60):  # a hang guard: before the fix this waited for the grandchild's 600 s
        async with make_engine(worker_argv=argv, worker_env=env) as engine:
            _, record, events = await run_task(engine, runtime_config={"scenario": "crash-exit"})
            assert record.state == TaskState.FAILED
            assert [f.code for f in of_type(events, EventType.TASK_FAILED)] == ["WORKER_CRASHED"]
            grandchild = int(pidfile.read_text().split()[0])
            with trio.fail_after(10):
                while not _gone(grandchild):
                    await trio.sleep(0.05)
            # The namespace serves again (a new worker, a new grandchild).
            _, nxt, _ = await run_task(engine, runtime_config={"scenario": "echo"})
            assert nxt.state == TaskState.COMPLETED
        pids = [int(p) for p in pidfile.read_text().split()]
        assert len(pids) == 2
        with trio.fail_after(10):
            while not all(_gone(p) for p in pids):
                await trio.sleep(0.05)


async def test_a_frozen_worker_is_killed_on_shutdown_with_its_whole_tree(make_engine: MakeEngine,
                                                                         tmp_path: Path) -> None:
    """A SIGSTOPped worker answers nothing and cannot act on SIGTERM; with its grandchild holding the pipes,
    shutdown must still end in SIGKILL for all of them, within its grace periods, and reap them."""
    pidfile = tmp_path / "grandchildren"
    argv = (sys.executable, "-c", WRAPPER, *worker_argv())
    env = {"*": {"PROBE_PIDFILE": str(pidfile), "PROBE_SETSID": "1"}}
    with trio.fail_after(60):
        async with make_engine(worker_argv=argv, worker_env=env,
                               worker_policy=WorkerPolicy(shutdown_grace_s=1.0)) as engine:
            session = await engine.create_session()
            task = await engine.start_task(session.session_id, "x", runtime_config={"scenario": "hang"})
            while (await engine.store.get_task(task.task_id)).state != TaskState.RUNNING:
                await trio.sleep(0.02)
            worker = engine.pool.worker_of("default")
            assert worker is not None
            tree = [worker.pid, *(c.pid for c in psutil.Process(worker.pid).children(recursive=True)),
                    int(pidfile.read_text().split()[0])]
            os.kill(worker.pid, signal.SIGSTOP)
            await engine.stop_task(task.task_id)
            assert (await engine.wait_task(task.task_id)).state == TaskState.STOPPED
        assert worker.exit_status is not None and worker.exit_status.signal == signal.SIGKILL
    with trio.fail_after(10):
        while not all(_gone(p) for p in tree):
            await trio.sleep(0.05)


#: Starts a daemon — its own session, stdio on /dev/null, so neither the process group nor the pipes lead to
#: it — records its pid, then becomes the real worker.
DAEMON_WRAPPER = """
import os, subprocess, sys
null = subprocess.DEVNULL
child = subprocess.Popen(["sleep", "600"], start_new_session=True, stdin=null, stdout=null, stderr=null)
with open(os.environ["PROBE_PIDFILE"], "a") as f:
    f.write(f"{child.pid}\\n")
os.execv(sys.argv[1], sys.argv[1:])
"""


async def test_a_daemon_that_left_the_workers_session_dies_with_the_worker(make_engine: MakeEngine,
                                                                           tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(WorkerProcess, "tree_snapshot_s", 0.05)
    pidfile = tmp_path / "daemons"
    argv = (sys.executable, "-c", DAEMON_WRAPPER, *worker_argv())
    with trio.fail_after(60):
        async with make_engine(worker_argv=argv, worker_env={"*": {"PROBE_PIDFILE": str(pidfile)}}) as engine:
            session = await engine.create_session()
            task = await engine.start_task(session.session_id, "x", runtime_config={"scenario": "hang"})
            while (await engine.store.get_task(task.task_id)).state != TaskState.RUNNING:
                await trio.sleep(0.02)
            daemon = int(pidfile.read_text().split()[0])
            assert psutil.Process(daemon).status() != psutil.STATUS_ZOMBIE
            worker = engine.pool.worker_of("default")
            assert worker is not None
            while daemon not in worker._known:  # a snapshot of the worker's tree has seen it (on a busy host a
                await trio.sleep(0.02)  # scan of /proc can take longer than the snapshot interval)
            os.kill(worker.pid, signal.SIGKILL)
            record = await engine.wait_task(task.task_id)
            assert record.error is not None and record.error["code"] == "WORKER_CRASHED"
            with trio.fail_after(10):
                while not _gone(daemon):
                    await trio.sleep(0.05)


async def test_a_busy_worker_with_nothing_below_it_costs_no_process_table_scan(make_engine: MakeEngine,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker whose runtime runs in-process has no child: its tree is looked at through its own children list,
    and /proc is not scanned (tens of ms a scan on a busy host, once a second while any worker was busy). The
    daemon test above is the other half: a worker with a child is scanned, and its daemon remembered."""
    monkeypatch.setattr(WorkerProcess, "tree_snapshot_s", 0.05)
    looked = 0

    def counted(pid: int | str = "self") -> bool:
        nonlocal looked
        looked += 1
        return has_children(pid)

    monkeypatch.setattr(worker_process_module, "has_children", counted)
    with trio.fail_after(60):
        async with make_engine() as engine:
            session = await engine.create_session()
            task = await engine.start_task(session.session_id, "x", runtime_config={"scenario": "hang"})
            while (await engine.store.get_task(task.task_id)).state != TaskState.RUNNING:
                await trio.sleep(0.02)
            while looked < 5:  # five rounds of the busy worker's tree watch
                await trio.sleep(0.02)
            worker = engine.pool.worker_of("default")
            assert worker is not None
            assert worker._table.latest.taken == float("-inf"), "the process table was scanned"
            await engine.stop_task(task.task_id)
