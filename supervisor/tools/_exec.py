"""``workspace.exec``: run one allowlisted command (argv, never a shell) in a sandbox. Off unless enabled.

The sandbox: cwd is the workspace, the environment is built from scratch (``PATH``, ``HOME``, ``LANG`` and
the operator's explicit ``env``), no network (a fresh network namespace; when that is unavailable and
isolation is required the call is refused rather than run unsandboxed), a wall-time limit, an address-space
limit, output capped per stream. The command runs in its own session/process group; on timeout, and after
it exits (for stragglers holding the pipes), the whole group is SIGKILLed, then what is left of its session (a
process that left the group), and all of it is reaped before the call returns.

Who it runs as (``run_identity``): never a kernel uid or gid of 0. A root supervisor runs it as the workspace's
namespace uid when the workspace belongs to one (``--worker-uids``), otherwise as the dedicated exec uid
(``ExecPolicy.exec_uid``, ``serve --exec-uid``), to which the workspace is lent for the run (``_lend_tree``); a
non-root supervisor's command keeps its uid. Whatever it leaves in the workspace ends up owned as before the run
(new files: by their directory's owner) and without set-uid/set-gid bits (``_settle_tree``).

File system: where namespaces work, the command also gets a mount namespace whose root holds only the
system directories (read-only), ``ExecPolicy.read_only_paths``, a private /tmp and a minimal /dev, its own
read-only /proc, no /sys, and the workspace (``nosuid,nodev``) — the supervisor's data dir (every namespace's
HOME, the store, the tokens) and everything else do not exist for it — built by bubblewrap where it runs, else by
the built-in helper (see ``_sandbox``; the label in ``execution_env`` says which ran, and as which uid). Where
that can't be set up the call is refused unless ``confine_filesystem`` is off; with network isolation also off
(no namespaces at all) the command sees the file system as its (unprivileged) uid does.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import stat
import subprocess
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from functools import partial
from types import MappingProxyType

import trio
from pydantic import Field, JsonValue, field_validator

from codesdk.protocol import SandboxSummary, ToolClass

from codesdk.procs.children import Children
from codesdk.procs.orphans import end_command
from codesdk.procs.process import ChildProcess, run_in_own_session
from codesdk.procs.scan import Scans

from ..groups import ResourceGroups
from ..namespaces import WALK_FLAGS, DiskUsage, chmod_entry, walk_tree
from ._base import ErrorCode, Tool, ToolContext, ToolError, ToolInput, ToolResult, clip
from ._paths import disk_full_message, workspace_root
from ._sandbox import (
    DEFAULT_EXEC_UID,
    SYSTEM_PATHS,
    SandboxProber,
    SandboxTools,
    bwrap_argv,
    confine_spec,
    setpriv_argv,
    visible_in_confinement,
    within,
)

log = logging.getLogger(__name__)

DEFAULT_EXEC_PATH = "/usr/local/bin:/usr/bin:/bin"
_DRAIN_GRACE_S = 2.0
_SETID = stat.S_ISUID | stat.S_ISGID

__all__ = ["DEFAULT_EXEC_UID", "ExecInput", "ExecPolicy", "ExecTool", "check_exec_identity", "make_exec_tool"]


@dataclass(frozen=True)
class ExecPolicy:
    """Operator configuration of ``workspace.exec``. The default is off."""

    enabled: bool = False
    allowlist: tuple[str, ...] = ()  # bare command names (looked up on ``path``) or absolute paths
    require_network_isolation: bool = True
    path: str = DEFAULT_EXEC_PATH
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    # Show the command only the system dirs, these extra paths (read-only) and the workspace; refuse to run
    # where that is impossible while namespaces are in use.
    confine_filesystem: bool = True
    read_only_paths: tuple[str, ...] = ()
    # Whom commands run as when the supervisor is root and the workspace is not a namespace's own: a uid and
    # gid that own nothing on the host (``serve --exec-uid UID[:GID]``). Never 0.
    exec_uid: int = DEFAULT_EXEC_UID
    exec_gid: int = DEFAULT_EXEC_UID
    # The ``--worker-uids`` range: a workspace owned by one of these uids is that namespace's, and its commands
    # run as that uid (gid the same) instead.
    namespace_uids: range | None = None
    # The largest file a command may write (RLIMIT_FSIZE: past it the write fails and the command gets SIGXFSZ),
    # ``serve --exec-max-file-size`` (None: no limit).
    max_file_bytes: int | None = 1 << 30
    # Processes a command may have (``RLIMIT_NPROC``: counted per uid, so per namespace with ``--worker-uids``,
    # shared by every namespace that runs as the exec uid otherwise); the namespace's group caps it exactly.
    max_processes: int = 512

    def __post_init__(self) -> None:
        check_exec_identity(self.exec_uid, self.exec_gid, self.namespace_uids)


def check_exec_identity(uid: int, gid: int, namespace_uids: range | None = None) -> None:
    """``ValueError`` unless ``uid``:``gid`` may be the exec identity: not root, a valid id, and no namespace's
    (a command of one tenant would otherwise own another tenant's files)."""
    for kind, value in (("uid", uid), ("gid", gid)):
        if not 0 < value < 2**32 - 1:
            raise ValueError(f"invalid exec {kind} {value}: it must be between 1 and {2**32 - 2} (never root)")
        if namespace_uids is not None and value in namespace_uids:
            raise ValueError(
                f"exec {kind} {value} lies in the worker uid range {namespace_uids.start}:{len(namespace_uids)}: "
                "a command would own a namespace's files; choose an exec uid outside it")


class ExecInput(ToolInput):
    argv: list[str] = Field(
        min_length=1, description="Command and arguments; argv[0] must be an allowlisted command. No shell."
    )
    timeout_s: float | None = Field(
        default=None, gt=0, description="Wall-time limit in seconds (capped by the configured limit)."
    )

    @field_validator("argv")
    @classmethod
    def _no_nul(cls, argv: list[str]) -> list[str]:
        if any("\x00" in arg for arg in argv):
            raise ValueError("arguments may not contain NUL bytes")
        if not argv[0]:
            raise ValueError("argv[0] is empty")
        return argv


@dataclass
class _Capture:
    """Keeps the first ``limit`` bytes of a stream and counts (and discards) the rest."""

    limit: int
    data: bytearray = field(default_factory=bytearray)
    total: int = 0

    async def pump(self, stream: trio.abc.ReceiveStream) -> None:
        async with stream:  # closes our end of the pipe, even when cancelled
            async for chunk in stream:
                self.total += len(chunk)
                room = self.limit - len(self.data)
                if room > 0:
                    self.data += chunk[:room]

    def text(self) -> str:
        text = self.data.decode("utf-8", errors="replace")
        if self.total > len(self.data):
            text += f"\n[truncated: {self.total - len(self.data)} more bytes not shown]"
        return text


@dataclass(frozen=True)
class _Completed:
    returncode: int | None
    timed_out: bool
    stdout: _Capture
    stderr: _Capture
    duration_ms: float


@dataclass(frozen=True)
class RunAs:
    """The uid and gid a command runs as, and whether the workspace is lent to them for the run."""

    uid: int
    gid: int
    lend: bool


def run_identity(policy: ExecPolicy, workspace: str) -> RunAs | None:
    """Whom a command runs as; ``None``: the supervisor is not root, and the command keeps its (non-zero) uid.

    A root supervisor never lets a command keep uid 0 — not even without capabilities, which is still root for
    ``/proc/sys`` and for what it creates (a set-uid-root shell). A workspace that belongs to a namespace's uid
    (``--worker-uids``) is worked in as that uid: it owns the workspace already, and what it makes there stays its
    own. Every other workspace (the supervisor's, or a local user's) is worked in as the dedicated exec uid, which
    owns nothing anywhere, and the workspace is lent to it for the run (``_lend_tree``)."""
    if os.geteuid() != 0:
        return None
    owner = os.stat(workspace).st_uid
    if policy.namespace_uids is not None and owner in policy.namespace_uids:
        return RunAs(owner, owner, lend=False)
    return RunAs(policy.exec_uid, policy.exec_gid, lend=True)


_Owners = dict[tuple[int, int], tuple[int, int]]


def _lend_tree(root: str, uid: int, gid: int) -> _Owners:
    """Give the workspace tree to ``uid``:``gid`` for a run; returns who owned each inode before.

    Why lend it (chown there and back) rather than something else: the command must be able to write the
    workspace, and must not be root. A group or an ACL would need every file's mode or ACL changed (and an ACL a
    file system that has them), a world-writable workspace is out of the question, and the command's new files
    would belong to the exec uid either way — so they need handing back in any case. Ownership is the one thing
    the run changes and puts back exactly; modes stay as they are; the walk never follows a symlink."""
    owners: _Owners = {}
    fd = os.open(root, WALK_FLAGS)
    try:
        info = os.fstat(fd)
        owners[(info.st_dev, info.st_ino)] = (info.st_uid, info.st_gid)
        os.fchown(fd, uid, gid)
        for dir_fd, name, info in walk_tree(fd):
            owners.setdefault((info.st_dev, info.st_ino), (info.st_uid, info.st_gid))
            try:
                os.chown(name, uid, gid, dir_fd=dir_fd, follow_symlinks=False)
            except OSError as exc:  # read-only, immutable, gone meanwhile: the command cannot change it, that's all
                log.debug("exec: could not lend %s in %s: %s", name, root, exc)
    except OSError:
        _settle_tree(root, owners, (uid, gid))  # give back what was lent before failing
        raise
    finally:
        os.close(fd)
    return owners


def _settle_tree(root: str, owners: _Owners | None, lent_to: tuple[int, int] | None) -> None:
    """After a run, once every process of the command is gone: no set-uid/set-gid bit survives on anything (a set-gid
    directory would give its group to whatever is created in it later), and, if the tree was lent (``owners``), each entry goes back to its owner from before — a new one to
    the owner of the directory it is in (the workspace's owner, as the supervisor's own tools do it). Logs what it
    cannot do rather than failing the call: the command has run."""
    try:
        fd = os.open(root, WALK_FLAGS)
    except OSError as exc:
        log.warning("exec: could not settle the workspace %s after the command: %s", root, exc)
        return
    try:
        if owners is not None:
            info = os.fstat(fd)
            was = owners.get((info.st_dev, info.st_ino))
            os.fchown(fd, *(was if was is not None and was != lent_to else (os.getuid(), os.getgid())))
        for dir_fd, name, info in walk_tree(fd):
            try:
                if owners is not None:
                    was = owners.get((info.st_dev, info.st_ino))
                    if was is None or was == lent_to:  # made during the run (or left lent by a crash)
                        folder = os.fstat(dir_fd)
                        was = (folder.st_uid, folder.st_gid)
                    if (info.st_uid, info.st_gid) != was:
                        os.chown(name, *was, dir_fd=dir_fd, follow_symlinks=False)  # clears set-uid on a file too
                        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                if info.st_mode & _SETID and not stat.S_ISLNK(info.st_mode):
                    chmod_entry(dir_fd, name, lambda mode: mode & ~_SETID)
            except OSError as exc:
                log.warning("exec: could not settle %s in %s after the command: %s", name, root, exc)
    except OSError as exc:
        log.warning("exec: could not settle the workspace %s after the command: %s", root, exc)
    finally:
        os.close(fd)


@dataclass
class _Loan:
    to: tuple[int, int]
    owners: _Owners
    users: int = 0


class _Lender:
    """The workspaces lent to an exec uid right now (per trio run): concurrent commands in one workspace share a
    loan, the last one to end gives it back; a workspace inside or around a lent one waits for it."""

    def __init__(self) -> None:
        self.loans: dict[str, _Loan] = {}
        self.lock = trio.Lock()
        self.changed = trio.Event()

    def _blocked(self, root: str, to: tuple[int, int]) -> bool:
        for other, loan in self.loans.items():
            if other == root:
                return loan.to != to
            if within(root, other) or within(other, root):
                return True
        return False

    async def take(self, root: str, to: tuple[int, int]) -> _Loan:
        while True:
            async with self.lock:
                if not self._blocked(root, to):
                    with trio.CancelScope(shield=True):  # a loan half made would never be given back
                        loan = self.loans.get(root)
                        if loan is None:
                            owners = await trio.to_thread.run_sync(_lend_tree, root, *to)
                            loan = self.loans[root] = _Loan(to, owners)
                        loan.users += 1
                        return loan
                changed = self.changed
            await changed.wait()

    async def give_back(self, root: str, loan: _Loan) -> None:
        with trio.CancelScope(shield=True):
            async with self.lock:
                loan.users -= 1
                if loan.users:
                    return
                del self.loans[root]
                try:
                    await trio.to_thread.run_sync(_settle_tree, root, loan.owners, loan.to)
                finally:
                    self.changed.set()
                    self.changed = trio.Event()


_LENDER: trio.lowlevel.RunVar[_Lender] = trio.lowlevel.RunVar("codesdk_exec_lender")


def _lender() -> _Lender:
    try:
        return _LENDER.get()
    except LookupError:
        lender = _Lender()
        _LENDER.set(lender)
        return lender


@asynccontextmanager
async def _workspace_for(root: str, who: RunAs | None) -> AsyncIterator[None]:
    """The workspace, writable by ``who`` for the body; settled after it (see ``_settle_tree``)."""
    if who is None or not who.lend:
        try:
            yield
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(_settle_tree, root, None, None)
        return
    lender = _lender()
    loan = await lender.take(root, (who.uid, who.gid))
    try:
        yield
    finally:
        await lender.give_back(root, loan)


async def _supervise(
    process: trio.Process, nursery: trio.Nursery, timeout: float, out: _Capture, err: _Capture, scans: Scans
) -> bool:
    """Pump output, enforce the deadline, kill the group; returns whether the deadline hit."""
    drained = trio.Event()

    async def drain() -> None:
        assert process.stdout is not None and process.stderr is not None
        async with trio.open_nursery() as pumps:
            pumps.start_soon(out.pump, process.stdout)
            pumps.start_soon(err.pump, process.stderr)
        drained.set()

    nursery.start_soon(drain)
    with trio.move_on_after(timeout) as deadline:
        await process.wait()
    await end_command(process, scans)  # on timeout, and for stragglers still holding the pipes
    with trio.move_on_after(_DRAIN_GRACE_S):  # a daemon that left the session may keep a pipe open
        await drained.wait()
    nursery.cancel_scope.cancel()
    return deadline.cancelled_caught


async def _run(command: list[str], cwd: str, env: dict[str, str], timeout: float, cap: int, children: Children,
               scans: Scans) -> _Completed:
    out, err = _Capture(cap), _Capture(cap)
    started = time.monotonic()

    async def end(process: ChildProcess) -> None:
        assert isinstance(process, trio.Process)
        await end_command(process, scans)

    # Owned in ``children``: the sweep of adopted orphans must not reap it, its exit status is the result.
    async with trio.open_nursery() as nursery:
        process: trio.Process = await nursery.start(partial(
            run_in_own_session, command, children=children, deliver_cancel=end, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd))
        timed_out = await _supervise(process, nursery, timeout, out, err, scans)
    duration_ms = (time.monotonic() - started) * 1000
    return _Completed(process.returncode, timed_out, out, err, duration_ms)


class ExecTool:
    """Builds the sandboxed command line and runs it; holds the policy and the sandbox probe."""

    def __init__(self, policy: ExecPolicy, prober: SandboxProber | None = None,
                 children: Children | None = None, groups: ResourceGroups | None = None) -> None:
        """``children``: the registry of this process's children, where each command (and sandbox probe) is owned
        until reaped (None: one of its own, where nothing sweeps orphans). ``groups``: each call runs in a fresh
        leaf of its namespace's resource group (None, or none available: the process cap only)."""
        self.policy = policy
        self.groups = groups
        self.children = children if children is not None else Children()
        self.prober = prober or SandboxProber(self.children)
        self._scans = Scans()  # the /proc scans that end its commands' sessions

    def resolve(self, argv0: str) -> str:
        """The executable for ``argv0`` if it is allowlisted and exists; ``COMMAND_REFUSED`` otherwise."""
        if argv0 not in self.policy.allowlist:
            allowed = ", ".join(self.policy.allowlist) or "none"
            raise ToolError(
                ErrorCode.COMMAND_REFUSED, f"command {argv0!r} is not allowlisted (allowed: {allowed})"
            )
        if "/" in argv0:
            if not os.path.isabs(argv0) or not os.access(argv0, os.X_OK):
                raise ToolError(
                    ErrorCode.COMMAND_REFUSED, f"allowlisted command {argv0!r} is not an executable"
                )
            return argv0
        found = shutil.which(argv0, path=self.policy.path)
        if found is None:
            raise ToolError(
                ErrorCode.COMMAND_REFUSED, f"allowlisted command {argv0!r} is not on PATH {self.policy.path}"
            )
        return found

    def _plan(self, tools: SandboxTools, memory_mb: int, workspace: str, executable: str,
              who: RunAs | None) -> tuple[list[str], str, bool]:
        """(command prefix, sandbox label, network reachable) or ``SANDBOX_UNAVAILABLE``.

        Which sandbox: with a confined file system (the default), bubblewrap where it runs, else the built-in
        helper; with ``confine_filesystem`` off, ``unshare``'s namespaces only; with no namespaces at all and
        network isolation not required, none. Every chain ends in ``prlimit`` (the memory limit), and a root
        supervisor's chain switches to ``who`` before that (``setpriv``, or the helper itself)."""
        if tools.prlimit is None:
            raise ToolError(
                ErrorCode.SANDBOX_UNAVAILABLE,
                "`prlimit` is not available, so the memory limit cannot be enforced",
            )
        limit = [tools.prlimit, f"--as={memory_mb * 1024 * 1024}",
                 f"--fsize={self.policy.max_file_bytes or 'unlimited'}", "--core=0",
                 f"--nproc={self.policy.max_processes}", "--"]
        confine = self.policy.confine_filesystem
        if confine and (tools.bwrap is not None or tools.netns_prefix is not None):
            self._check_visible(executable, workspace)
        if confine and tools.bwrap is not None:
            sandbox = bwrap_argv(tools.bwrap, workspace, self.policy.read_only_paths, tmp_mb=memory_mb,
                                 privileged=who is not None)
            return [*sandbox, *self._switch(tools, who), *limit], "bwrap", False
        if tools.netns_prefix is not None and tools.netns_label is not None:
            if not confine:
                return [*tools.netns_prefix, *self._switch(tools, who), *limit], tools.netns_label, False
            if tools.confine_prefix is None:
                raise ToolError(
                    ErrorCode.SANDBOX_UNAVAILABLE,
                    "file-system confinement is required but neither bubblewrap nor a mount namespace can be set "
                    f"up here ({tools.bwrap_problem or 'bwrap failed'}; `unshare -m` with a new root failed); "
                    "refusing to run with the whole file system visible — install bubblewrap, or an operator may "
                    "set ExecPolicy.confine_filesystem=False to accept that",
                )
            spec = confine_spec(workspace, self.policy.read_only_paths, tmp_mb=memory_mb,
                                run_as=(who.uid, who.gid) if who is not None else None)
            return [*tools.confine_prefix, spec, *limit], tools.netns_label, False
        if self.policy.require_network_isolation:
            raise ToolError(
                ErrorCode.SANDBOX_UNAVAILABLE,
                "network isolation is required but no network namespace can be created here "
                f"(bubblewrap: {tools.bwrap_problem or 'not used'}; `unshare -n` and `unshare -r -n` both failed); "
                "refusing to run unsandboxed",
            )
        return [*self._switch(tools, who), *limit], "no-netns", True

    @asynccontextmanager
    async def _leaf(self, namespace: str | None) -> AsyncIterator[list[str]]:
        """The ``cgroup.procs`` files of a fresh leaf group for this call (none without groups); after the call
        everything left in it is killed and the leaf removed."""
        groups = self.groups
        if groups is None or namespace is None or not groups.available:
            yield []
            return
        try:
            leaf, files = await trio.to_thread.run_sync(groups.open_exec, namespace)
        except OSError as exc:
            raise ToolError(ErrorCode.SANDBOX_UNAVAILABLE,
                            f"namespace {namespace!r}: its resource group could not be created: {exc}") from exc
        try:
            yield [str(path) for path in files]
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(groups.close_exec, namespace, leaf)

    @staticmethod
    def _switch(tools: SandboxTools, who: RunAs | None) -> list[str]:
        """The ``setpriv`` step that makes a root supervisor's command ``who``; none for a non-root one."""
        if who is None:
            return []
        if tools.setpriv is None:
            raise ToolError(
                ErrorCode.SANDBOX_UNAVAILABLE,
                "`setpriv` (util-linux) is not available, so the command could not be switched away from root; "
                "refusing to run it as root",
            )
        return setpriv_argv(tools.setpriv, who.uid, who.gid)

    def _check_visible(self, executable: str, workspace: str) -> None:
        read_only = self.policy.read_only_paths
        if not visible_in_confinement(executable, (*read_only, workspace)):
            raise ToolError(
                ErrorCode.COMMAND_REFUSED,
                f"allowlisted command {executable!r} is not visible in the confined sandbox, which shows only "
                f"{', '.join(SYSTEM_PATHS)}, the workspace and ExecPolicy.read_only_paths "
                f"({', '.join(read_only) or 'none'}); add its directory to read_only_paths",
            )

    def environment(self, workspace: str) -> dict[str, str]:
        base = {"PATH": self.policy.path, "HOME": workspace, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
        return {**base, **self.policy.env}

    async def run(self, args: ExecInput, ctx: ToolContext) -> ToolResult:
        executable = self.resolve(args.argv[0])
        root = str(workspace_root(ctx.workspace))
        limits = ctx.limits
        who = run_identity(self.policy, root)
        prefix, label, network = self._plan(await self.prober.get(), limits.exec_memory_mb, root, executable, who)
        timeout = min(args.timeout_s or math.inf, limits.exec_timeout_s)
        sandbox = SandboxSummary(
            kind="subprocess",
            network=network,
            time_limit_s=timeout,
            memory_limit_mb=limits.exec_memory_mb,
            workspace=root,
        )
        env_name = f"supervisor:sandbox({label},uid={who.uid if who is not None else os.getuid()})"
        command = [*prefix, executable, *args.argv[1:]]
        try:
            async with _workspace_for(root, who), self._leaf(ctx.namespace) as join:
                done = await _run([*_joiner(join), *command], root, self.environment(root), timeout,
                                  limits.exec_output_max_bytes, self.children, self._scans)
        except OSError as exc:
            raise ToolError(
                ErrorCode.IO_ERROR, f"could not start {args.argv[0]!r}: {exc.strerror or exc}"
            ) from exc
        stdout, stderr = done.stdout.text(), done.stderr.text()
        if done.timed_out:
            status = f"timed out after {timeout:g}s and was killed"
        else:
            status = f"exited with {done.returncode}"
        extra: dict[str, JsonValue] = {}
        if done.returncode != 0 and _disk_full(root):  # what the command's ENOSPC meant, for the model
            extra["note"] = disk_full_message(Path(root))
        return ToolResult(
            content={
                **extra,
                "argv": list(args.argv),
                "exit_code": done.returncode,
                "timed_out": done.timed_out,
                "stdout": stdout,
                "stderr": stderr,
                "stdout_bytes": done.stdout.total,
                "stderr_bytes": done.stderr.total,
                "duration_ms": round(done.duration_ms, 1),
            },
            is_error=done.timed_out or done.returncode != 0,
            preview=clip(f"$ {' '.join(args.argv)}: {status}\n{stdout or stderr}"),
            sandbox=sandbox,
            execution_env=env_name,
            stdout=stdout,
            stderr=stderr,
        )


def _disk_full(root: str) -> bool:
    try:
        return DiskUsage.of(root).full
    except OSError:
        return False


#: Joins the group before anything of the call runs (its own pid, then ``exec``): no move after a spawn that could
#: race the sandbox's own forks. Arguments: the ``cgroup.procs`` files, ``--``, the command. The call is also made
#: the first victim of an OOM kill in its namespace (``oom_score_adj`` 1000, inherited): its private /tmp's pages
#: belong to no process, so otherwise the kill would pick the namespace's biggest process — its worker — and the
#: filler would go on while the tasks failed.
_JOIN = ('for f do [ "$f" = -- ] && break; echo $$ 2>/dev/null >"$f" || '
         '{ echo "codesdk: could not join the namespace resource group ($f)" >&2; exit 125; }; shift; done; '
         'echo 1000 2>/dev/null >/proc/self/oom_score_adj; shift; exec "$@"')


def _joiner(files: list[str]) -> list[str]:
    return ["/bin/sh", "-c", _JOIN, "sh", *files, "--"] if files else []


def make_exec_tool(policy: ExecPolicy, prober: SandboxProber | None = None,
                   children: Children | None = None, groups: ResourceGroups | None = None) -> Tool[ExecInput]:
    runner = ExecTool(policy, prober, children, groups)
    return Tool(
        name="workspace.exec",
        description=(
            "Run an allowlisted command (argv list, no shell) in the workspace, sandboxed: no network, time "
            f"and memory limits, output capped. Allowed commands: {', '.join(policy.allowlist) or 'none'}."
        ),
        input_model=ExecInput,
        tool_class=ToolClass.DANGEROUS,
        run=runner.run,
        execution_env="supervisor:sandbox",
        sandbox_kind="subprocess",
    )
