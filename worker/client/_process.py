"""One worker process: spawn (or adopt), handshake, stderr tail, and bounded teardown of its whole process tree.

A worker counts as running only after ``runtime.initialize`` succeeded. Teardown is shielded and every
wait is bounded: ask (runtime.shutdown) -> close stdin -> wait -> SIGTERM the tree -> wait -> SIGKILL.
How a child is spawned, adopted, held and reaped, and its tree ended, is ``codesdk.procs``' business; this module
keeps what is a worker's own.
"""

from __future__ import annotations

import errno
import logging
import os
import resource
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial

import trio

from codesdk._version import __version__
from codesdk.procs.children import Children
from codesdk.procs.orphans import discard, reap_session
from codesdk.procs.process import AdoptedProcess, ChildProcess, StartedProcess, hold, run_in_own_session
from codesdk.procs.tree import (
    ProcessTable,
    Snapshot,
    alive,
    descendants,
    end_tree,
    has_children,
    sigkill,
    signal_group_of,
    signal_tree,
)
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
#: Seconds a worker's tree gets between SIGTERM and SIGKILL when its owner is cancelled (as ``kill``'s default).
TERM_GRACE_S = 2.0


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




class WorkerProcess:
    """A running, initialized worker. Create with ``await WorkerProcess.start(nursery, spec)``."""

    #: Seconds between snapshots of its process tree (a class attribute: a test may take them more often).
    tree_snapshot_s = TREE_SNAPSHOT_S

    def __init__(self, spec: WorkerSpec, process: ChildProcess, connection: WorkerConnection, children: Children,
                 table: ProcessTable) -> None:
        self.spec = spec
        self.process = process
        self.connection = connection
        self._children = children
        self._table = table
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
                    adopted: StartedProcess | None = None, handshake: bool = True, *,
                    children: Children | None = None, table: ProcessTable | None = None,
                    placed: Callable[[int], object] | None = None) -> WorkerProcess:
        """Spawn the worker in its own session (or adopt one started as ``spec`` says: ahead of the supervisor, or
        forked by the template), start its reader tasks, and complete the handshake (unless ``handshake`` is
        false: a protocol test that sends its own ``runtime.initialize``).

        ``children``: the registry of the process's children, where it is owned until reaped (None: one of its own,
        where nothing sweeps orphans); ``table``: the snapshots its tree is watched in, shared by a pool's
        workers (None: its own); ``placed``: called with its pid once it runs, before anything is sent to it (the
        pool puts it into its namespace's resource group there)."""
        children = children if children is not None else Children()
        table = table if table is not None else ProcessTable()
        deliver_cancel = partial(_end_worker, table)
        try:
            process: ChildProcess
            if adopted is not None:
                try:
                    owned = AdoptedProcess(adopted)
                except OSError:  # no descriptor for its pidfd: it cannot be watched, so it must not run
                    adopted.close()
                    discard(adopted.child, adopted.children, table.scans)
                    raise
                process = await nursery.start(hold, owned, deliver_cancel)
            else:
                process = await nursery.start(partial(
                    run_in_own_session, spec.argv, children=children, deliver_cancel=deliver_cancel,
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=spec.env, cwd=spec.cwd,
                    user=spec.user, group=spec.group, extra_groups=spec.extra_groups))
        except OSError as exc:
            if exc.errno in RESOURCE_ERRNOS:
                raise WorkerResourcesExhausted(exhausted_message(spec.name, exc)) from exc
            raise WorkerStartError(f"{spec.name}: cannot start {spec.argv[0]!r}: {exc.strerror or exc}") from exc
        assert process.stdin is not None and process.stdout is not None
        worker = cls(spec, process, WorkerConnection(process.stdin, process.stdout, spec.max_frame_bytes, spec.name,
                                                     spec.wire_tap), children, table)
        nursery.start_soon(worker._watch)
        if placed is not None:
            try:
                placed(process.pid)
            except BaseException:
                with trio.CancelScope(shield=True):
                    await worker.kill()
                    await worker.exited.wait()
                raise
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
                    signal_tree(self.process, descendants(self.pid, self._table.scans), signal.SIGKILL)
                    with trio.move_on_after(REAP_WAIT_S):
                        await self.process.wait()
                returncode = self.process.returncode
                self.exit_status = ExitStatus.from_returncode(returncode if returncode is not None else -9)
                # Nothing the worker started outlives it: its group is killed, adopted orphans reaped.
                signal_group_of(self.process, signal.SIGKILL)
                with trio.move_on_after(REAP_WAIT_S):
                    await trio.to_thread.run_sync(partial(
                        reap_session, self.pid, self._children, self._table.scans, REAP_WAIT_S / 5,
                        self._descendants), abandon_on_cancel=True)
                self.exited.set()

    def mark_busy(self, busy: bool) -> None:
        """The pool's word on whether the worker has tasks: an idle worker's tree is not polled."""
        if busy:
            self._busy.set()
        elif self._busy.is_set():
            self._busy = trio.Event()

    async def _snapshot_tree(self, scope: trio.CancelScope) -> None:
        """Remember the worker's descendants every ``tree_snapshot_s``, so that one which leaves its session and
        closes its pipes (a daemon) is still known — and killed — when the worker ends."""
        every_s = self.tree_snapshot_s
        with scope:
            while True:
                if not self._known and not self._busy.is_set():  # idle, nothing started: no polling at all
                    await self._busy.wait()
                if not self._known and not has_children(self.pid):  # nothing below it (an in-process runtime):
                    await trio.sleep(every_s)  # nothing to remember, and no /proc scan (tens of ms on a busy host)
                    continue
                if time.monotonic() - self._table.latest.taken > every_s:  # one /proc scan serves every worker
                    try:
                        await trio.to_thread.run_sync(self._table.snapshot, every_s)
                    except OSError as exc:  # out of descriptors: keep what is known, look again next time
                        self._table.scans.failed(f"{self.spec.name}: snapshot of its process tree", exc,
                                                 "going on without it")
                self._remember_tree(self._table.latest)  # a walk of the shared snapshot: cheap, no thread
                await trio.sleep(every_s)

    def _remember_tree(self, snapshot: Snapshot) -> None:
        known = {pid: started for pid, started in self._known.items() if snapshot.started.get(pid) == started}
        known.update(snapshot.descendants(self.pid))
        self._known = known

    def _kill_known_descendants(self) -> None:
        """SIGKILL every remembered descendant that is still the same process (pid and start time)."""
        sigkill(pid for pid, started in self._known.items() if self._table.started_at(pid) == started)
        self._descendants |= set(self._known)

    async def _kill_pipe_holders(self) -> None:
        """SIGKILL every process still holding the dead worker's stdout/stderr (reaped with the rest at exit)."""
        assert self.process.stdout is not None and self.process.stderr is not None
        inodes = {os.fstat(stream.fileno()).st_ino for stream in (self.process.stdout, self.process.stderr)
                  if isinstance(stream, trio.lowlevel.FdStream)}
        holders = await trio.to_thread.run_sync(self._table.pipe_holders, inodes)
        log.warning("%s exited but pid(s) %s still hold its output pipes; killing them", self.spec.name,
                    ", ".join(map(str, sorted(holders))) or "(unknown)")
        sigkill(holders)
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

    async def kill(self, term_grace_s: float = TERM_GRACE_S) -> None:
        """SIGTERM the worker's process tree, then SIGKILL whatever is left (``end_tree``). Shielded, bounded."""
        with trio.CancelScope(shield=True):
            tree = descendants(self.pid, self._table.scans)
            self._descendants.update(p.pid for p in tree)
            if not self.exited.is_set() or any(alive(p) for p in tree):
                await end_tree(self.process, tree, term_grace_s)

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




async def _end_worker(table: ProcessTable, process: ChildProcess) -> None:
    """How a worker is ended when the task holding it is cancelled (its ``deliver_cancel``): its tree, as ``kill``."""
    await end_tree(process, descendants(process.pid, table.scans), TERM_GRACE_S)
