"""The worker template: one interpreter that has imported what a worker needs, and forks workers on request.

A worker started as a new program spends ~0.3-0.5 s importing trio, pydantic and the protocol's models before it
can answer its supervisor, and keeps ~24 MB of its own memory. Forked from this template it answers in tens of
milliseconds, and the imported code and built models stay shared with the template (copy on write): each worker
owns only what it changes (docs/performance.md, cases 4 and 5).

The supervisor's pool starts the template (``codesdk-worker --template``) with a unix socket as its stdin, and
asks it for a worker like this:

1. one byte, ``F``, with three descriptors (SCM_RIGHTS): the worker's stdin, stdout and stderr;
2. the launch: a 4-byte big-endian length, then JSON ``{"env", "cwd", "user", "group", "groups"}``.

A forked worker runs with the command-line options the template itself was started with (without ``--template``).

The template reads only the first part. It forks an intermediate child that reads the launch, forks the worker and
exits; the template then answers one JSON line, ``{"pid": N}`` or ``{"error": "..."}``.

Why the intermediate child:

- **No tenant data in the template.** A namespace's launch holds its variables (credentials); every later worker is
  a copy of the template's memory, so the template must never have read one. Only the intermediate child and the
  worker do, and both are gone (or are that namespace's) afterwards.
- **The supervisor reaps its workers.** When the intermediate child exits, the worker is re-parented to the nearest
  child subreaper above it: the supervisor (``codesdk.procs.orphans.become_subreaper``). The template answers only
  once it has reaped the intermediate child, so the worker the answer names is already the supervisor's child, which
  waits for it, signals it and reads its exit status as for any worker it started itself.

The worker leads a session of its own (as a spawned worker does), waits until it has been re-parented, drops to the
launch's groups, gid and uid (fail closed: it exits 127 with the reason on its stderr), moves to its directory,
takes exactly the launch's environment and only then runs ``_stdio.run``. What a fork cannot give is said in
docs/operations.md: ``/proc/PID/environ`` shows the template's (minimal) start-up environment, not the worker's;
every worker has the template's address-space layout and hash seed; ``random`` is re-seeded in each.
"""

from __future__ import annotations

import array
import json
import os
import random
import select
import socket
import struct
import sys
from typing import Any

#: The request byte; any other ends the template (the supervisor and the template disagree: restart it).
FORK = b"F"
#: Sent once, when everything is imported: the pool waits for it before its first request.
READY = b"R"
_LENGTH = struct.Struct(">I")


class BadLaunch(ValueError):
    """The supervisor's launch could not be read (the template and the supervisor disagree)."""
#: Largest launch accepted (a namespace's environment is capped far below this by the supervisor).
MAX_LAUNCH_BYTES = 4 * 1024 * 1024


def serve(sock: socket.socket, worker_args: list[str]) -> int:
    """Answer fork requests on ``sock`` until the supervisor closes it; each worker runs ``_stdio.run(worker_args)``.
    Single-threaded on purpose: a fork copies only the thread that calls it."""
    _warm()
    sock.sendall(READY)
    while True:
        message, ancillary, _, _ = sock.recvmsg(1, socket.CMSG_SPACE(3 * array.array("i").itemsize))
        if not message:
            return 0  # the supervisor is gone or done with us
        fds = _descriptors(ancillary)
        if message != FORK or len(fds) != 3:
            for fd in fds:
                os.close(fd)
            print(f"worker template: unexpected request {message!r} with {len(fds)} descriptors; ending",
                  file=sys.stderr, flush=True)
            return 1
        sock.sendall(_fork_worker(sock, fds, worker_args))


def _fork_worker(sock: socket.socket, fds: list[int], worker_args: list[str]) -> bytes:
    """Fork the intermediate child, reap it, and say what became of the worker (one JSON line). Out of descriptors
    or processes, this request fails and the template serves on."""
    try:
        report_r, report_w = os.pipe()
    except OSError as exc:
        for fd in fds:
            os.close(fd)
        return _line({"error": f"the template has no descriptor left: {exc}"})
    try:
        pid = os.fork()
    except OSError as exc:
        for fd in (*fds, report_r, report_w):
            os.close(fd)
        return _line({"error": f"the template cannot fork: {exc}"})
    if pid == 0:  # the intermediate child: never returns
        os.close(report_r)
        code = 1
        try:
            code = _intermediate(sock, fds, report_w, worker_args)
        finally:
            os._exit(code)
    for fd in (*fds, report_w):
        os.close(fd)
    with os.fdopen(report_r, "rb") as report:
        said = report.read()
    os.waitpid(pid, 0)  # after this, a worker it forked has been re-parented to the supervisor
    return said if said.endswith(b"\n") else _line({"error": "the template's child died before it answered"})


def _intermediate(sock: socket.socket, fds: list[int], report_w: int, worker_args: list[str]) -> int:
    """Read the launch, fork the worker, report its pid once it leads its own session."""
    try:
        launch = _read_launch(sock)
    except (OSError, ValueError) as exc:
        os.write(report_w, _line({"error": f"unreadable launch: {exc}"}))
        return 1
    try:
        ready_r, ready_w = os.pipe()
        pid = os.fork()
    except OSError as exc:
        os.write(report_w, _line({"error": f"cannot fork the worker: {exc}"}))
        return 1
    if pid == 0:
        os.close(ready_r)
        os.close(report_w)
        _become_worker(launch, fds, ready_w, worker_args)  # never returns
    os.close(ready_w)
    os.read(ready_r, 1)  # EOF: the worker leads its own session now (or has died: the supervisor sees its exit)
    os.write(report_w, _line({"pid": pid}))
    return 0


def _become_worker(launch: dict[str, Any], fds: list[int], ready_w: int, worker_args: list[str]) -> None:
    """In the forked worker: take its session, wait to be the supervisor's child, become the launch, run."""
    stderr = fds[2]  # where a failure is told: the worker's stderr, which the supervisor reads
    try:
        os.setsid()
        intermediate = os.pidfd_open(os.getppid())
        os.close(ready_w)  # the intermediate child reports us and exits
        select.select([intermediate], [], [])  # readable once it has exited, i.e. once we are re-parented
        os.close(intermediate)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        stderr = 2
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        if launch["groups"] is not None:
            os.setgroups(launch["groups"])
        if launch["group"] is not None:
            os.setresgid(launch["group"], launch["group"], launch["group"])
        if launch["user"] is not None:
            os.setresuid(launch["user"], launch["user"], launch["user"])
        if launch["cwd"] is not None:
            os.chdir(launch["cwd"])
        os.environ.clear()
        os.environ.update(launch["env"])
        random.seed()  # not the template's sequence: each worker its own
    except BaseException as exc:  # noqa: BLE001 - anything: this process must never run as the template's user
        os.write(stderr, f"codesdk-worker (from the template): cannot become the namespace's "
                 f"worker: {type(exc).__name__}: {exc}\n".encode(errors="replace"))
        os._exit(127)
    code = 1
    try:
        from ._stdio import run

        code = run(worker_args)
    finally:
        os._exit(code)


def _read_launch(sock: socket.socket) -> dict[str, Any]:
    (length,) = _LENGTH.unpack(_read_exactly(sock, _LENGTH.size))
    if length > MAX_LAUNCH_BYTES:
        raise BadLaunch(f"{length} bytes is over the limit of {MAX_LAUNCH_BYTES}")
    launch = json.loads(_read_exactly(sock, length))
    if not isinstance(launch, dict) or not isinstance(launch.get("env"), dict):
        raise BadLaunch("not a launch object")
    return {key: launch.get(key) for key in ("env", "cwd", "user", "group", "groups")}


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise BadLaunch("the launch ended early")
        data += chunk
    return data


def _descriptors(ancillary: list[tuple[int, int, bytes]]) -> list[int]:
    fds = array.array("i")
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
    return list(fds)


def _line(answer: dict[str, Any]) -> bytes:
    return json.dumps(answer).encode() + b"\n"


def _warm() -> None:
    """Import what every worker imports, and build every protocol model now, once, for all of them."""
    from pydantic import BaseModel

    from codesdk import protocol

    from . import _lifeline, _stdio, server  # noqa: F401 - imported to be shared
    from .adapters.registry import default_registry

    default_registry()
    for name in protocol.__all__:
        model = getattr(protocol, name)
        if isinstance(model, type) and issubclass(model, BaseModel) and not model.__pydantic_complete__:
            model.model_rebuild()
