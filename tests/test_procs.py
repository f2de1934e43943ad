"""``codesdk.procs`` on its own: a child is owned in its registry exactly from its start until it is reaped, however
it was started and however its holder ends; a tree is ended with SIGTERM, then SIGKILL for what outlived it; the
state these keep is their objects', not the modules'."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from functools import partial

import pytest
import trio

from codesdk.procs.children import Children
from codesdk.procs.orphans import discard, end_session
from codesdk.procs.process import AdoptedProcess, ForkedChild, StartedProcess, hold, session_child
from codesdk.procs.scan import Scans
from codesdk.procs.tree import ProcessTable, descendants, end_tree

from tests.worker.harness import REPO

#: Ignores SIGTERM, starts a child that does too (in its group), says the child's pid, then waits.
STUBBORN = ("import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "c = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
            "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)']); print(c.pid, flush=True); "
            "time.sleep(600)")


def test_what_runs_before_the_heavy_imports_is_the_standard_library_only() -> None:
    """The ``codesdk`` front owns its headstart worker in a registry before it imports trio or psutil."""
    probe = ("import sys, json, codesdk.procs.children, codesdk.procs.scan, codesdk.procs.launch; "
             "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {'trio', 'psutil', 'pydantic'})))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, cwd=REPO,
                          check=True)
    assert json.loads(done.stdout) == []


def test_registries_are_separate_objects() -> None:
    first, second = Children(), Children()
    with first.owned_child() as own:
        own(12345)
        assert first.owned() == {12345} and second.owned() == frozenset()
        with second.starting():
            assert second.starts_under_way() and not first.starts_under_way()
    assert first.owned() == frozenset()


async def test_a_start_that_fails_raises_bare_and_owns_nothing() -> None:
    children = Children()
    with pytest.raises(FileNotFoundError):
        async with session_child(["/nonexistent/program"], children=children, deliver_cancel=_unused,
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                 env={}):
            raise AssertionError("started")
    assert children.owned() == frozenset() and children.starts_under_way() == frozenset()


async def test_a_child_in_its_own_session_is_owned_until_reaped() -> None:
    children = Children()
    with trio.fail_after(60):
        async with session_child([sys.executable, "-c", "import sys; sys.stdin.read(); sys.exit(4)"],
                                 children=children, deliver_cancel=_unused, stdin=subprocess.PIPE,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={}) as (process, _):
            assert children.owned() == {process.pid} and os.getsid(process.pid) == process.pid
            assert process.stdin is not None
            await process.stdin.aclose()  # it exits
    assert process.returncode == 4 and children.owned() == frozenset()


async def test_an_adopted_child_whose_holder_is_cancelled_is_ended_reaped_and_disowned() -> None:
    children = Children()
    with children.starting() as own:
        popen = subprocess.Popen([sys.executable, "-c", STUBBORN], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, start_new_session=True)
        own(popen.pid)
    adopted = AdoptedProcess(StartedProcess.of_popen(popen, children))
    ended: list[tuple[bool, bool]] = []

    async def end(process: object) -> None:
        assert process is adopted
        ended.append(await end_tree(adopted, descendants(adopted.pid), 0.2))

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(hold, adopted, end)
            assert adopted.stdout is not None
            grandchild = int((await adopted.stdout.receive_some()).split()[0])
            nursery.cancel_scope.cancel()
    assert ended == [(True, True)]  # SIGTERM was ignored: SIGKILL ended it
    assert adopted.returncode == -9 and children.owned() == frozenset()
    assert not _running(grandchild)
    end_session(adopted.pid, Scans())  # the grandchild, re-parented here if this process is a child subreaper
    for stream in (adopted.stdin, adopted.stdout, adopted.stderr):
        assert stream is not None
        await stream.aclose()


async def test_a_tree_that_honours_sigterm_needs_no_sigkill() -> None:
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            process: trio.Process = await nursery.start(partial(
                trio.run_process, [sys.executable, "-c", "import time; print(1, flush=True); time.sleep(600)"],
                stdout=subprocess.PIPE, check=False, process_group=0))
            assert process.stdout is not None
            await process.stdout.receive_some()  # it runs Python: SIGTERM's default ends it
            assert await end_tree(process, [], 30.0) == (True, False)
    assert process.returncode == -15


def test_nothing_is_signalled_through_the_pid_of_a_reaped_child_that_another_process_has_now() -> None:
    """Once a child is reaped its pid may be reused (a tenant can cycle through pids quickly): what is left of its
    group and session is ended only while no process has that pid — their ids stay reserved while they have
    members, so a process with it is someone else's, and so is its session."""
    other = subprocess.Popen([sys.executable, "-c", "import subprocess, time; c = subprocess.Popen(['sleep', '600']); "
                              "print(c.pid, flush=True); time.sleep(600)"], stdout=subprocess.PIPE,
                             start_new_session=True)
    assert other.stdout is not None
    try:
        member = int(other.stdout.readline())
        reaped = ForkedChild(other.pid)  # stands for a child of ours, reaped, whose pid is the other's now
        reaped.returncode = 0
        children = Children()
        with children.starting() as own:
            own(other.pid)
        discard(reaped, children, Scans())
        end_session(other.pid, Scans())
        assert other.poll() is None and _running(member)
        assert children.owned() == frozenset()  # it was reaped: disowned all the same
    finally:
        os.killpg(other.pid, signal.SIGKILL)
        other.wait()
        other.stdout.close()
        end_session(other.pid, Scans())  # its member, re-parented here if this process is a child subreaper


def test_each_process_table_keeps_its_own_snapshots() -> None:
    first, second = ProcessTable(), ProcessTable()
    child = subprocess.Popen(["sleep", "600"])
    try:
        snapshot = first.snapshot(max_age_s=3600)
        assert first.snapshot(max_age_s=3600) is snapshot  # one scan serves every watcher of this table
        assert child.pid in snapshot.descendants(os.getpid())
        assert second.latest is not snapshot and second.latest.descendants(os.getpid()) == {}
    finally:
        child.kill()
        child.wait()


async def _unused(process: object) -> None:
    raise AssertionError("not cancelled: nothing to deliver")


def _running(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
