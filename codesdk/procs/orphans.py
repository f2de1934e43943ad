"""Reaping what a process adopts as a child subreaper (``Orphans``), and what a session leader leaves behind
(``end_session``, ``end_command``, ``reap_session``, ``discard``).

A supervisor marks itself a child subreaper (``become_subreaper``), so when a worker or a tool command dies,
whatever it left running is re-parented to it rather than to pid 1 (which in a container may never reap). Those
orphans must be reaped there, without ever stealing the exit status of a process someone else there waits for (its
owner would read "exit 0"). The rule that makes that safe: every process the supervisor spawns and waits for either
stays in the supervisor's session (short probes), or leads a session of its own and is owned in the process's one
registry (``children.Children``) from the moment its start begins until it has been reaped. An adopted orphan is
neither: it belongs to the session of a leader that died, or it leads a session it made itself (a helper a runtime
detached before exiting). Only those are reaped.
"""

from __future__ import annotations

import logging
import os
import signal
import time

import psutil
import trio

from .children import Children
from .process import ChildProcess, Reapable
from .scan import Scans, Stat, session_of, stat
from .tree import pid_in_use, signal_group, signal_group_of

log = logging.getLogger("codesdk.supervisor.orphans")

#: Seconds between sweeps while the supervisor runs.
SWEEP_INTERVAL_S = 1.0
#: Seconds between looks at a dying session member that is not (yet) our child, so cannot be waited for.
_MEMBER_POLL_S = 0.01
#: Seconds between looks at whether the starts a sweep waits for have ended (a start takes milliseconds).
_START_POLL_S = 0.005
#: Seconds between looks at a killed session's members re-parented to us (``reap_session``).
_REAP_POLL_S = 0.01
#: Seconds between rounds of ending the adopted orphans at shutdown (``Orphans.end_adopted``).
_END_POLL_S = 0.02


def become_subreaper() -> bool:
    """Adopt orphaned descendants (Linux ``PR_SET_CHILD_SUBREAPER``), so they are reaped here rather than left
    as zombies under a pid 1 that may not reap. Whoever calls it holds the process's ``Children`` registry."""
    import ctypes

    pr_set_child_subreaper = 36
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(pr_set_child_subreaper, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


class Orphans:
    """The sweep of the orphans this process adopted. It leaves alone every child owned in ``children``, and every
    child whose start is under way there: give it the one registry every spawner in this process uses (a second
    registry's children would look like orphans to it)."""

    def __init__(self, children: Children, scans: Scans | None = None) -> None:
        self.children = children
        self.scans = scans if scans is not None else Scans()

    def adopted(self) -> list[psutil.Process]:
        """Our children that are adopted orphans (running or zombie): outside our session and not owned. [] when
        /proc cannot be read now (out of file descriptors: the next sweep tries again). A child being started may be
        among them; ``sweep`` waits for those starts before it reaps."""
        ours = os.getsid(0)
        try:
            children = psutil.Process().children()
        except psutil.Error:
            return []
        except OSError as exc:  # EMFILE/ENFILE: psutil opens a file per process
            self.scans.failed("listing adopted orphans", exc)
            return []
        owned = self.children.owned()
        return [child for child in children if session_of(child.pid) not in (None, ours) and child.pid not in owned]

    def settled(self) -> list[psutil.Process]:
        """``adopted``, less those whose start was under way: it waits (blocks: run it in a thread) for the starts
        under way once the orphans were listed to end, so that a child just started, whose owner did not know its
        pid yet when it was listed, is owned by then and left alone."""
        orphans = self.adopted()
        if not orphans:
            return []
        pending = self.children.starts_under_way()  # taken after the listing: any start that made one is in it
        while pending & self.children.starts_under_way():
            time.sleep(_START_POLL_S)
        owned = self.children.owned()
        return [orphan for orphan in orphans if orphan.pid not in owned]

    def sweep(self) -> list[int]:
        """Reap every zombie child of ours that is an adopted orphan (see ``settled``); their pids. Blocks: run it in
        a thread."""
        reaped: list[int] = []
        for orphan in self.settled():
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

    async def forever(self, interval_s: float = SWEEP_INTERVAL_S) -> None:
        """Sweep for as long as the supervisor runs. A sweep that fails (out of file descriptors, say) is logged and
        tried again next time: it must never take the supervisor down."""
        while True:
            try:
                await trio.to_thread.run_sync(self.sweep)
            except OSError as exc:
                self.scans.failed("sweeping adopted orphans", exc)
            await trio.sleep(interval_s)

    async def end_adopted(self, wait_s: float) -> None:
        """At shutdown: SIGKILL adopted orphans still running, and reap them all (bounded)."""
        with trio.move_on_after(wait_s):
            while orphans := await trio.to_thread.run_sync(self.settled):  # never a child whose start is under way
                for orphan in orphans:
                    try:
                        orphan.kill()
                    except psutil.Error:
                        pass
                await trio.to_thread.run_sync(self.sweep)
                await trio.sleep(_END_POLL_S)


def reap_session(sid: int, children: Children, scans: Scans, wait_s: float = 2.0,
                 extra: set[int] | frozenset[int] = frozenset()) -> None:
    """After the group ``sid`` led was killed: reap its members re-parented to us, and the pids in ``extra`` (known
    descendants that left the session), waiting up to ``wait_s`` for them to die. Never the leader itself (whoever
    spawned it waits for it), nor a child owned in ``children`` (a pid of ``extra`` may be one's now). Bounded, so a
    worker's teardown never hangs on its orphans; what is still dying when the time is up is left to the sweep."""
    deadline = time.monotonic() + wait_s
    me = os.getpid()
    while True:
        try:
            members = [c for c in psutil.Process(me).children(recursive=True)
                       if c.pid != sid and (c.pid in extra or session_of(c.pid) == sid)]
        except psutil.Error:
            return
        except OSError as exc:  # out of descriptors: what is left is reaped by the periodic sweep
            scans.failed(f"reaping session {sid}", exc)
            return
        owned = children.owned()
        for member in members:
            try:
                if member.ppid() == me and member.pid not in owned:  # re-parented to us (running: next round)
                    os.waitpid(member.pid, os.WNOHANG)
            except (ChildProcessError, psutil.Error, OSError):
                pass
        if not members or time.monotonic() > deadline:
            return
        time.sleep(_REAP_POLL_S)


async def end_command(process: ChildProcess, scans: Scans) -> None:
    """End a command started in a session of its own: SIGKILL its group and reap all it started before returning —
    the leader first, so that what it started has been re-parented by the time its session is ended. Shielded, so
    that a cancelled call does not leave half of it behind; not bounded in time, so that a slow machine does not
    either."""
    with trio.CancelScope(shield=True):
        signal_group_of(process, signal.SIGKILL)  # also once it exited by itself: what it started
        await process.wait()
        await trio.to_thread.run_sync(end_session, process.pid, scans)


def end_session(sid: int, scans: Scans) -> None:
    """After the leader of session ``sid`` has exited and been reaped: SIGKILL what is left of the session and
    reap each member that is our child, until only zombies someone else reaps are left. Blocks; run it in a thread.

    The leader goes first so that whatever it started has been re-parented (to us, a child subreaper, or to
    pid 1) before we look. No time bound: giving up leaves a member that was still dying to become a zombie that
    nobody reaps. Members of ours are waited for (``waitpid``), others (a dying member's children, pid 1's) are
    looked at until they are dead; a slow machine only makes this slower."""
    me = os.getpid()
    unkillable: set[int] = set()
    while True:
        if pid_in_use(sid):  # the leader is gone: a process with its pid means no member reserves the id any more
            return  # and the pid is another's now, whose session this is not
        # out of descriptors to read /proc: wait for some, never give up (see above)
        found = scans.retrying(f"ending session {sid}", lambda: _session_members(sid), for_s=None)
        members = {pid: member for pid, member in found.items() if pid not in unkillable}
        if all(member.zombie and member.parent != me for member in members.values()):
            return
        for pid in members:  # zombies too: a process whose main thread ended looks like one
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            except PermissionError:  # it gained another uid (a set-uid program): it is out of our reach
                log.warning("cannot kill %d, left over from session %d: not permitted", pid, sid)
                unkillable.add(pid)
        ours = [pid for pid, member in members.items() if member.parent == me and pid not in unkillable]
        for pid in ours:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:  # reaped meanwhile by the periodic sweep
                pass
        if not ours:
            time.sleep(_MEMBER_POLL_S)


def discard(child: Reapable, children: Children, scans: Scans) -> None:
    """End a child started elsewhere and never adopted (nothing else will), its pipes closed: SIGKILL its process
    group, reap it (and disown it) and, if it leads a session, end what is left of that session (a worker's runtime
    started ahead leads a group of its own there). Blocks for as long as that takes: SIGKILL cannot be refused."""
    pid = child.pid
    if child.returncode is None:  # not reaped yet: its pid is its own
        try:
            leads_session = os.getsid(pid) == pid
        except OSError:
            leads_session = False
        signal_group(pid, signal.SIGKILL)
        while child.poll() is None:
            try:
                os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
            except ChildProcessError:  # reaped by someone else: poll says so
                pass
    else:  # reaped already: what is left of its group and session still holds its pid as their id (or nothing is)
        leads_session = not pid_in_use(pid)
        if leads_session:
            signal_group(pid, signal.SIGKILL)
    children.disown(pid)
    if leads_session:
        end_session(pid, scans)


def _session_members(sid: int) -> dict[int, Stat]:
    """Every process of session ``sid`` but its leader, alive or zombie, wherever it was re-parented. OSError if
    /proc cannot be read now (out of descriptors) — never a partial answer."""
    members: dict[int, Stat] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != sid and (found := stat(int(name), strict=True)) is not None \
                and found.session == sid:
            members[int(name)] = found
    return members
