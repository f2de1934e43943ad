"""The supervisor's side of the worker template (``worker/template.py``): start it, ask it for workers.

A worker forked by the template answers its handshake in tens of milliseconds instead of the ~0.3-0.5 s a new
interpreter spends importing, and shares the template's imported code and built models. The pool uses it for
every worker launched as ``codesdk-worker`` (``PoolConfig.template``); any other worker program is started as
before. The template is only ever a way to start a worker faster: when it cannot answer, the pool logs why and
starts the worker the usual way, and tries the template again after ``RETRY_AFTER_S``.

The worker it forks becomes our child (it is re-parented to us, a child subreaper) and leads its own session, so
the pool owns it exactly like one it spawned (``process.AdoptedProcess``). Requests are answered one at a time.
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
from collections.abc import Mapping, Sequence
from functools import partial

import trio

from ..worker_launch import WorkerLaunch
from .process import ForkedChild, StartedWorker

log = logging.getLogger("codesdk.supervisor.template")

#: Seconds before a template that failed is tried again (meanwhile workers start the usual way).
RETRY_AFTER_S = 60.0
#: Seconds the template gets to import everything and say it is ready.
READY_TIMEOUT_S = 60.0
#: Seconds one fork may take before the template is taken for stuck (and ended).
FORK_TIMEOUT_S = 30.0
_LENGTH = struct.Struct(">I")


class TemplateUnavailable(Exception):
    """The template could not fork this worker; the message says why. The worker is started the usual way."""


class _TemplateBroke(Exception):
    """The template said something it should not have, or nothing: it is ended (and restarted later)."""


class WorkerTemplate:
    """One template process, owned by the pool's nursery (``run``), started on first use."""

    def __init__(self, base_argv: Sequence[str], env: Mapping[str, str]) -> None:
        #: How ``codesdk-worker`` is started (``worker_argv()``): only launches with this program are forked.
        self.base_argv = tuple(base_argv)
        self._env = dict(env)
        self._lock = trio.Lock()
        self._socket: trio.socket.SocketType | None = None
        self._scope: trio.CancelScope | None = None
        self._failed_at: float | None = None
        self._permanent: str | None = None  # a reason that does not go away with a retry

    def serves(self, launch: WorkerLaunch) -> bool:
        """Whether ``launch`` is one the template can fork: the ``codesdk-worker`` program with its own options."""
        return launch.argv[:len(self.base_argv)] == self.base_argv

    async def fork(self, nursery: trio.Nursery, launch: WorkerLaunch) -> StartedWorker:
        """A worker forked as ``launch`` says, already our child; ``TemplateUnavailable`` otherwise."""
        async with self._lock:
            if self._permanent is not None:
                raise TemplateUnavailable(self._permanent)
            if self._socket is None:
                if self._failed_at is not None and trio.current_time() - self._failed_at < RETRY_AFTER_S:
                    raise TemplateUnavailable("it failed recently; trying again later")
                await self._start(nursery)
            assert self._socket is not None
            try:
                with trio.fail_after(FORK_TIMEOUT_S):
                    return await self._fork(self._socket, launch)
            except (OSError, ValueError, _TemplateBroke, trio.TooSlowError, trio.BrokenResourceError) as exc:
                self._stop(f"it failed to fork a worker ({type(exc).__name__}: {exc})")
                raise TemplateUnavailable(f"it failed to fork a worker: {exc}") from exc

    def close(self) -> None:
        """End the template (the pool is closing): its socket closes, so it exits; ``run`` reaps it."""
        if self._scope is not None:
            self._scope.cancel()

    # -- internals ------------------------------------------------------------------------------

    async def _start(self, nursery: trio.Nursery) -> None:
        try:
            self._socket = await nursery.start(self._run)
        except (OSError, _TemplateBroke, trio.TooSlowError) as exc:
            self._failed_at = trio.current_time()
            log.warning("the worker template did not start (%s: %s); workers start the usual way for %.0f s",
                        type(exc).__name__, exc, RETRY_AFTER_S)
            raise TemplateUnavailable(f"it did not start: {exc}") from exc

    async def _run(self, task_status: trio.TaskStatus[trio.socket.SocketType]) -> None:
        """Own the template process: start it, hand its socket over once it is ready, end and reap it when
        cancelled (``close``) or when it dies."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        with trio.CancelScope() as scope, ours:
            self._scope = scope
            sock = trio.socket.from_stdlib_socket(ours)
            try:
                async with trio.open_nursery() as nursery:
                    with theirs:
                        process: trio.Process = await nursery.start(partial(
                            trio.run_process, [*self.base_argv, "--template"], stdin=theirs.fileno(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=self._env, cwd="/",
                            check=False, start_new_session=True, deliver_cancel=_end_template))
                    nursery.start_soon(_pump_stderr, process)
                    with trio.fail_after(READY_TIMEOUT_S):
                        ready = await sock.recv(1)
                    if ready != b"R":
                        raise _TemplateBroke("it ended before it was ready" if not ready else f"it said {ready!r}")
                    log.info("worker template ready (pid %d)", process.pid)
                    task_status.started(sock)
                    await process.wait()
                    self._stop(f"it exited ({process.returncode})")
            finally:
                self._socket = None
                self._scope = None

    def _stop(self, why: str) -> None:
        if self._socket is not None or self._scope is not None:
            log.warning("the worker template stopped: %s; workers start the usual way until it is restarted", why)
        self._failed_at = trio.current_time()
        if self._scope is not None:
            self._scope.cancel()

    async def _fork(self, sock: trio.socket.SocketType, launch: WorkerLaunch) -> StartedWorker:
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
            body = json.dumps({"args": list(launch.argv[len(self.base_argv):]), "env": dict(launch.env),
                               "cwd": launch.cwd, "user": launch.user, "group": launch.group,
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
        started = StartedWorker(ForkedChild(pid), stdin_w, stdout_r, stderr_r)
        if not _is_our_child(pid):  # only when we are a child subreaper is it; otherwise nobody could reap it
            self._permanent = ("this supervisor is not a child subreaper, so a forked worker would not be its "
                               "child")
            log.warning("the worker template is off: %s", self._permanent)
            _kill_quietly(pid)
            for fd in ours:
                os.close(fd)
            raise TemplateUnavailable(self._permanent)
        return started


async def _end_template(process: trio.Process) -> None:
    """Ending the template ends no worker: each leads its own session and is the supervisor's child."""
    process.kill()


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


def _is_our_child(pid: int) -> bool:
    try:
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


def _kill_quietly(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
