"""A child process as its owner sees it, however it was started: spawned here in a session of its own
(``run_in_own_session``), or started elsewhere and adopted (``StartedProcess`` -> ``AdoptedProcess``, held by
``hold``). One protocol (``ChildProcess``) covers both, so one teardown serves each kind of child.

Started elsewhere means: with ``subprocess.Popen`` before trio was imported (a worker ``codesdk run`` starts ahead
of its supervisor, a runtime's program a worker starts ahead of its task), or forked by the worker template and
re-parented to a supervisor that is a child subreaper (``ForkedChild``). trio offers no public way to wrap those.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import IO, Protocol, Required, TypedDict, Unpack

import trio

from .children import Children


class ChildProcess(Protocol):
    """What a child's process object offers: a ``trio.Process``, or an ``AdoptedProcess``."""

    @property
    def pid(self) -> int: ...
    @property
    def returncode(self) -> int | None: ...
    @property
    def stdin(self) -> trio.abc.SendStream | None: ...
    @property
    def stdout(self) -> trio.abc.ReceiveStream | None: ...
    @property
    def stderr(self) -> trio.abc.ReceiveStream | None: ...
    async def wait(self) -> int: ...


#: How a process is ended when the task holding it is cancelled (trio's ``deliver_cancel``).
DeliverCancel = Callable[[ChildProcess], Awaitable[object]]


class Reapable(Protocol):
    """Who reaps a child started outside trio: its ``subprocess.Popen``, or a ``ForkedChild``."""

    @property
    def pid(self) -> int: ...
    @property
    def returncode(self) -> int | None: ...
    def poll(self) -> int | None: ...


class ForkedChild:
    """A child of ours that we did not fork ourselves: a worker the template forked, re-parented to us (we are a
    child subreaper). ``poll`` reaps it as ``Popen.poll`` does."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped by someone else: its status is lost, it is gone
                self.returncode = -signal.SIGKILL
            else:
                if pid == self.pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode


@dataclass(frozen=True)
class StartedProcess:
    """A child started before its owner took it: who reaps it, and our ends of its stdio pipes, as descriptors the
    adopter owns. ``children``: where it is owned until it is reaped (a private registry where nothing sweeps)."""

    child: Reapable
    stdin: int
    stdout: int
    stderr: int
    children: Children = field(default_factory=Children)

    @classmethod
    def of_popen(cls, popen: subprocess.Popen[bytes], children: Children | None = None) -> StartedProcess:
        """Its pipes taken from ``popen``; OSError (out of descriptors) leaves ``popen`` as it was."""
        streams = (popen.stdin, popen.stdout, popen.stderr)
        fds: list[int] = []
        try:
            for stream in streams:
                assert stream is not None
                fds.append(os.dup(stream.fileno()))
        except OSError:
            for fd in fds:
                os.close(fd)
            raise
        for stream in streams:
            assert stream is not None
            stream.close()
        return cls(popen, fds[0], fds[1], fds[2], children if children is not None else Children())

    def close(self) -> None:
        """Close our ends of its pipes (it was not adopted: ``orphans.discard`` ends it)."""
        for fd in (self.stdin, self.stdout, self.stderr):
            os.close(fd)


class AdoptedProcess:
    """A ``StartedProcess`` seen as a ``trio.Process``: its pipes as trio streams, ``wait`` woken by a pidfd. Any
    number of tasks may wait; the first to see the exit reaps it, and disowns it where it was owned."""

    def __init__(self, started: StartedProcess) -> None:
        """OSError (no descriptor for its pidfd): then nothing is taken over (``orphans.discard`` ends it)."""
        self._child = started.child
        self._children = started.children
        self._pidfd: int | None = os.pidfd_open(started.child.pid)
        self.stdin: trio.abc.SendStream | None = trio.lowlevel.FdStream(started.stdin)
        self.stdout: trio.abc.ReceiveStream | None = trio.lowlevel.FdStream(started.stdout)
        self.stderr: trio.abc.ReceiveStream | None = trio.lowlevel.FdStream(started.stderr)
        self._waiting = trio.Lock()  # one task at a time waits on the pidfd (trio allows one waiter per fd)

    @classmethod
    def of_popen(cls, popen: subprocess.Popen[bytes], children: Children | None = None) -> AdoptedProcess:
        """``popen``, adopted; OSError (out of descriptors): its caller ends it (its pipes may be closed)."""
        started = StartedProcess.of_popen(popen, children)
        try:
            return cls(started)
        except OSError:
            started.close()
            raise

    @property
    def pid(self) -> int:
        return self._child.pid

    @property
    def returncode(self) -> int | None:
        return self._child.returncode

    async def wait(self) -> int:
        async with self._waiting:
            while self._child.poll() is None:
                assert self._pidfd is not None
                await trio.lowlevel.wait_readable(self._pidfd)
            if self._pidfd is not None:  # just reaped, by this task
                self._children.disown(self._child.pid)
                trio.lowlevel.notify_closing(self._pidfd)
                os.close(self._pidfd)
                self._pidfd = None
        assert self._child.returncode is not None
        return self._child.returncode


async def hold(process: AdoptedProcess, deliver_cancel: DeliverCancel,
               task_status: trio.TaskStatus[AdoptedProcess] = trio.TASK_STATUS_IGNORED) -> None:
    """What ``trio.run_process`` does for a process it started, for one it is handed (with ``nursery.start``): hold
    it until it exits; if cancelled first, end it with ``deliver_cancel`` and still reap it (shielded)."""
    task_status.started(process)
    try:
        await process.wait()
    except BaseException:
        with trio.CancelScope(shield=True):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(deliver_cancel, process)
                await process.wait()
                nursery.cancel_scope.cancel()
        raise


#: Where a child's stdin, stdout or stderr goes: ``subprocess.PIPE``/``DEVNULL``, a descriptor, a file.
Stdio = int | IO[bytes] | None


class SessionChild(TypedDict, total=False):
    """How ``session_child`` starts a child: where it is owned, how it is ended when cancelled, and the options of
    ``trio.run_process`` it is given."""

    children: Required[Children]
    deliver_cancel: Required[DeliverCancel]
    stdin: Required[Stdio]
    stdout: Required[Stdio]
    stderr: Required[Stdio]
    env: Required[Mapping[str, str]]
    cwd: str | None
    user: int | None
    group: int | None
    extra_groups: Sequence[int] | None


@asynccontextmanager
async def session_child(argv: Sequence[str], **options: Unpack[SessionChild],
                        ) -> AsyncIterator[tuple[trio.Process, trio.Nursery]]:
    """A child leading a session of its own, run by ``trio.run_process`` in a nursery that waits for it when the
    block ends (and ends it with ``deliver_cancel`` when cancelled), and owned in ``children`` from the moment its
    start begins until it has been reaped: its exit status is its owner's, not the orphan sweep's. Yields it and
    that nursery; the start's OSError is raised bare (not in an exception group)."""
    start_error: OSError | None = None
    extra_groups = options.get("extra_groups")
    with options["children"].owned_child() as own:
        async with trio.open_nursery() as nursery:
            try:
                process: trio.Process = await nursery.start(partial(
                    trio.run_process, list(argv), stdin=options["stdin"], stdout=options["stdout"],
                    stderr=options["stderr"], env=dict(options["env"]), cwd=options.get("cwd"), check=False,
                    start_new_session=True, user=options.get("user"), group=options.get("group"),
                    extra_groups=list(extra_groups) if extra_groups is not None else None,
                    deliver_cancel=options["deliver_cancel"]))
            except OSError as exc:
                start_error = exc
            else:
                own(process.pid)
                yield process, nursery
    if start_error is not None:
        raise start_error


async def run_in_own_session(argv: Sequence[str], *,
                             task_status: trio.TaskStatus[trio.Process] = trio.TASK_STATUS_IGNORED,
                             **options: Unpack[SessionChild]) -> None:
    """``session_child`` for ``nursery.start``: the child, held until it exits."""
    async with session_child(argv, **options) as (process, _):
        task_status.started(process)


async def close_and_reap(process: ChildProcess) -> None:
    """Close our ends of a process's pipes and wait for its exit status (shielded)."""
    with trio.CancelScope(shield=True):
        for stream in (process.stdin, process.stdout, process.stderr):
            if stream is not None:
                await stream.aclose()
        await process.wait()
