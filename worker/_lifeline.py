"""The worker ends with its supervisor, however the supervisor ends, and takes its runtimes with it.

Two signals of a supervisor's death, because either alone can be missed: EOF on stdin (the server's read loop
sees it; but a runtime that inherited the pipe could keep it open), and the kernel's parent-death signal. The
latter fires whenever the *thread* that forked us exits — the supervisor forks from short-lived worker threads —
so it only wakes a check: the supervisor is gone when our parent pid is no longer the one we started with.

On the way out, whatever the worker started and is still running (a runtime CLI the SDK did not stop, its
children) is killed: nothing outlives the worker.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import psutil

log = logging.getLogger("codesdk.worker.lifeline")

#: Delivered by the kernel when our parent (thread) dies; a signal nothing else sends us. It may arrive several
#: times (once per exiting thread of a dying supervisor), also outside ``watch_parent``, so the worker ignores it
#: from its first line on (``worker._stdio``): its default action would end us without any cleanup.
PARENT_DEATH_SIGNAL = signal.SIGUSR2
#: Seconds descendants get to exit after SIGTERM before SIGKILL, when the worker ends.
DESCENDANTS_GRACE_S = 1.0
_PR_SET_PDEATHSIG = 1


def _set_parent_death_signal(signum: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


async def watch_parent(parent_pid: int, on_gone: Callable[[], None]) -> None:
    """Call ``on_gone`` once the process that started us has died (never returns before that)."""
    import trio  # only here: this module is imported before trio, for PARENT_DEATH_SIGNAL

    with trio.open_signal_receiver(PARENT_DEATH_SIGNAL) as deaths:
        try:
            if not _set_parent_death_signal(PARENT_DEATH_SIGNAL):
                log.warning("no parent-death signal here; relying on stdin EOF alone")
                await trio.sleep_forever()
            if os.getppid() != parent_pid:  # died before the signal was armed
                log.warning("the supervisor (pid %d) is gone; shutting down", parent_pid)
                on_gone()
                return
            async for _ in deaths:
                if os.getppid() != parent_pid:
                    log.warning("the supervisor (pid %d) died; shutting down", parent_pid)
                    on_gone()
                    return
        finally:
            _set_parent_death_signal(0)  # disarmed: nothing more to learn from it


def _has_children() -> bool:
    """Whether we have any child at all, from ``/proc/self/task/*/children`` (a few reads, where a full process
    table scan costs tens of ms on a busy host); True when that interface is missing."""
    try:
        with os.scandir("/proc/self/task") as tasks:
            for task in tasks:
                with open(os.path.join(task.path, "children")) as children:
                    if children.read().strip():
                        return True
    except OSError:
        return True
    return False


def end_descendants(grace_s: float = DESCENDANTS_GRACE_S) -> list[int]:
    """SIGTERM every process below us, SIGKILL what is left after ``grace_s``, and reap our own children among
    them (a zombie handed to the supervisor would be one it cannot tell from a worker); the pids found."""
    if not _has_children():
        return []
    import psutil  # only here: ~13 ms of every worker's start otherwise

    try:
        found = psutil.Process().children(recursive=True)
    except psutil.Error:
        return []
    for process in found:
        _send(process, signal.SIGTERM)
    _, alive = psutil.wait_procs(found, timeout=grace_s)  # reaps those that are our children
    for process in alive:
        _send(process, signal.SIGKILL)
    psutil.wait_procs(alive, timeout=grace_s)
    log.info("ended what was still running below the worker: %s", [p.pid for p in found])
    return [p.pid for p in found]


def _send(process: psutil.Process, signum: int) -> None:
    import psutil  # imported by end_descendants already

    try:
        process.send_signal(signum)
    except psutil.Error:
        pass
