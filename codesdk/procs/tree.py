"""A process's tree: finding its descendants (now, or in snapshots of the process table), signalling them with its
group, ending it all (``end_tree``), and checking that nothing of it is left.

A descendant is signalled through ``psutil``, which checks it is still the process found (never a reused pid); a
group through ``killpg``. psutil is imported where it is first needed: the worker imports this module at start.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import trio

from .process import ChildProcess
from .scan import DESCRIPTORS_EXHAUSTED, Scans

if TYPE_CHECKING:
    import psutil

#: Seconds between looks at whether what was signalled is gone (a dying process takes milliseconds).
GONE_POLL_S = 0.01
#: Seconds a scan that has to finish retries while descriptors are exhausted (always in a thread).
SCAN_RETRY_S = 2.0


def signal_group(pgid: int, sig: int) -> None:
    """Signal a process group; nothing if it is empty or out of reach."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def pid_in_use(pid: int) -> bool:
    """Whether a process (or a zombie) has this pid now."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's
        pass
    return True


def signal_group_of(process: ChildProcess, sig: int) -> None:
    """Signal the group ``process`` leads; once it has been reaped, what is left of that group — whose id stays
    reserved while it has members, so a process with that pid now means the pid was reused: nothing is signalled."""
    if process.returncode is None or not pid_in_use(process.pid):  # (``returncode`` may reap it: asked first)
        signal_group(process.pid, sig)


def signal_all(processes: Iterable[psutil.Process], sig: int) -> None:
    """Signal each process still the one found (psutil checks its start time)."""
    import psutil

    for process in processes:
        with contextlib.suppress(psutil.Error, OSError):  # gone, or its identity cannot be checked now: not blindly
            process.send_signal(sig)


def signal_tree(process: ChildProcess, tree: Sequence[psutil.Process], sig: int) -> None:
    """Signal the group ``process`` leads (``signal_group_of``) and every process of ``tree`` (its descendants found
    earlier)."""
    signal_group_of(process, sig)
    signal_all(tree, sig)


def sigkill(pids: Iterable[int]) -> None:
    """SIGKILL each pid (only for pids just checked to be the process meant: ``started_at``, ``pipe_holders``)."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def alive(process: psutil.Process) -> bool:
    """Running and not a zombie; True when it cannot be looked at (out of descriptors): every wait on it is
    bounded."""
    import psutil

    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
    except OSError:
        return True


def descendants(pid: int, scans: Scans | None = None) -> list[psutil.Process]:
    """``pid``'s descendants now; [] if it is gone. Out of descriptors to read /proc with: [] and a warning through
    ``scans`` (its group is still signalled, and what earlier snapshots remembered), or the OSError without."""
    import psutil

    try:
        return list(psutil.Process(pid).children(recursive=True))
    except psutil.Error:
        return []
    except OSError as exc:
        if scans is None:
            raise
        scans.failed(f"process tree of pid {pid}", exc, "going on without it")
        return []


async def end_tree(process: ChildProcess, tree: Sequence[psutil.Process], grace_s: float) -> tuple[bool, bool]:
    """End ``process``, the group it leads and ``tree`` (its descendants, found while it ran: also those that left
    its group): SIGTERM to all, up to ``grace_s`` for all of it to be gone, SIGKILL to the group and ``tree`` (also
    what started meanwhile), and up to ``grace_s`` more for that to land. Shielded; someone else reaps the process
    (its holder task). Whether a SIGTERM was sent (something ran), and whether something outlived it."""
    with trio.CancelScope(shield=True):
        def running() -> bool:
            return process.returncode is None or any(alive(p) for p in tree)

        term_sent = kill_needed = False
        if running():
            signal_tree(process, tree, signal.SIGTERM)
            term_sent = True
            with trio.move_on_after(grace_s):
                while running():
                    await trio.sleep(GONE_POLL_S)
            kill_needed = running()
        signal_tree(process, tree, signal.SIGKILL)
        with trio.move_on_after(grace_s):  # SIGKILL cannot be refused: wait until it has landed
            while running():
                await trio.sleep(GONE_POLL_S)
    return term_sent, kill_needed


def group_empty(pgid: int) -> bool:
    """No live process in the group: none at all, or only zombies (dead, waiting for their parent to reap them)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # someone is left in it, of another uid
        pass
    import psutil  # someone is left in it: a zombie, or alive? look at each

    for process in psutil.process_iter(["status"]):
        with contextlib.suppress(psutil.Error, OSError):
            if os.getpgid(process.pid) == pgid and process.info["status"] != psutil.STATUS_ZOMBIE:
                return False
    return True


async def group_gone(pgid: int, tree: Sequence[psutil.Process], wait_s: float) -> bool:
    """Whether nothing is left of an ended group: empty, and ``tree`` dead — checked until ``wait_s`` has passed
    (killed members stay zombies until their parent reaps them)."""
    with trio.move_on_after(wait_s) as timer:
        while not (group_empty(pgid) and not any(map(alive, tree))):
            await trio.sleep(GONE_POLL_S * 5)
    return not timer.cancelled_caught


def has_children(pid: int | str = "self") -> bool:
    """Whether the process has any child at all, from ``/proc/<pid>/task/*/children`` (a few reads, where a full
    process table scan costs tens of ms on a busy host); True when that interface is missing or unreadable."""
    try:
        with os.scandir(f"/proc/{pid}/task") as tasks:
            for task in tasks:
                with open(os.path.join(task.path, "children")) as children:
                    if children.read().strip():
                        return True
    except OSError:
        return True
    return False


def end_descendants(grace_s: float) -> list[int]:
    """SIGTERM every process below this one, SIGKILL what is left after ``grace_s``, and reap this process's own
    children among them (``end_tree`` for the whole of it, blocking: for the last moments of a process); the pids
    found."""
    if not has_children():
        return []
    import psutil

    try:
        found = psutil.Process().children(recursive=True)
    except psutil.Error:
        return []
    signal_all(found, signal.SIGTERM)
    _, left = psutil.wait_procs(found, timeout=grace_s)  # reaps those that are our children
    signal_all(left, signal.SIGKILL)
    psutil.wait_procs(left, timeout=grace_s)
    return [p.pid for p in found]


@dataclass(frozen=True)
class Snapshot:
    """Every process's parent and start time, read from /proc at once (``taken``, monotonic seconds)."""

    taken: float
    children: dict[int, list[int]]
    started: dict[int, float]

    def descendants(self, pid: int) -> dict[int, float]:
        """``pid``'s descendants in this snapshot: pid -> start time."""
        found: dict[int, float] = {}
        stack = list(self.children.get(pid, ()))
        while stack:
            child = stack.pop()
            if child in found or child not in self.started:
                continue
            found[child] = self.started[child]
            stack.extend(self.children.get(child, ()))
        return found


class ProcessTable:
    """Snapshots of the process table, shared by those who watch trees (a pool's workers: one scan of /proc serves
    hundreds), and the ``Scans`` they look through."""

    def __init__(self, scans: Scans | None = None) -> None:
        self.scans = scans if scans is not None else Scans()
        self._lock = threading.Lock()
        self.latest = Snapshot(float("-inf"), {}, {})

    def snapshot(self, max_age_s: float = 0.0) -> Snapshot:
        """The latest snapshot if younger than ``max_age_s``, else a new one. Blocks: run it in a thread. OSError
        when /proc cannot be read now (out of descriptors): the latest stays."""
        import psutil

        with self._lock:
            now = time.monotonic()
            if now - self.latest.taken > max_age_s:
                children: dict[int, list[int]] = {}
                started: dict[int, float] = {}
                for process in psutil.process_iter(["ppid", "create_time", "status"]):
                    info = process.info
                    if info["status"] == psutil.STATUS_ZOMBIE or info["create_time"] is None:
                        continue
                    children.setdefault(info["ppid"], []).append(process.pid)
                    started[process.pid] = info["create_time"]
                self.latest = Snapshot(now, children, started)
            return self.latest

    def started_at(self, pid: int) -> float | None:
        """A running (not zombie) process's start time, None if it is gone. Out of descriptors to look with, it
        tries again for up to ``SCAN_RETRY_S`` (blocks: run it in a thread) before taking the process for gone."""
        import psutil

        def look() -> float | None:
            try:
                process = psutil.Process(pid)
                return None if process.status() == psutil.STATUS_ZOMBIE else process.create_time()
            except psutil.Error:
                return None

        try:
            return self.scans.retrying(f"start time of pid {pid}", look, for_s=SCAN_RETRY_S)
        except OSError as exc:
            self.scans.failed(f"start time of pid {pid}", exc, "going on without it")
            return None

    def pipe_holders(self, inodes: set[int]) -> set[int]:
        """Pids (other than ours) with a descriptor on one of these pipes, found through /proc. Out of descriptors
        to scan with, it tries again for up to ``SCAN_RETRY_S`` (blocks: run it in a thread), then returns what it
        found."""
        wanted = {f"pipe:[{inode}]" for inode in inodes}
        me = os.getpid()
        what = "looking for the holders of a dead process's pipes"
        deadline = time.monotonic() + SCAN_RETRY_S

        def pids() -> list[int]:
            with os.scandir("/proc") as processes:
                return [int(e.name) for e in processes if e.name.isdigit() and int(e.name) != me]

        def holds(pid: int) -> bool:
            with os.scandir(f"/proc/{pid}/fd") as fds:
                return any(os.readlink(fd.path) in wanted for fd in fds)

        found: set[int] = set()
        try:
            for pid in self.scans.retrying(what, pids, for_s=SCAN_RETRY_S):
                try:
                    if self.scans.retrying(what, partial(holds, pid), for_s=max(0.0, deadline - time.monotonic())):
                        found.add(pid)
                except OSError as exc:
                    if exc.errno in DESCRIPTORS_EXHAUSTED:
                        raise
                    # gone meanwhile, or not ours to look at
        except OSError as exc:
            self.scans.failed(what, exc, "going on without it")
        return found
