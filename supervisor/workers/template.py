"""The supervisor's side of the worker template (``worker/template.py``): start it, ask it for workers.

A worker forked by the template answers its handshake in tens of milliseconds instead of the ~0.3-0.5 s a new
interpreter spends importing, and shares the template's imported code and built models. The pool uses it for
every worker launched as ``codesdk-worker`` (``PoolConfig.template``); any other worker program is started as
before. The template is only ever a way to start a worker faster: when it cannot answer, the pool logs why and
starts the worker the usual way, and tries the template again after ``RETRY_AFTER_S``.

The worker it forks becomes our child (it is re-parented to us, a child subreaper) and leads its own session, so
the pool owns it exactly like one it spawned (``codesdk.procs.process.AdoptedProcess``), in the registry of
children the template is given. Requests are answered one at a time.
"""

from __future__ import annotations

import array
import json
import logging
import os
import signal
import socket
import struct
import subprocess
from collections.abc import Callable, Mapping, Sequence
from functools import partial

import trio

from codesdk.procs.children import Children
from codesdk.procs.launch import Launch
from codesdk.procs.orphans import discard
from codesdk.procs.process import ChildProcess, ForkedChild, StartedProcess, run_in_own_session
from codesdk.procs.scan import Scans
from codesdk.procs.tree import signal_group
from codesdk.protocol import ExitStatus


log = logging.getLogger("codesdk.supervisor.template")

#: Seconds before a template that failed is tried again (meanwhile workers start the usual way).
RETRY_AFTER_S = 60.0
#: Seconds the template gets to import everything and say it is ready (~0.5 s on an idle machine).
READY_TIMEOUT_S = 30.0
#: Seconds one fork may take before the template is taken for stuck, ended, and the worker started the usual way
#: (a fork takes ~20 ms).
FORK_TIMEOUT_S = 5.0
_LENGTH = struct.Struct(">I")


class TemplateUnavailable(Exception):
    """The template could not fork this worker; the message says why. The worker is started the usual way."""


class _TemplateBroke(Exception):
    """The template said something it should not have, or nothing: it is ended (and restarted later)."""


class WorkerTemplate:
    """One template process at a time, owned by the pool's nursery: started in the background (``ensure_started``),
    never waited for — until it is ready, and while it is down, workers start the usual way."""

    def __init__(self, worker_argv: Sequence[str], env: Mapping[str, str], children: Children) -> None:
        #: How the pool starts a worker (``PoolConfig.worker_argv()``); the template is that with ``--template``,
        #: and each worker it forks runs with the same options.
        self.worker_argv = tuple(worker_argv)
        self._env = dict(env)
        #: Where the template and every worker it forks are owned until reaped (the pool's ``PoolConfig.children``).
        self.children = children
        self._lock = trio.Lock()
        self._running = False  # a process is starting or ready (``_run`` owns it)
        self._socket: trio.socket.SocketType | None = None  # set while it is ready
        self._process: trio.Process | None = None  # the template process, while it runs
        self._scope: trio.CancelScope | None = None
        self._stopping = False  # this process's end was asked for (and logged) already
        self._failed_at: float | None = None
        self._failure: str | None = None
        self._permanent: str | None = None  # a reason that does not go away with a retry
        self._closed = False

    def state(self) -> str:
        """For operators: ``ready``, ``starting``, ``off: why`` (for good), or ``down: why`` (retried later)."""
        if self._permanent is not None:
            return f"off: {self._permanent}"
        if self._socket is not None:
            return "ready"
        if self._running:
            return "starting"
        return f"down: {self._failure or 'not started yet'}"

    def ensure_started(self, nursery: trio.Nursery) -> None:
        """Start the template in the background, unless it runs, is off, or failed within ``RETRY_AFTER_S``."""
        if self._running or self._permanent is not None or self._closed:
            return
        if self._failed_at is not None and trio.current_time() - self._failed_at < RETRY_AFTER_S:
            return
        self._running, self._stopping = True, False
        nursery.start_soon(self._run)

    async def fork(self, nursery: trio.Nursery, launch: Launch) -> StartedProcess:
        """A worker forked as ``launch`` says, already our child; ``TemplateUnavailable`` (at once) when the
        template is not ready or cannot fork it."""
        self.ensure_started(nursery)
        async with self._lock:
            if self._permanent is not None:
                raise TemplateUnavailable(self._permanent)
            sock = self._socket
            if sock is None:
                raise TemplateUnavailable(f"it is {self.state()}")
            # Shielded (and bounded): a request given up half-way would leave the socket out of step and the
            # worker it forked owned by nobody.
            with trio.CancelScope(shield=True):
                try:
                    with trio.fail_after(FORK_TIMEOUT_S), self.children.starting() as own:
                        started = await self._fork(sock, launch, own)
                except trio.TooSlowError as exc:
                    why = f"it did not answer a fork within {FORK_TIMEOUT_S:.0f} s"
                    self._stop(why)
                    raise TemplateUnavailable(why) from exc
                except (OSError, ValueError, _TemplateBroke, trio.BrokenResourceError) as exc:
                    # A template that died breaks the request (its socket closes): its death is what to report.
                    died = self._process.poll() if self._process is not None else None
                    why = (f"it exited ({ExitStatus.from_returncode(died).describe()})" if died is not None
                           else f"it failed to fork a worker ({_describe(exc)})")
                    self._stop(why)
                    raise TemplateUnavailable(why) from exc
        try:
            await trio.lowlevel.checkpoint_if_cancelled()
        except BaseException:  # the start was given up meanwhile: the forked worker goes, reaped
            started.close()
            discard(started.child, self.children, Scans())
            raise
        return started

    def close(self) -> None:
        """End the template for good (the pool is closing): ``_run`` ends and reaps it."""
        self._closed = True
        if self._scope is not None:
            self._scope.cancel()

    # -- internals ------------------------------------------------------------------------------

    async def _run(self) -> None:
        """Own one template process: start it, serve forks once it says it is ready, end and reap it when it
        dies, stalls or is closed. Never raises: whatever goes wrong, workers start the usual way."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with trio.CancelScope() as scope, ours:
                self._scope = scope
                if self._closed:
                    scope.cancel()
                sock = trio.socket.from_stdlib_socket(ours)
                async with trio.open_nursery() as nursery:
                    with theirs:
                        process: trio.Process = await nursery.start(partial(
                            run_in_own_session, [*self.worker_argv, "--template"], children=self.children,
                            deliver_cancel=_end_template, stdin=theirs.fileno(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env=self._env, cwd="/"))
                    self._process = process
                    nursery.start_soon(_pump_stderr, process)
                    try:
                        with trio.fail_after(READY_TIMEOUT_S):
                            ready = await sock.recv(1)
                    except trio.TooSlowError:
                        raise _TemplateBroke(f"it was not ready within {READY_TIMEOUT_S:.0f} s") from None
                    if ready != b"R":
                        raise _TemplateBroke("it ended before it was ready" if not ready else f"it said {ready!r}")
                    log.info("worker template ready (pid %d)", process.pid)
                    self._socket = sock
                    returncode = await process.wait()
                    self._stop(f"it exited ({ExitStatus.from_returncode(returncode).describe()})")
        except Exception as exc:  # noqa: BLE001 - also an ExceptionGroup of its tasks: never the pool's problem
            self._stop(_describe(exc))
        finally:
            theirs.close()
            self._socket, self._scope, self._running, self._process = None, None, False, None

    def _stop(self, why: str) -> None:
        """End the current process (once), and start no other for ``RETRY_AFTER_S``."""
        if not self._stopping and not self._closed:
            log.warning("the worker template stopped: %s; workers start the usual way, the template is tried "
                        "again in %.0f s", why, RETRY_AFTER_S)
        self._stopping = True
        self._failed_at, self._failure = trio.current_time(), why
        self._socket = None
        if self._scope is not None:
            self._scope.cancel()

    async def _fork(self, sock: trio.socket.SocketType, launch: Launch, own: Callable[[int], None],
                    ) -> StartedProcess:
        pipes: list[int] = []
        try:
            for _ in range(3):
                pipes += os.pipe()
        except OSError as exc:  # out of descriptors: this start fails, not the template
            for fd in pipes:
                os.close(fd)
            raise TemplateUnavailable(f"no descriptors for the worker's pipes: {exc}") from exc
        stdin_r, stdin_w, stdout_r, stdout_w, stderr_r, stderr_w = pipes
        ours = [stdin_w, stdout_r, stderr_r]
        try:
            body = json.dumps({"env": dict(launch.env), "cwd": launch.cwd, "user": launch.user, "group": launch.group,
                               "groups": list(launch.extra_groups) if launch.extra_groups is not None else None,
                               }).encode()
            await sock.sendmsg([b"F"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                         array.array("i", [stdin_r, stdout_w, stderr_w]))])
            await _send_all(sock, _LENGTH.pack(len(body)) + body)
            answer = json.loads(await _receive_line(sock))
        except BaseException:
            for fd in ours:
                os.close(fd)
            raise
        finally:
            for fd in (stdin_r, stdout_w, stderr_w):
                os.close(fd)
        pid = answer.get("pid") if isinstance(answer, dict) else None
        if not isinstance(pid, int):
            for fd in ours:
                os.close(fd)
            error = answer.get("error") if isinstance(answer, dict) else None
            if isinstance(error, str):  # this worker could not be forked (out of processes, say): the next may
                raise TemplateUnavailable(f"it could not fork this worker: {error}")
            raise _TemplateBroke(f"unexpected answer {answer!r}")
        own(pid)  # ours to reap (whoever reaps it disowns it then), not the orphan sweep's
        started = StartedProcess(ForkedChild(pid), stdin_w, stdout_r, stderr_r, self.children)
        if not _is_our_child(pid):  # only when we are a child subreaper is it; otherwise nobody could reap it
            self.children.disown(pid)
            self._permanent = ("this supervisor is not a child subreaper, so a forked worker would not be its "
                               "child")
            log.warning("the worker template is off: %s", self._permanent)
            signal_group(pid, signal.SIGKILL)
            for fd in ours:
                os.close(fd)
            raise TemplateUnavailable(self._permanent)
        return started


async def _end_template(process: ChildProcess) -> None:
    """Ending the template ends no worker: each leads its own session and is the supervisor's child."""
    if process.returncode is None:  # not reaped (asking may reap it): its pid is still its own
        os.kill(process.pid, signal.SIGKILL)


async def _pump_stderr(process: trio.Process) -> None:
    assert process.stderr is not None
    buffer = b""
    try:
        async for chunk in process.stderr:
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                log.warning("worker template: %s", line.decode(errors="replace"))
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass


async def _send_all(sock: trio.socket.SocketType, data: bytes) -> None:
    view = memoryview(data)
    while view:
        sent = await sock.send(view)
        view = view[sent:]


async def _receive_line(sock: trio.socket.SocketType, limit: int = 64 * 1024) -> bytes:
    line = b""
    while not line.endswith(b"\n"):
        chunk = await sock.recv(1)  # one at a time: nothing after the answer may be taken from the socket
        if not chunk:
            raise ValueError("the template closed its socket")
        line += chunk
        if len(line) > limit:
            raise ValueError("the template's answer is too long")
    return line


def _describe(exc: BaseException) -> str:
    """What went wrong, in words: the first leaf of a group, its type when it has no message."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, _TemplateBroke):  # ours: the message says it all
        return str(exc)
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _is_our_child(pid: int) -> bool:
    try:
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True
