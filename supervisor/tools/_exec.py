"""``workspace.exec``: run one allowlisted command (argv, never a shell) in a sandbox. Off unless enabled.

The sandbox: cwd is the workspace, the environment is built from scratch (``PATH``, ``HOME``, ``LANG`` and
the operator's explicit ``env``), no network (a fresh network namespace; when that is unavailable and
isolation is required the call is refused rather than run unsandboxed), a wall-time limit, an address-space
limit, output capped per stream. The command runs in its own session/process group; on timeout, and after
it exits (for stragglers holding the pipes), the whole group is SIGKILLed, then what is left of its session (a
process that left the group), and all of it is reaped before the call returns.

File system: where namespaces work, the command also gets a mount namespace whose root holds only the
system directories (read-only), ``ExecPolicy.read_only_paths``, a private /tmp and /dev, its own /proc, and
the workspace — the supervisor's data dir (every namespace's HOME, the store, the tokens) and everything else
do not exist for it — and it runs without any capability (see ``_sandbox``). Where that can't be set up the
call is refused unless ``confine_filesystem`` is off; with network isolation also off (no namespaces at all)
the command sees the file system as the supervisor's user does.
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from types import MappingProxyType

import trio
from pydantic import Field, field_validator

from protocol import SandboxSummary, ToolClass

from .._orphans import end_session
from ._base import ErrorCode, Tool, ToolContext, ToolError, ToolInput, ToolResult, clip
from ._paths import workspace_root
from ._sandbox import SYSTEM_PATHS, SandboxProber, SandboxTools, confine_spec, visible_in_confinement

DEFAULT_EXEC_PATH = "/usr/local/bin:/usr/bin:/bin"
_DRAIN_GRACE_S = 2.0


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


def _workspace_owner(workspace: str) -> tuple[int, int] | None:
    """Whom a confined command runs as: the workspace's owner when that is not the supervisor (a namespace's
    uid), so the command can work there and what it creates stays the namespace's. Only a root supervisor can
    switch; otherwise the command runs as the supervisor, as it always did."""
    info = os.stat(workspace)
    if os.geteuid() != 0 or info.st_uid == 0:
        return None
    return (info.st_uid, info.st_gid)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


async def _end_command(process: trio.Process) -> None:
    """SIGKILL the command's group and reap all it started before returning: the leader first, so that what it
    started has been re-parented by the time its session is ended. Shielded, so that a cancelled call does not
    leave half of it behind; not bounded in time, so that a slow machine does not either."""
    with trio.CancelScope(shield=True):
        _kill_group(process.pid)
        await process.wait()
        await trio.to_thread.run_sync(end_session, process.pid)


async def _supervise(
    process: trio.Process, nursery: trio.Nursery, timeout: float, out: _Capture, err: _Capture
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
    await _end_command(process)  # on timeout, and for stragglers still holding the pipes
    with trio.move_on_after(_DRAIN_GRACE_S):  # a daemon that left the session may keep a pipe open
        await drained.wait()
    nursery.cancel_scope.cancel()
    return deadline.cancelled_caught


async def _run(command: list[str], cwd: str, env: dict[str, str], timeout: float, cap: int) -> _Completed:
    out, err = _Capture(cap), _Capture(cap)
    started = time.monotonic()
    start_error: OSError | None = None
    timed_out = False
    async with trio.open_nursery() as nursery:
        try:
            process: trio.Process = await nursery.start(
                partial(
                    trio.run_process,
                    command,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    check=False,
                    cwd=cwd,
                    env=env,
                    start_new_session=True,
                    deliver_cancel=_end_command,
                )
            )
        except OSError as exc:  # raised here bare; re-raised below, outside the nursery's exception group
            start_error = exc
        else:
            timed_out = await _supervise(process, nursery, timeout, out, err)
    if start_error is not None:
        raise start_error
    duration_ms = (time.monotonic() - started) * 1000
    return _Completed(process.returncode, timed_out, out, err, duration_ms)


class ExecTool:
    """Builds the sandboxed command line and runs it; holds the policy and the sandbox probe."""

    def __init__(self, policy: ExecPolicy, prober: SandboxProber | None = None) -> None:
        self.policy = policy
        self.prober = prober or SandboxProber()

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

    def _prefix(self, tools: SandboxTools, memory_mb: int, workspace: str,
                executable: str) -> tuple[list[str], str, bool]:
        """(command prefix, sandbox label, network reachable) or ``SANDBOX_UNAVAILABLE``."""
        prefix: list[str] = []
        if tools.netns_prefix is not None and tools.netns_label is not None:
            prefix += self._namespaces(tools, memory_mb, workspace, executable)
            label, network = tools.netns_label, False
        elif self.policy.require_network_isolation:
            raise ToolError(
                ErrorCode.SANDBOX_UNAVAILABLE,
                "network isolation is required but no network namespace can be created here "
                "(`unshare -n` and `unshare -r -n` both failed); refusing to run unsandboxed",
            )
        else:
            label, network = "no-netns", True
        if tools.prlimit is None:
            raise ToolError(
                ErrorCode.SANDBOX_UNAVAILABLE,
                "`prlimit` is not available, so the memory limit cannot be enforced",
            )
        prefix += [tools.prlimit, f"--as={memory_mb * 1024 * 1024}", "--core=0", "--"]
        return prefix, label, network

    def _namespaces(self, tools: SandboxTools, memory_mb: int, workspace: str, executable: str) -> list[str]:
        """The namespace prefix: with a confined file system unless the policy turned that off."""
        assert tools.netns_prefix is not None
        if not self.policy.confine_filesystem:
            return list(tools.netns_prefix)
        if tools.confine_prefix is None:
            raise ToolError(
                ErrorCode.SANDBOX_UNAVAILABLE,
                "file-system confinement is required but no mount namespace could be set up here (`unshare -m` "
                "with a new root failed); refusing to run with the whole file system visible — an operator may "
                "set ExecPolicy.confine_filesystem=False to accept that",
            )
        read_only = self.policy.read_only_paths
        if not visible_in_confinement(executable, (*read_only, workspace)):
            raise ToolError(
                ErrorCode.COMMAND_REFUSED,
                f"allowlisted command {executable!r} is not visible in the confined sandbox, which shows only "
                f"{', '.join(SYSTEM_PATHS)}, the workspace and ExecPolicy.read_only_paths "
                f"({', '.join(read_only) or 'none'}); add its directory to read_only_paths",
            )
        return [*tools.confine_prefix, confine_spec(workspace, read_only, tmp_mb=memory_mb,
                                                    run_as=_workspace_owner(workspace))]

    def environment(self, workspace: str) -> dict[str, str]:
        base = {"PATH": self.policy.path, "HOME": workspace, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
        return {**base, **self.policy.env}

    async def run(self, args: ExecInput, ctx: ToolContext) -> ToolResult:
        executable = self.resolve(args.argv[0])
        root = str(workspace_root(ctx.workspace))
        limits = ctx.limits
        prefix, label, network = self._prefix(await self.prober.get(), limits.exec_memory_mb, root, executable)
        timeout = min(args.timeout_s or math.inf, limits.exec_timeout_s)
        sandbox = SandboxSummary(
            kind="subprocess",
            network=network,
            time_limit_s=timeout,
            memory_limit_mb=limits.exec_memory_mb,
            workspace=root,
        )
        env_name = f"supervisor:sandbox({label})"
        command = [*prefix, executable, *args.argv[1:]]
        try:
            done = await _run(command, root, self.environment(root), timeout, limits.exec_output_max_bytes)
        except OSError as exc:
            raise ToolError(
                ErrorCode.IO_ERROR, f"could not start {args.argv[0]!r}: {exc.strerror or exc}"
            ) from exc
        stdout, stderr = done.stdout.text(), done.stderr.text()
        if done.timed_out:
            status = f"timed out after {timeout:g}s and was killed"
        else:
            status = f"exited with {done.returncode}"
        return ToolResult(
            content={
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


def make_exec_tool(policy: ExecPolicy, prober: SandboxProber | None = None) -> Tool[ExecInput]:
    runner = ExecTool(policy, prober)
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
