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


def end_descendants(grace_s: float = DESCENDANTS_GRACE_S) -> list[int]:
    """SIGTERM every process below the worker, SIGKILL what is left after ``grace_s``, and reap its own children
    among them (a zombie handed to the supervisor would be one it cannot tell from a worker); the pids found."""
    from codesdk.procs.tree import end_descendants as end_all  # only here: it needs trio, imported by now

    found = end_all(grace_s)
    if found:
        log.info("ended what was still running below the worker: %s", found)
    return found
