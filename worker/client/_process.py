"""One worker process: spawn, handshake, stderr tail, and bounded teardown of its whole process tree.

A worker counts as running only after ``runtime.initialize`` succeeded. Teardown is shielded and every
wait is bounded: ask (runtime.shutdown) -> close stdin -> wait -> SIGTERM the tree -> wait -> SIGKILL.
trio reaps the worker itself; psutil only finds and signals descendants.
"""

from __future__ import annotations

import errno
import logging
import os
import resource
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import IO, Protocol

import psutil
import trio

from codesdk.protocol import (
    DEFAULT_MAX_FRAME_BYTES,
    PROTOCOL_VERSION,
    BadFrame,
    ExitStatus,
    InitializeParams,
    InitializeResult,
    NoParams,
    PeerInfo,
    Rpc,
    RuntimeEnv,
    StderrTail,
)

from codesdk.procs._orphans import DESCRIPTORS_EXHAUSTED, end_session, reap_session, scan_retrying, warn_scan_failed
from codesdk.procs._own_children import disown, owned_child

from codesdk._version import __version__
from ._connection import WorkerBroken, WorkerConnection, WorkerError

log = logging.getLogger("codesdk.supervisor.worker")

#: Seconds to wait for an ended or killed worker to be reaped before giving up on it.
REAP_WAIT_S = 10.0
#: Seconds a dead worker's output may keep flowing before whatever still holds its pipes is killed.
OUTPUT_GRACE_S = 2.0
#: Seconds between snapshots of a worker's process tree.
TREE_SNAPSHOT_S = 1.0
#: Seconds a new worker has to answer runtime.initialize (cold Python start is ~0.3 s).
HANDSHAKE_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class WorkerSpec:
    argv: Sequence[str]
    env: Mapping[str, str]
    cwd: str | None = None
    name: str = "worker"
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    runtime_env: RuntimeEnv | None = None
    # Run as this uid/gid with exactly these supplementary groups (None: the supervisor's own, as today).
    user: int | None = None
    group: int | None = None
    extra_groups: Sequence[int] | None = None
    #: Sees every line the worker writes, in order (``codesdk.testing``'s wire log); None in the supervisor.
    wire_tap: Callable[[bytes | BadFrame], None] | None = None




class ChildProcess(Protocol):
    """What a worker's process object offers: a ``trio.Process``, or an ``AdoptedProcess``."""

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


class Reapable(Protocol):
    """Who reaps a worker started outside ``trio.run_process``: its ``subprocess.Popen``, or a ``ForkedChild``."""

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
class StartedWorker:
    """A worker process started before the pool took it: by ``codesdk run`` ahead of the supervisor (a ``Popen``),
    or forked by the worker template. Our ends of its stdio pipes, as descriptors the adopter owns."""

    child: Reapable
    stdin: int
    stdout: int
    stderr: int

    @classmethod
    def of_popen(cls, popen: subprocess.Popen[bytes]) -> StartedWorker:
        assert popen.stdin is not None and popen.stdout is not None and popen.stderr is not None
        return cls(popen, _detach(popen.stdin), _detach(popen.stdout), _detach(popen.stderr))

    def discard(self) -> None:
        """SIGKILL its session and reap it (it was never adopted: nothing else will)."""
        for fd in (self.stdin, self.stdout, self.stderr):
            os.close(fd)
        try:
            os.killpg(self.child.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        while self.child.poll() is None:
            os.waitid(os.P_PID, self.child.pid, os.WEXITED | os.WNOWAIT)
        disown(self.child.pid)
        end_session(self.child.pid)  # a runtime it started ahead leads a group of its own in its session


class AdoptedProcess:
    """A worker the pool did not start with ``trio.run_process`` (``StartedWorker``), seen as ``WorkerProcess`` sees
    a ``trio.Process``. Only its owner task (``_own_adopted``) reaps it, woken by a pidfd; everybody else waits for
    that."""

    def __init__(self, started: StartedWorker) -> None:
        self._child = started.child
        self._pidfd = os.pidfd_open(started.child.pid)
        self.stdin: trio.abc.SendStream | None = trio.lowlevel.FdStream(started.stdin)
        self.stdout: trio.abc.ReceiveStream | None = trio.lowlevel.FdStream(started.stdout)
        self.stderr: trio.abc.ReceiveStream | None = trio.lowlevel.FdStream(started.stderr)
        self._reaped = trio.Event()

    @property
    def pid(self) -> int:
        return self._child.pid

    @property
    def returncode(self) -> int | None:
        return self._child.returncode

    async def wait(self) -> int:
        await self._reaped.wait()
        assert self._child.returncode is not None
        return self._child.returncode

    async def reap(self) -> None:
        """Wait for the exit and reap (the owner task only)."""
        try:
            while self._child.poll() is None:
                await trio.lowlevel.wait_readable(self._pidfd)
        finally:
            if self._child.returncode is not None:
                disown(self._child.pid)
                trio.lowlevel.notify_closing(self._pidfd)
                os.close(self._pidfd)
                self._reaped.set()


def _detach(stream: IO[bytes]) -> int:
    """The descriptor under one of Popen's pipe files, which no longer owns it."""
    fd = os.dup(stream.fileno())
    stream.close()
    return fd


class WorkerProcess:
    """A running, initialized worker. Create with ``await WorkerProcess.start(nursery, spec)``."""

    def __init__(self, spec: WorkerSpec, process: ChildProcess, connection: WorkerConnection) -> None:
        self.spec = spec
        self.process = process
        self.connection = connection
        self.stderr = StderrTail()
        self.info: InitializeResult | None = None
        self.exited = trio.Event()
        self.exit_status: ExitStatus | None = None
        self.stopping = False
        self._descendants: set[int] = set()  # pids seen under the worker when it was killed: reaped if adopted
        self._known: dict[int, float] = {}  # descendants seen while it ran: pid -> start time (not a reused pid)
        self._busy = trio.Event()  # set while it has tasks (the pool says so): only then is its tree watched

    @property
    def pid(self) -> int:
        return int(self.process.pid)

    @classmethod
    async def start(cls, nursery: trio.Nursery, spec: WorkerSpec, handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S,
                    adopted: StartedWorker | None = None, handshake: bool = True) -> WorkerProcess:
        """Spawn the worker in its own session (or adopt one started as ``spec`` says: ahead of the supervisor, or
        forked by the template), start its reader tasks, and complete the handshake (unless ``handshake`` is
        false: a protocol test that sends its own ``runtime.initialize``)."""
        try:
            process: ChildProcess
            if adopted is not None:
                try:
                    owned = AdoptedProcess(adopted)
                except OSError:  # no descriptor for its pidfd: it cannot be watched, so it must not run
                    adopted.discard()
                    raise
                process = await nursery.start(_own_adopted, owned)
            else:
                process = await nursery.start(_run_worker_process, spec)
        except OSError as exc:
            if exc.errno in RESOURCE_ERRNOS:
                raise WorkerResourcesExhausted(exhausted_message(spec.name, exc)) from exc
            raise WorkerStartError(f"{spec.name}: cannot start {spec.argv[0]!r}: {exc.strerror or exc}") from exc
        assert process.stdin is not None and process.stdout is not None
        worker = cls(spec, process, WorkerConnection(process.stdin, process.stdout, spec.max_frame_bytes, spec.name,
                                                          spec.wire_tap))
        nursery.start_soon(worker._watch)
        if not handshake:
            return worker
        try:
            with trio.fail_after(handshake_timeout_s):
                worker.info = await worker.connection.request(Rpc.INITIALIZE, InitializeParams(
                    protocol_version=PROTOCOL_VERSION,
                    supervisor=PeerInfo(name="codesdk-supervisor", version=__version__),
                    env=spec.runtime_env,
                ))
            if worker.info.protocol_version.split(".")[0] != PROTOCOL_VERSION.split(".")[0]:
                raise ValueError(f"worker speaks protocol {worker.info.protocol_version}, "
                                 f"this supervisor {PROTOCOL_VERSION}")
        except (WorkerError, trio.TooSlowError, ValueError) as exc:
            with trio.CancelScope(shield=True):
                await worker.kill()
                await worker.exited.wait()
            tail = worker.stderr.text().strip()
            status = worker.exit_status
            why = str(exc).removeprefix(f"{spec.name}: ") or (
                f"no answer within {handshake_timeout_s:g} s" if isinstance(exc, trio.TooSlowError)
                else type(exc).__name__)
            if isinstance(exc, trio.TooSlowError) or status is None:
                what = why  # it was ended here, after the wait: its exit status says nothing of its own
            else:  # it ended by itself: that is the cause, what the connection saw only the symptom
                what = f"the process {'was ' if status.signal is not None else ''}{status.describe()} ({why})"
            wrote = [f"{v.kind}: {v.detail}" for v in worker.connection.stats.recent_violations]
            raise WorkerStartError(
                f"{spec.name}: worker failed its handshake: {what}"
                + (f"; on stdout it wrote what is no protocol message: {'; '.join(wrote[-3:])}" if wrote else "")
                + (f"; stderr: {tail[-2000:]}" if tail else "")
            ) from exc
        return worker

    async def _watch(self) -> None:
        """Read stdout and stderr until both end, then record how the process exited.

        Also when cancelled (the supervisor is being torn down from outside): then trio's run_process kills
        the worker, and this still waits — shielded, bounded — for the exit, so ``exited`` is always set and
        nobody waiting for it hangs.
        """
        try:
            output = trio.CancelScope()
            output_ended = trio.Event()

            async def read_output() -> None:
                with output:
                    async with trio.open_nursery() as readers:
                        readers.start_soon(self.connection.run_reader)
                        readers.start_soon(self._pump_stderr)
                output_ended.set()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(read_output)
                snapshots = trio.CancelScope()
                nursery.start_soon(self._snapshot_tree, snapshots)
                await self.process.wait()
                snapshots.cancel()
                # What it started (also what left its session since) goes with it; that also ends their pipes.
                await trio.to_thread.run_sync(self._kill_known_descendants)
                with trio.move_on_after(OUTPUT_GRACE_S):
                    await output_ended.wait()
                if not output_ended.is_set():
                    # The worker is gone but something it started still holds its pipes: without this, its
                    # exit would never be reported and its tasks never failed.
                    await self._kill_pipe_holders()
                    with trio.move_on_after(OUTPUT_GRACE_S):
                        await output_ended.wait()
                    output.cancel()
        finally:
            with trio.CancelScope(shield=True):
                with trio.move_on_after(REAP_WAIT_S):
                    await self.process.wait()
                if self.process.returncode is None:  # still alive after all that: make sure
                    _signal_tree(self.pid, _process_tree(self.pid), signal.SIGKILL)
                    with trio.move_on_after(REAP_WAIT_S):
                        await self.process.wait()
                returncode = self.process.returncode
                self.exit_status = ExitStatus.from_returncode(returncode if returncode is not None else -9)
                # Nothing the worker started outlives it: its group is killed, adopted orphans reaped.
                try:
                    os.killpg(self.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                with trio.move_on_after(REAP_WAIT_S):
                    await trio.to_thread.run_sync(reap_session, self.pid, REAP_WAIT_S / 5, self._descendants,
                                                  abandon_on_cancel=True)
                self.exited.set()

    def mark_busy(self, busy: bool) -> None:
        """The pool's word on whether the worker has tasks: an idle worker's tree is not polled."""
        if busy:
            self._busy.set()
        elif self._busy.is_set():
            self._busy = trio.Event()

    async def _snapshot_tree(self, scope: trio.CancelScope) -> None:
        """Remember the worker's descendants every TREE_SNAPSHOT_S, so that one which leaves its session and
        closes its pipes (a daemon) is still known — and killed — when the worker ends."""
        with scope:
            while True:
                if not self._known and not self._busy.is_set():  # idle, nothing started: no polling at all
                    await self._busy.wait()
                if time.monotonic() - _table.taken > TREE_SNAPSHOT_S:  # one /proc scan serves every worker
                    try:
                        await trio.to_thread.run_sync(_process_table, TREE_SNAPSHOT_S)
                    except OSError as exc:  # out of descriptors: keep what is known, look again next time
                        _scan_failed(f"{self.spec.name}: snapshot of its process tree", exc)
                self._remember_tree(_table)  # a walk of the shared table: cheap, no thread
                await trio.sleep(TREE_SNAPSHOT_S)

    def _remember_tree(self, table: _ProcessTable) -> None:
        known = {pid: started for pid, started in self._known.items() if table.started.get(pid) == started}
        known.update(table.descendants(self.pid))
        self._known = known

    def _kill_known_descendants(self) -> None:
        """SIGKILL every remembered descendant that is still the same process (pid and start time)."""
        _sigkill(pid for pid, started in self._known.items() if _started_at(pid) == started)
        self._descendants |= set(self._known)

    async def _kill_pipe_holders(self) -> None:
        """SIGKILL every process still holding the dead worker's stdout/stderr (reaped with the rest at exit)."""
        assert self.process.stdout is not None and self.process.stderr is not None
        inodes = {os.fstat(stream.fileno()).st_ino for stream in (self.process.stdout, self.process.stderr)
                  if isinstance(stream, trio.lowlevel.FdStream)}
        holders = await trio.to_thread.run_sync(_pipe_holders, inodes)
        log.warning("%s exited but pid(s) %s still hold its output pipes; killing them", self.spec.name,
                    ", ".join(map(str, sorted(holders))) or "(unknown)")
        _sigkill(holders)
        self._descendants |= holders

    async def _pump_stderr(self) -> None:
        assert self.process.stderr is not None
        try:
            async for chunk in self.process.stderr:
                for line in self.stderr.feed(chunk):
                    log.debug("%s stderr: %s", self.spec.name, line)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async def shutdown(self, grace_s: float = 5.0) -> ExitStatus:
        """Ask nicely, then insist. Shielded: finishes even if the caller is being cancelled."""
        self.stopping = True
        with trio.CancelScope(shield=True):
            if not self.exited.is_set():
                with trio.move_on_after(grace_s / 2):
                    try:
                        await self.connection.request(Rpc.SHUTDOWN, NoParams())
                    except WorkerError:
                        pass
                try:
                    await self.connection.close_input()
                except (WorkerError, trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    pass
                with trio.move_on_after(grace_s):
                    await self.exited.wait()
            await self.kill()
            with trio.move_on_after(REAP_WAIT_S):
                await self.exited.wait()
        return self.exit_status or ExitStatus(None, signal.SIGKILL)

    async def kill(self, term_grace_s: float = 2.0) -> None:
        """SIGTERM the worker's process tree, then SIGKILL whatever is left. Shielded, bounded."""
        with trio.CancelScope(shield=True):
            tree = _process_tree(self.pid)
            self._descendants.update(p.pid for p in tree)
            if not self.exited.is_set() or any(_alive(p) for p in tree):
                _signal_tree(self.pid, tree, signal.SIGTERM)
                with trio.move_on_after(term_grace_s):
                    while not self.exited.is_set() or any(_alive(p) for p in tree):
                        await trio.sleep(0.02)
                _signal_tree(self.pid, tree, signal.SIGKILL)
                with trio.move_on_after(term_grace_s):  # SIGKILL can't be refused; wait until it landed
                    while any(_alive(p) for p in tree):
                        await trio.sleep(0.01)

    async def wait_exit(self) -> ExitStatus:
        await self.exited.wait()
        assert self.exit_status is not None
        return self.exit_status


class WorkerStartError(WorkerBroken):
    """A worker could not be started or did not complete its handshake."""


class WorkerResourcesExhausted(WorkerStartError):
    """The supervisor's host is out of descriptors/processes/memory: not the namespace's fault, not a crash."""


RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.EAGAIN, errno.ENOMEM})


#: File descriptors a new worker's start must leave free: the store, the API and the running workers need some to
#: go on (a blob read, a commit, an accepted connection); a start that would take the last of them fails instead.
WORKER_FD_RESERVE = 16


def check_descriptor_headroom(who: str) -> None:
    """``WorkerResourcesExhausted`` unless a worker can start and still leave ``WORKER_FD_RESERVE`` descriptors."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        used = len(os.listdir("/proc/self/fd"))
    except OSError as exc:
        if exc.errno not in RESOURCE_ERRNOS:
            return  # no /proc: nothing to measure with; the start itself fails clearly if it must
        used = soft
    if soft - used < WORKER_FD_RESERVE + 8:  # + its pipes, pidfd and the spawn's own error pipe
        exhausted = OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        raise WorkerResourcesExhausted(exhausted_message(who, exhausted)) from exhausted


def exhausted_message(who: str, exc: OSError) -> str:
    """What ran out (an errno of RESOURCE_ERRNOS) when ``who`` could not be started, and what to do."""
    if exc.errno == errno.EMFILE:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        return (f"{who}: the supervisor has run out of file descriptors (limit {soft}, hard {hard}); "
                f"raise LimitNOFILE= in its unit, or lower the number of live workers (idle timeout)")
    if exc.errno == errno.ENFILE:
        return f"{who}: the system-wide open-file table is full (fs.file-max); nothing was started"
    return (f"{who}: the host cannot start another process now ({exc.strerror}); check memory and the "
            f"process limit (TasksMax=, ulimit -u)")


async def _terminate_tree(process: ChildProcess) -> None:
    """How a worker is ended when its owner is cancelled: SIGTERM its tree, SIGKILL after 2 s."""
    tree = _process_tree(process.pid)
    _signal_tree(process.pid, tree, signal.SIGTERM)
    await trio.sleep(2.0)
    _signal_tree(process.pid, tree, signal.SIGKILL)


async def _run_worker_process(spec: WorkerSpec, task_status: trio.TaskStatus[ChildProcess]) -> None:
    start_error: OSError | None = None
    with owned_child() as own:  # its exit status is ours to read, not the orphan sweep's
        async with trio.open_nursery() as nursery:
            try:
                process: trio.Process = await nursery.start(partial(
                    trio.run_process, list(spec.argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE, env=dict(spec.env), cwd=spec.cwd, check=False, start_new_session=True,
                    user=spec.user, group=spec.group,
                    extra_groups=list(spec.extra_groups) if spec.extra_groups is not None else None,
                    deliver_cancel=_terminate_tree))
            except OSError as exc:  # raised bare below, not in the nursery's exception group
                start_error = exc
            else:
                own(process.pid)
                task_status.started(process)
    if start_error is not None:
        raise start_error


async def _own_adopted(process: AdoptedProcess, task_status: trio.TaskStatus[ChildProcess]) -> None:
    """What ``trio.run_process`` does for a process it started, for one it is handed: hold it until it exits;
    if cancelled first, end it (``_terminate_tree``) and still reap it."""
    task_status.started(process)
    try:
        await process.reap()
    except BaseException:
        with trio.CancelScope(shield=True):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_terminate_tree, process)
                await process.reap()
                nursery.cancel_scope.cancel()
        raise


@dataclass(frozen=True)
class _ProcessTable:
    """Every process's parent and start time, read from /proc once and shared by all workers' snapshots."""

    taken: float
    children: dict[int, list[int]]
    started: dict[int, float]

    def descendants(self, pid: int) -> dict[int, float]:
        found: dict[int, float] = {}
        stack = list(self.children.get(pid, ()))
        while stack:
            child = stack.pop()
            if child in found or child not in self.started:
                continue
            found[child] = self.started[child]
            stack.extend(self.children.get(child, ()))
        return found


_table_lock = threading.Lock()
_table = _ProcessTable(0.0, {}, {})


def _process_table(max_age_s: float = 0.0) -> _ProcessTable:
    """A recent table of all processes: one scan of /proc serves every worker (there may be hundreds)."""
    global _table
    with _table_lock:
        now = time.monotonic()
        if now - _table.taken > max_age_s:
            children: dict[int, list[int]] = {}
            started: dict[int, float] = {}
            for process in psutil.process_iter(["ppid", "create_time", "status"]):
                info = process.info
                if info["status"] == psutil.STATUS_ZOMBIE or info["create_time"] is None:
                    continue
                children.setdefault(info["ppid"], []).append(process.pid)
                started[process.pid] = info["create_time"]
            _table = _ProcessTable(now, children, started)
        return _table


def _sigkill(pids: Iterable[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _started_at(pid: int) -> float | None:
    """A running (not zombie) process's start time, None if it is gone. Out of descriptors to look with, it tries
    again for up to _SCAN_RETRY_S (a thread's wait) before taking the process for gone."""
    def look() -> float | None:
        try:
            process = psutil.Process(pid)
            return None if process.status() == psutil.STATUS_ZOMBIE else process.create_time()
        except psutil.Error:
            return None
    try:
        return scan_retrying(f"start time of pid {pid}", look, for_s=_SCAN_RETRY_S)
    except OSError as exc:
        _scan_failed(f"start time of pid {pid}", exc)
        return None


def _process_tree(pid: int) -> list[psutil.Process]:
    """``pid``'s descendants now; [] if it is gone or /proc cannot be read (out of descriptors: its process group
    is still signalled, and the descendants remembered from earlier snapshots)."""
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []
    except OSError as exc:
        _scan_failed(f"process tree of pid {pid}", exc)
        return []


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
    except OSError:  # cannot look (out of descriptors): assume it still runs; every wait on this is bounded
        return True


def _signal_tree(pid: int, descendants: list[psutil.Process], sig: signal.Signals) -> None:
    """Signal the worker's process group (it leads its own session) and every known descendant."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
    for child in descendants:
        try:
            child.send_signal(sig)
        except (psutil.Error, OSError):  # gone, or its identity cannot be checked now: not signalled blindly
            pass


def _pipe_holders(inodes: set[int]) -> set[int]:
    """Pids (other than ours) with a descriptor on one of these pipes, found through /proc. Out of descriptors to
    scan with, it tries again for up to _SCAN_RETRY_S, then returns what it found."""
    wanted = {f"pipe:[{inode}]" for inode in inodes}
    me = os.getpid()
    what = "looking for the holders of a dead worker's pipes"
    deadline = time.monotonic() + _SCAN_RETRY_S

    def pids() -> list[int]:
        with os.scandir("/proc") as processes:
            return [int(e.name) for e in processes if e.name.isdigit() and int(e.name) != me]

    def holds(pid: int) -> bool:
        with os.scandir(f"/proc/{pid}/fd") as fds:
            return any(os.readlink(fd.path) in wanted for fd in fds)

    found: set[int] = set()
    try:
        for pid in scan_retrying(what, pids, for_s=_SCAN_RETRY_S):
            try:
                if scan_retrying(what, partial(holds, pid), for_s=max(0.0, deadline - time.monotonic())):
                    found.add(pid)
            except OSError as exc:
                if exc.errno in DESCRIPTORS_EXHAUSTED:
                    raise
                # gone meanwhile, or not ours to look at
    except OSError as exc:
        _scan_failed(what, exc)
    return found


#: Seconds a scan that has to finish retries while descriptors are exhausted (always in a thread).
_SCAN_RETRY_S = 2.0


def _scan_failed(what: str, exc: OSError) -> None:
    warn_scan_failed(what, exc, "going on without it")
