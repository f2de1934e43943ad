"""Reaping orphans the supervisor adopted as a child subreaper.

The supervisor marks itself a child subreaper, so when a worker or a tool command dies, whatever it left
running is re-parented here rather than to pid 1 (which in a container may never reap). Those orphans must
be reaped by us, without ever stealing the exit status of a process someone else here waits for (its owner
would read "exit 0"). The rule that makes that safe: every process the supervisor spawns and waits for either
stays in the supervisor's session (short probes), or leads a session of its own and is owned
(``_own_children``) from the moment its start begins until it has been reaped. An adopted orphan is neither: it
belongs to the session of a leader that died, or it leads a session it made itself (a helper a runtime detached
before exiting). Only those are reaped.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import time
from collections.abc import Callable
from typing import NamedTuple, TypeVar

import psutil
import trio

from ._own_children import own_children, starts_under_way

log = logging.getLogger("codesdk.supervisor.orphans")

#: Seconds between sweeps while the supervisor runs.
SWEEP_INTERVAL_S = 1.0
#: Seconds between looks at a dying session member that is not (yet) our child, so cannot be waited for.
_MEMBER_POLL_S = 0.01
#: Seconds between looks at whether the starts a sweep waits for have ended (a start takes milliseconds).
_START_POLL_S = 0.005


class _Stat(NamedTuple):
    """What /proc/PID/stat says of a process, from one read, so the fields agree with each other."""

    zombie: bool
    parent: int
    session: int


def _stat(pid: int, *, strict: bool = False) -> _Stat | None:
    """``pid``'s state, parent and session (also of a zombie); None if it is gone (or, unless ``strict``, if there
    is no descriptor to look with: ``strict`` raises that OSError rather than take the process for gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        return _Stat(zombie=fields[0] == b"Z", parent=int(fields[1]), session=int(fields[3]))
    except OSError as exc:
        if strict and exc.errno in DESCRIPTORS_EXHAUSTED:
            raise
        return None
    except (IndexError, ValueError):
        return None


def session_of(pid: int) -> int | None:
    """The session id of ``pid`` (also of a zombie), from /proc; None if it is gone."""
    stat = _stat(pid)
    return None if stat is None else stat.session


def adopted_orphans() -> list[psutil.Process]:
    """Our children that are adopted orphans (running or zombie): outside our session and not owned. [] when /proc
    cannot be read now (out of file descriptors: the next sweep tries again). A child being started may be among
    them; ``sweep_adopted`` waits for those starts before it reaps."""
    ours = os.getsid(0)
    try:
        children = psutil.Process().children()
    except psutil.Error:
        return []
    except OSError as exc:  # EMFILE/ENFILE: psutil opens a file per process
        warn_scan_failed("listing adopted orphans", exc)
        return []
    return [child for child in children if session_of(child.pid) not in (None, ours) and child.pid not in own_children()]


def settled_orphans() -> list[psutil.Process]:
    """``adopted_orphans``, less those whose start was under way: it waits (blocks: run it in a thread) for the starts
    under way once the orphans were listed to end, so that a child just started, whose owner did not know its pid
    yet when it was listed, is owned by then and left alone."""
    orphans = adopted_orphans()
    if not orphans:
        return []
    pending = starts_under_way()  # taken after the listing: any start that made one of them is in it
    while pending & starts_under_way():
        time.sleep(_START_POLL_S)
    owned = own_children()
    return [orphan for orphan in orphans if orphan.pid not in owned]


def sweep_adopted() -> list[int]:
    """Reap every zombie child of ours that is an adopted orphan (see the module docstring, and ``settled_orphans``);
    return their pids. Blocks: run it in a thread."""
    reaped: list[int] = []
    for orphan in settled_orphans():
        try:
            if orphan.status() != psutil.STATUS_ZOMBIE:
                continue
        except (psutil.Error, OSError):  # gone, or no descriptor to look (the next sweep does)
            continue
        try:
            if os.waitpid(orphan.pid, os.WNOHANG)[0] == orphan.pid:
                reaped.append(orphan.pid)
        except ChildProcessError:
            continue
    if reaped:
        log.debug("reaped adopted orphans %s", reaped)
    return reaped


def reap_session(sid: int, wait_s: float = 2.0, extra: set[int] | frozenset[int] = frozenset()) -> None:
    """After the group ``sid`` led was killed: reap its members re-parented to us, and the pids in ``extra``
    (known descendants that left the session), waiting up to ``wait_s`` for them to die. Never the leader
    itself: whoever spawned it waits for it. Bounded, so a worker's teardown never hangs on its orphans; what
    is still dying when the time is up is left to the periodic sweep (``reap_orphans_forever``)."""
    deadline = time.monotonic() + wait_s
    me = os.getpid()
    while True:
        try:
            members = [c for c in psutil.Process(me).children(recursive=True)
                       if c.pid != sid and (c.pid in extra or session_of(c.pid) == sid)]
        except psutil.Error:
            return
        except OSError as exc:  # out of descriptors: what is left is reaped by the periodic sweep
            warn_scan_failed(f"reaping session {sid}", exc)
            return
        for member in members:
            try:
                if member.ppid() == me:  # re-parented to us (still running ones are reaped next round)
                    os.waitpid(member.pid, os.WNOHANG)
            except (ChildProcessError, psutil.Error, OSError):
                pass
        if not members or time.monotonic() > deadline:
            return
        time.sleep(0.01)


async def end_command(process: trio.Process) -> None:
    """End a command started in a session of its own (``start_new_session``): SIGKILL its group and reap all it
    started before returning — the leader first, so that what it started has been re-parented by the time its
    session is ended. Shielded, so that a cancelled call does not leave half of it behind; not bounded in time,
    so that a slow machine does not either."""
    with trio.CancelScope(shield=True):
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        await process.wait()
        await trio.to_thread.run_sync(end_session, process.pid)


def end_session(sid: int) -> None:
    """After the leader of session ``sid`` has exited and been reaped: SIGKILL what is left of the session and
    reap each member that is our child, until only zombies someone else reaps are left. Blocks; run it in a thread.

    The leader goes first so that whatever it started has been re-parented (to us, a child subreaper, or to
    pid 1) before we look. No time bound: giving up leaves a member that was still dying to become a zombie that
    nobody reaps. Members of ours are waited for (``waitpid``), others (a dying member's children, pid 1's) are
    looked at until they are dead; a slow machine only makes this slower."""
    me = os.getpid()
    unkillable: set[int] = set()
    while True:
        # out of descriptors to read /proc: wait for some, never give up (see above)
        found = scan_retrying(f"ending session {sid}", lambda: _session_members(sid), for_s=None)
        members = {pid: stat for pid, stat in found.items() if pid not in unkillable}
        if all(stat.zombie and stat.parent != me for stat in members.values()):
            return
        for pid in members:  # zombies too: a process whose main thread ended looks like one
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            except PermissionError:  # it gained another uid (a set-uid program): it is out of our reach
                log.warning("cannot kill %d, left over from session %d: not permitted", pid, sid)
                unkillable.add(pid)
        ours = [pid for pid, stat in members.items() if stat.parent == me and pid not in unkillable]
        for pid in ours:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:  # reaped meanwhile by the periodic sweep
                pass
        if not ours:
            time.sleep(_MEMBER_POLL_S)


def _session_members(sid: int) -> dict[int, _Stat]:
    """Every process of session ``sid`` but its leader, alive or zombie, wherever it was re-parented. OSError if
    /proc cannot be read now (out of descriptors) — never a partial answer."""
    members: dict[int, _Stat] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != sid and (stat := _stat(int(name), strict=True)) is not None \
                and stat.session == sid:
            members[int(name)] = stat
    return members


def become_subreaper() -> bool:
    """Adopt orphaned descendants (Linux ``PR_SET_CHILD_SUBREAPER``), so they are reaped here rather than left
    as zombies under a pid 1 that may not reap."""
    import ctypes

    pr_set_child_subreaper = 36
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(pr_set_child_subreaper, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


async def end_adopted(wait_s: float) -> None:
    """At shutdown: SIGKILL adopted orphans still running, and reap them all (bounded)."""
    with trio.move_on_after(wait_s):
        while orphans := await trio.to_thread.run_sync(settled_orphans):  # never a child whose start is under way
            for orphan in orphans:
                try:
                    orphan.kill()
                except psutil.Error:
                    pass
            await trio.to_thread.run_sync(sweep_adopted)
            await trio.sleep(0.02)


async def reap_orphans_forever(interval_s: float = SWEEP_INTERVAL_S) -> None:
    """Sweep adopted orphans for as long as the supervisor runs. A sweep that fails (out of file descriptors, say)
    is logged and tried again next time: it must never take the supervisor down."""
    while True:
        try:
            await trio.to_thread.run_sync(sweep_adopted)
        except OSError as exc:
            warn_scan_failed("sweeping adopted orphans", exc)
        await trio.sleep(interval_s)


#: errnos that mean "no descriptor (or memory) to open /proc with now": a scan is retried or skipped, never
#: taken as "nothing there".
DESCRIPTORS_EXHAUSTED = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM})
_T = TypeVar("_T")
#: Seconds between tries of a scan that has to finish when descriptors ran out.
_EMFILE_RETRY_S = 0.1
#: Seconds between two warnings about /proc scans that failed (they come in bursts).
_WARN_EVERY_S = 10.0
_last_warning = [float("-inf")]


def scan_retrying(what: str, scan: Callable[[], _T], *, for_s: float | None) -> _T:
    """``scan()`` of /proc, tried again (with a warning) while descriptors are exhausted, for up to ``for_s``
    seconds (None: until it succeeds). Blocks: run it in a thread. Any other OSError, or the last one once the
    time is up, goes to the caller: a scan that could not look never answers "nothing there"."""
    deadline = None if for_s is None else time.monotonic() + for_s
    while True:
        try:
            return scan()
        except OSError as exc:
            if exc.errno not in DESCRIPTORS_EXHAUSTED or (deadline is not None and time.monotonic() > deadline):
                raise
            warn_scan_failed(what, exc)
        time.sleep(_EMFILE_RETRY_S)


def warn_scan_failed(what: str, exc: OSError, then: str = "trying again shortly") -> None:
    """Log (at most every _WARN_EVERY_S, for every scan of /proc in the supervisor) that a scan failed, what
    happens next, and what to do."""
    now = time.monotonic()
    if now - _last_warning[0] >= _WARN_EVERY_S:
        _last_warning[0] = now
        log.warning("%s failed (%s); %s. If this is EMFILE, raise LimitNOFILE= or lower the API's "
                    "--max-connections", what, exc, then)
