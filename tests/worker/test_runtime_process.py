"""A runtime's program (``RuntimeProcess``) ends with everything it started, however the block is left — also
what left its process group — and a program started ahead is owned the same way once taken over."""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import aclosing

import psutil
import trio
import trio.testing

from codesdk.procs.process import AdoptedProcess, close_and_reap
from codesdk.protocol import ProcessEnd
from codesdk.worker.adapters.runtime_process import RuntimeProcess, ended_processes

from tests.waits import wait_for

#: Starts a grandchild in a session (and so a process group) of its own, says its pid, then waits on stdin.
ESCAPER = ("import os, subprocess, sys; p = subprocess.Popen(['sleep', '1000'], start_new_session=True); "
           "print(p.pid, flush=True); sys.stdin.read()")


def _gone(pid: int) -> bool:
    """Not running. A zombie re-parented to us (the test process may be a child subreaper, as a supervisor is) is
    reaped here; one adopted elsewhere runs nothing and is its new parent's to reap."""
    try:
        process = psutil.Process(pid)
        if process.status() != psutil.STATUS_ZOMBIE:
            return process.status() == psutil.STATUS_DEAD
        if process.ppid() == os.getpid():
            os.waitpid(pid, 0)
        return True
    except (psutil.NoSuchProcess, ChildProcessError):
        return True


def _started_before_trio(code: str) -> subprocess.Popen[bytes]:
    """Python running ``code`` as the worker starts a runtime ahead: Popen, pipes on its stdio, its own group."""
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, process_group=0)


async def _first_line(process: RuntimeProcess) -> bytes:
    async with aclosing(process.lines()) as lines:
        async for line in lines:
            return line
    raise AssertionError("the program said nothing")


async def test_ending_a_program_ends_what_left_its_group() -> None:
    with trio.fail_after(60):
        async with RuntimeProcess.open([sys.executable, "-c", ESCAPER], env={}, term_grace_s=1) as process:
            escaped = int(await _first_line(process))
            program = process.pid
            assert psutil.Process(escaped).status() != psutil.STATUS_ZOMBIE
    assert _gone(program)
    wait_for("the escaped grandchild to die of its SIGKILL", lambda: _gone(escaped))


async def test_the_receipt_names_each_process_that_left_the_group() -> None:
    """Issue 33: a stop receipt that reports an escaped process names it (pid, command), not only a count; what
    stayed in the group is the group's, not counted as escaped."""
    ledger: list[ProcessEnd] = []
    ended_processes.set(ledger)
    with trio.fail_after(60):
        async with RuntimeProcess.open([sys.executable, "-c", ESCAPER], env={}, term_grace_s=1) as process:
            escaped = int(await _first_line(process))
    wait_for("the escaped grandchild to die of its SIGKILL", lambda: _gone(escaped))
    [end] = ledger
    assert end.escaped_killed == 1 and [(e.pid, e.command) for e in end.escaped] == [(escaped, "sleep 1000")], end


async def test_a_program_started_ahead_is_owned_like_one_started_here() -> None:
    with trio.fail_after(60):
        ahead = AdoptedProcess.of_popen(_started_before_trio(ESCAPER))
        async with RuntimeProcess.open(["unused"], env={}, term_grace_s=1, started=ahead) as process:
            assert process.pid == ahead.pid
            escaped = int(await _first_line(process))
    assert ahead.returncode is not None
    wait_for("the escaped grandchild to die of its SIGKILL", lambda: _gone(escaped))
    assert ahead.stdout is not None
    try:  # its pipes were closed with it
        await ahead.stdout.receive_some()
        raise AssertionError("stdout still open")
    except trio.ClosedResourceError:
        pass


async def test_an_adopted_process_can_be_waited_for_by_many_tasks_at_once() -> None:
    """Each waiter gets the exit status; the process is reaped once (no zombie), and waiting again still answers."""
    popen = _started_before_trio("import sys; sys.stdin.read(); sys.exit(3)")
    adopted = AdoptedProcess.of_popen(popen)
    statuses: list[int] = []

    async def wait() -> None:
        statuses.append(await adopted.wait())

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(wait)
            await trio.testing.wait_all_tasks_blocked()
            assert adopted.returncode is None
            await close_and_reap(adopted)  # closing stdin ends it
        assert statuses == [3, 3, 3]
        assert await adopted.wait() == 3
    assert _gone(popen.pid)
