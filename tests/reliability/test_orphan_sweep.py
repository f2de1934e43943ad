"""The supervisor reaps what runtimes leave to it as a child subreaper, and never a child it waits for itself.

A runtime may detach a helper into a session of its own and exit before it (OpenCode does, on shutdown): the
helper is re-parented to the supervisor and, once it exits, must be reaped there, or each such task leaves a
zombie for the service's lifetime. Workers and tool commands also lead sessions of their own, and their exit
statuses are read by the supervisor: the sweep must leave those alone, also one whose start is still under way.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import psutil  # type: ignore[import-untyped]
import pytest
import trio

from codesdk.procs.children import Children
from codesdk.procs.orphans import Orphans, become_subreaper
from codesdk.supervisor.store import TaskState
from tests.conftest import MakeEngine
from tests.e2e.conftest import run_task

#: The runtime's own process: detaches a helper into a session of its own that waits on a FIFO, records its
#: pid, and exits while the helper lives on.
DETACHING_RUNTIME = """
import subprocess, sys
helper = subprocess.Popen(["sh", "-c", 'read x < "$0"', sys.argv[1]], start_new_session=True,
                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
with open(sys.argv[2], "w") as f:
    f.write(str(helper.pid))
"""


def _status(pid: int) -> tuple[str, int] | None:
    """``pid``'s state and parent; None once it is gone."""
    try:
        process = psutil.Process(pid)
        return process.status(), process.ppid()
    except psutil.NoSuchProcess:
        return None


async def test_a_helper_a_runtime_detached_is_reaped_once_it_exits_after_the_runtime(
        make_engine: MakeEngine, tmp_path: Path) -> None:
    if not become_subreaper():
        pytest.skip("this kernel does not offer PR_SET_CHILD_SUBREAPER")
    fifo, pidfile = tmp_path / "release", tmp_path / "helper.pid"
    os.mkfifo(fifo)
    steps = [{"runtime_process": [sys.executable, "-c", DETACHING_RUNTIME, str(fifo), str(pidfile)]},
             {"complete": {}}]
    with trio.fail_after(60):
        async with make_engine() as engine:
            _, record, _ = await run_task(engine, runtime_config={"scenario_inline": {"name": "detaching-runtime", "steps": steps}})
            assert record.state == TaskState.COMPLETED, record.error
            helper = int(pidfile.read_text())
            while (status := _status(helper)) is not None and status[1] != os.getpid():
                await trio.sleep(0.02)  # re-parented to us once the runtime's process is gone
            assert status is not None and status[0] != psutil.STATUS_ZOMBIE
            release = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # the helper reads it: it exits
            os.write(release, b"go\n")
            os.close(release)
            while (status := _status(helper)) is not None:  # exited: a zombie of ours until the sweep reaps it
                await trio.sleep(0.05)


def _exited_child(code: int) -> subprocess.Popen[bytes]:
    """A child in a session of its own that has exited with ``code`` and is not reaped yet (a zombie of ours)."""
    child = subprocess.Popen(["sh", "-c", f"exit {code}"], start_new_session=True)
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
    return child


def test_the_sweep_reaps_an_unowned_zombie_and_leaves_an_owned_one_to_its_owner() -> None:
    children = Children()
    with children.owned_child() as own:
        owned = _exited_child(3)
        own(owned.pid)
        orphan = _exited_child(4)
        reaped = Orphans(children).sweep()
        assert orphan.pid in reaped and owned.pid not in reaped
        assert owned.wait() == 3
    orphan.wait()  # its status was taken by the sweep: what an owner that had not said so would get
    assert orphan.returncode == 0


class _Noticed(Children):
    """A registry that says when a sweep has listed the orphans (it then asks for the starts under way)."""

    def __init__(self) -> None:
        super().__init__()
        self.listed = threading.Event()

    def starts_under_way(self) -> frozenset[int]:
        self.listed.set()
        return super().starts_under_way()


def test_a_zombie_found_while_its_start_is_under_way_is_left_to_the_child_s_owner() -> None:
    """The sweep found the zombie before its owner knew the pid: it waits for that start, then leaves it."""
    children = _Noticed()
    with children.starting() as own:
        child = _exited_child(5)
        swept: list[list[int]] = []
        sweep = threading.Thread(target=lambda: swept.append(Orphans(children).sweep()))
        sweep.start()
        assert children.listed.wait(timeout=60)
        own(child.pid)
        sweep.join()
    assert len(swept) == 1 and child.pid not in swept[0]
    assert child.wait() == 5
    children.disown(child.pid)


def test_shutdown_leaves_a_child_whose_start_is_under_way_to_its_owner() -> None:
    """At shutdown the supervisor SIGKILLs the orphans it adopted; a worker being spawned looks like one until its
    owner knows its pid (outside our session, not owned). It must wait for that start, then leave the child."""
    children = _Noticed()
    with children.starting() as own:
        child = subprocess.Popen(["sleep", "600"], start_new_session=True)
        ended = threading.Thread(target=trio.run, args=(Orphans(children).end_adopted, 60.0))
        ended.start()
        while not children.listed.wait(timeout=0.05) and ended.is_alive():
            pass  # before the fix, shutdown killed it without waiting: the thread ends instead
        own(child.pid)
        ended.join()
    try:
        assert child.poll() is None, "shutdown killed a child whose start was under way"
    finally:
        child.kill()
        child.wait()
        children.disown(child.pid)


def test_a_sweep_leaves_alone_only_what_its_own_registry_owns() -> None:
    """Why a process has one registry: a child another registry owns is an orphan to this sweep, and its exit
    status would be stolen from its owner — so every spawner and the sweep of a process share one."""
    mine, another = Children(), Children()
    with another.owned_child() as own:
        theirs = _exited_child(6)
        own(theirs.pid)
        assert theirs.pid in Orphans(mine).sweep()
        theirs.wait()
    assert theirs.returncode == 0  # what its owner read: not its exit status


async def test_engines_side_by_side_share_one_registry_and_neither_sweep_takes_the_others_child(
        make_engine: MakeEngine, children: Children, tmp_path: Path) -> None:
    """Two engines open in one process (as in tests, or a program embedding two) are handed the process's one
    registry: their pools, worker templates and exec tools own their children there, and each engine's sweep
    leaves alone what the other's spawners own, while it reaps what nobody owns."""
    if not become_subreaper():
        pytest.skip("this kernel does not offer PR_SET_CHILD_SUBREAPER")
    with trio.fail_after(60):
        async with make_engine(worker_template=True) as first, \
                make_engine(data_dir=tmp_path / "second", exec_allowlist=("true",)) as second:
            assert first.pool.config.children is children and second.pool.config.children is children
            assert first.pool._template is not None and first.pool._template.children is children
            exec_tool = getattr(second.tooling.tools["workspace.exec"].run, "__self__")  # the tool's ExecTool
            assert exec_tool.children is children and exec_tool.prober.children is children
            with children.owned_child() as own:  # as the second engine's pool owns a worker it spawned
                owned = _exited_child(7)
                own(owned.pid)
                orphan = _exited_child(8)
                while _status(orphan.pid) is not None:  # reaped by a sweep...
                    await trio.sleep(0.05)
                assert owned.wait() == 7  # ...which left the owned child's exit status to its owner
            orphan.wait()  # its Popen learns it is gone
