"""A runtime's own program, run by its adapter: own process group, stdio pipes, stderr tail, crash reports, and
the receipt of how it ended.

Every runtime that is a separate program (Claude Code, Codex, an ACP agent) is started through ``RuntimeProcess``:

- it leads its own process group, so ending it ends the group and whatever it started, also what left the group
  (``codesdk.procs.tree.end_tree``: SIGTERM, a grace, SIGKILL); nothing is left when the task ends, is stopped, or
  is cancelled. The group stays in the worker's session: if the worker itself is killed, the supervisor (a child
  subreaper) reaps what that session left behind, which it does not do for a process that leads a session of its
  own;
- its stderr is drained all the time (a full pipe would stall it) and the last 64 KiB are kept;
- its stdout is read as lines (bounded: a line over ``max_line_bytes`` is an error, never unbounded memory);
- when it dies while the task still needs it, ``crashed()`` is the ``RuntimeCrashed`` to raise: exit code or
  signal, and the stderr tail.

A program started ahead of its task (``RuntimeAhead``) is a ``codesdk.procs.process.AdoptedProcess``, held as one
started here.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from contextvars import ContextVar
from functools import partial
from typing import TYPE_CHECKING

import trio

from codesdk.procs.launch import Launch
from codesdk.procs.process import AdoptedProcess, ChildProcess, close_and_reap, hold
from codesdk.procs.tree import descendants, end_tree, group_gone, signal_group, signal_group_of
from codesdk.protocol import BadFrame, EscapedProcess, ExitStatus, LineFramer, ProcessEnd, StderrTail

from .. import _recording as recording
from .._ahead import AHEAD_TTL_S, StartedAhead, start_ahead
from .base import RuntimeCrashed

if TYPE_CHECKING:
    import psutil

log = logging.getLogger("codesdk.worker.runtime")

#: Seconds a runtime gets to exit after SIGTERM before SIGKILL.
TERM_GRACE_S = 2.0
#: Largest stdout line accepted from a runtime (stream-json messages carry whole tool results).
MAX_LINE_BYTES = 64 * 1024 * 1024


class RuntimeAhead:
    """A runtime's program, started before its task: ``take`` hands it over to the task that composes the same
    launch; ``discard`` ends it. Either happens once; both are safe to call again."""

    def __init__(self, runtime: str, launch: Launch, process: AdoptedProcess) -> None:
        self.runtime = runtime
        self.launch = launch
        self._process: AdoptedProcess | None = process

    @classmethod
    def adopt(cls, started: StartedAhead) -> RuntimeAhead | None:
        """Take charge of a program ``_ahead.start_ahead`` started; None (it is killed and reaped) if it cannot be
        watched (no descriptor for its pidfd)."""
        try:
            process = AdoptedProcess.of_popen(started.popen)
        except OSError as exc:
            log.info("not using the %s started ahead: %s", started.runtime, exc)
            signal_group(started.popen.pid, signal.SIGKILL)
            started.popen.wait()  # SIGKILLed: a moment
            return None
        return cls(started.runtime, started.launch, process)

    @classmethod
    def start(cls, runtime: str, hint: Mapping[str, object]) -> RuntimeAhead | None:
        """Start ``runtime``'s program now and take charge of it (the worker starts it before it imports trio,
        with ``_ahead.start_ahead``, and adopts it once trio runs)."""
        started = start_ahead(runtime, hint)
        return cls.adopt(started) if started is not None else None

    async def take(self, runtime: str, launch: Launch) -> AdoptedProcess | None:
        """The program, if it is unclaimed, alive, of ``runtime`` and launched exactly as ``launch``; else it is
        ended (it can serve nobody else) and None returned: the caller starts its own."""
        process = self._process
        if process is None:
            return None
        if runtime != self.runtime or launch != self.launch or process.returncode is not None:
            why = ", ".join(self.launch.differences(launch)) if runtime == self.runtime else f"runtime {runtime}"
            log.info("not using the %s started ahead (%s); starting another", self.runtime, why or "it has exited")
            await self.discard()
            return None
        self._process = None
        return process

    async def expire(self, after_s: float = AHEAD_TTL_S) -> None:
        """End the program if no task has claimed it after ``after_s`` (run in the worker's nursery)."""
        await trio.sleep(after_s)
        if self._process is not None:
            log.info("the %s started ahead was not claimed within %.0f s; ending it", self.runtime, after_s)
            await self.discard()

    async def discard(self) -> None:
        """SIGKILL the unclaimed program's process group and reap it."""
        process, self._process = self._process, None
        if process is None:
            return
        with trio.CancelScope(shield=True):
            signal_group_of(process, signal.SIGKILL)
            await close_and_reap(process)


class RuntimeOutputError(Exception):
    """The runtime wrote something on stdout that is not a line we can take (too long)."""


#: What stands in for the runtime's program in this context, instead of starting it: a replay of a recording
#: (``codesdk.testing.replay``) runs an adapter's real code against what its program once wrote. Called with the
#: argv the adapter would have started, and the program's name for messages.
stand_in: ContextVar[Callable[[Sequence[str], str], AbstractAsyncContextManager[RuntimeProcess]] | None] = ContextVar(
    "codesdk_runtime_stand_in", default=None)


#: Where the runtime processes of the task running in this context are reported as they are ended (the worker
#: sets one per task; a stop's receipt lists them).
ended_processes: ContextVar[list[ProcessEnd] | None] = ContextVar("codesdk_ended_processes", default=None)

#: How long an ended process group is watched for its last members to be reaped before it is reported not gone.
GONE_WAIT_S = 1.0


class RuntimeProcess:
    """One running runtime program. Create with ``async with RuntimeProcess.open(...)``."""

    def __init__(self, process: ChildProcess, name: str, max_line_bytes: int) -> None:
        self.process = process
        self.name = name
        self.stderr = StderrTail()
        self._framer = LineFramer(max_line_bytes)
        self.exited = trio.Event()

    @classmethod
    @asynccontextmanager
    async def open(cls, argv: Sequence[str], *, env: Mapping[str, str], cwd: str | None = None,
                   name: str | None = None, max_line_bytes: int = MAX_LINE_BYTES,
                   term_grace_s: float = TERM_GRACE_S, started: AdoptedProcess | None = None,
                   ) -> AsyncIterator[RuntimeProcess]:
        """Start ``argv`` (or take over ``started``: the same program, started ahead with pipes on its stdio and its
        own process group); on leaving the block (however it is left) the process group is ended and reaped."""
        label = name or os.path.basename(argv[0])
        if (replay := stand_in.get()) is not None:
            async with replay(argv, label) as stand_in_process:
                yield stand_in_process
            return
        recording.record("spawn", program=os.path.basename(argv[0]), started_ahead=started is not None)
        owned: list[RuntimeProcess] = []  # once it holds the runtime, the block's finally ends it (runtime.end)

        async def deliver_cancel(process: ChildProcess) -> None:
            """A cancellation reaching ``run_process`` leaves the ending to ``runtime.end``, so the group is signalled
            by one of them only and its account of how it ended is the true one."""
            if owned:
                await process.wait()
            else:  # cancelled while being started: nobody else will end it
                await end_tree(process, (), term_grace_s)

        try:
            async with trio.open_nursery() as nursery:
                process: ChildProcess
                if started is not None:  # held as run_process holds one it starts
                    process = await nursery.start(hold, started, deliver_cancel)
                else:
                    process = await nursery.start(partial(
                        trio.run_process, list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE, env=dict(env), cwd=cwd, check=False, process_group=0,
                        deliver_cancel=deliver_cancel))
                runtime = cls(process, label, max_line_bytes)
                owned.append(runtime)
                nursery.start_soon(runtime._pump_stderr)
                nursery.start_soon(runtime._watch_exit)
                try:
                    yield runtime
                finally:
                    with trio.CancelScope(shield=True):
                        await runtime.end(term_grace_s)
                    nursery.cancel_scope.cancel()
        finally:
            if started is not None:  # our ends of its pipes are ours to close (the ones run_process made go with it)
                await close_and_reap(started)

    @property
    def pid(self) -> int:
        return int(self.process.pid)

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    async def send(self, data: bytes) -> None:
        """Write to the runtime's stdin (``trio.BrokenResourceError`` once it is gone)."""
        assert self.process.stdin is not None
        recording.record("stdin", data=data.decode("utf-8", "replace"))
        await self.process.stdin.send_all(data)

    async def close_stdin(self) -> None:
        recording.record("stdin_closed")
        if self.process.stdin is not None:
            try:
                await self.process.stdin.aclose()
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass

    async def lines(self) -> AsyncGenerator[bytes, None]:
        """stdout, line by line (without the newline), until EOF. ``RuntimeOutputError`` for an oversized line."""
        assert self.process.stdout is not None
        while True:
            try:
                chunk = await self.process.stdout.receive_some(64 * 1024)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                chunk = b""
            items = self._framer.feed(chunk) if chunk else self._framer.close()
            for item in items:
                if isinstance(item, BadFrame):
                    raise RuntimeOutputError(f"{self.name} wrote an unusable line on stdout: {item.detail}")
                recording.record("stdout", line=item.decode("utf-8", "replace"))
                yield item
            if not chunk:
                recording.record("stdout_end")
                return

    async def wait(self) -> ExitStatus:
        await self.exited.wait()
        return self.status()

    def status(self) -> ExitStatus:
        returncode = self.process.returncode
        return ExitStatus.from_returncode(returncode if returncode is not None else -signal.SIGKILL)

    def crashed(self) -> RuntimeCrashed:
        """The error for a runtime that ended while a task needed it (call once it has exited)."""
        return RuntimeCrashed(self.name, self.pid, self.status(), self.stderr.text())

    async def end(self, grace_s: float = TERM_GRACE_S) -> None:
        """End the whole process group: close stdin, SIGTERM, ``grace_s``, SIGKILL; wait until reaped. What it
        started and moved out of its group (a built-in shell's children) is SIGKILLed too, found while the program
        still runs (once it is reaped its pid may belong to someone else). How it ended, checked, is reported
        (``ended_processes``)."""
        with trio.CancelScope(shield=True):
            escaped = self._descendants()
            outside = _outside_group(escaped, self.pid)
            await self.close_stdin()
            term_sent, kill_sent = await end_tree(self.process, escaped, grace_s)  # the group also if it exited
            with trio.move_on_after(grace_s):
                await self.exited.wait()
            ledger = ended_processes.get()
            if ledger is not None:
                ledger.append(ProcessEnd(name=self.name, pid=self.pid, exit=self.status().describe(),
                                         term_sent=term_sent, kill_sent=kill_sent, escaped_killed=len(outside),
                                         escaped=tuple(outside[:MAX_ESCAPED_NAMED]),
                                         gone=await group_gone(self.pid, escaped, GONE_WAIT_S)))

    def _descendants(self) -> list[psutil.Process]:
        return [] if self.process.returncode is not None else descendants(self.pid)

    async def _watch_exit(self) -> None:
        await self.process.wait()
        recording.record("exit", returncode=self.process.returncode)
        self.exited.set()

    async def _pump_stderr(self) -> None:
        assert self.process.stderr is not None
        try:
            async for chunk in self.process.stderr:
                for line in self.stderr.feed(chunk):
                    log.info("%s: %s", self.name, line)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass


#: How many escaped processes a ``ProcessEnd`` names (all are counted).
MAX_ESCAPED_NAMED = 20


def _outside_group(tree: Sequence[psutil.Process], pgid: int) -> list[EscapedProcess]:
    """The members of ``tree`` (a program's descendants) that left its process group, named (pid, command line)
    while they still run; one gone meanwhile, or unreadable, counts as still in the group (nothing to name)."""
    import psutil

    found: list[EscapedProcess] = []
    for process in tree:
        try:
            if os.getpgid(process.pid) == pgid:
                continue
            command = " ".join(process.cmdline()) or process.name()
        except (ProcessLookupError, psutil.Error, OSError):
            continue
        found.append(EscapedProcess(pid=process.pid, command=command[:500]))
    return found
