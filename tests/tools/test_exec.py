"""workspace.exec: off by default; when on, allowlisted argv only, sandboxed (netns, time, memory, env, output)."""

from __future__ import annotations

import ctypes
import dataclasses
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]
import pytest
import trio

from codesdk.supervisor.tools import (
    ExecPolicy,
    SandboxProber,
    SandboxTools,
    ToolContext,
    ToolLimits,
    ToolRegistry,
    ToolResult,
    ToolsConfig,
    probe_sandbox,
)
from codesdk.supervisor.tools import DEFAULT_EXEC_UID

from tests.sandboxes import NO_BWRAP, FixedProber
from tests.seeds import Seed

ALLOW = ("echo", "sh", "sleep", "python3", "env", "pwd", "false")
EXEC_SEED = Seed.from_env("CODESDK_EXEC_SEED")
#: The uid a command runs as here: the exec uid when the tests run as root (as in CI), else ours.
EXEC_UID = DEFAULT_EXEC_UID if os.geteuid() == 0 else os.getuid()


def env_label(label: str) -> str:
    """The ``execution_env`` of a call that ran in the sandbox called ``label``."""
    return f"supervisor:sandbox({label},uid={EXEC_UID})"


def expected_label(tools: SandboxTools) -> str:
    """Which sandbox the default policy picks with these tools: bubblewrap where it runs, else the helper."""
    return "bwrap" if tools.bwrap is not None else str(tools.netns_label)


@pytest.fixture(scope="module")
def sandbox_tools() -> SandboxTools:
    return trio.run(probe_sandbox)


@pytest.fixture
def netns(sandbox_tools: SandboxTools) -> SandboxTools:
    if sandbox_tools.netns_prefix is None:
        pytest.skip("no network namespace here: `unshare -n` and `unshare -r -n` both fail")
    if sandbox_tools.prlimit is None:
        pytest.skip("`prlimit` is unavailable here")
    return sandbox_tools


def registry(prober: SandboxProber | None = None, **policy: Any) -> ToolRegistry:
    settings: dict[str, Any] = {"enabled": True, "allowlist": ALLOW, **policy}
    return ToolRegistry(ToolsConfig(exec=ExecPolicy(**settings)), prober=prober)


async def run(
    reg: ToolRegistry, ws: Path, args: Any, limits: ToolLimits | None = None, budget: float = 30
) -> ToolResult:
    with trio.fail_after(budget):
        return await reg.execute("workspace.exec", args, ToolContext(ws, limits or ToolLimits()))


def content(result: ToolResult) -> dict[str, Any]:
    assert isinstance(result.content, dict)
    return result.content


def code_of(result: ToolResult) -> str:
    assert result.is_error
    return str(content(result)["error"]["code"])


def descendants() -> set[int]:
    """This process's descendants, running or zombie."""
    return {child.pid for child in psutil.Process().children(recursive=True)}


@contextmanager
def child_subreaper(on: bool) -> Iterator[None]:
    """This process adopts orphaned descendants as the supervisor does (or not) meanwhile; restored after."""
    pr_set_child_subreaper, pr_get_child_subreaper = 36, 37
    libc = ctypes.CDLL(None, use_errno=True)
    was = ctypes.c_int()
    assert libc.prctl(pr_get_child_subreaper, ctypes.byref(was), 0, 0, 0) == 0
    assert libc.prctl(pr_set_child_subreaper, int(on), 0, 0, 0) == 0
    try:
        yield
    finally:
        libc.prctl(pr_set_child_subreaper, was.value, 0, 0, 0)


@pytest.fixture(params=[True, False], ids=["subreaper", "no-subreaper"])
def subreaper(request: pytest.FixtureRequest) -> Iterator[None]:
    with child_subreaper(request.param):
        yield


@pytest.fixture(params=["bwrap", "helper", "no-namespaces"])
def sandboxed(request: pytest.FixtureRequest, sandbox_tools: SandboxTools) -> ToolRegistry:
    """The exec tool with bubblewrap (its init is pid 1 of the pid namespace, the command its child), with the
    built-in helper (the command is the pid namespace's init), or with no sandbox (the command leads its session
    itself)."""
    if sandbox_tools.prlimit is None:
        pytest.skip("`prlimit` is unavailable here")
    if request.param == "bwrap":
        if sandbox_tools.bwrap is None:
            pytest.skip(NO_BWRAP)
        return registry()
    if request.param == "helper":
        if sandbox_tools.confine_prefix is None:
            pytest.skip("no mount namespace with a new root here (`unshare -m` + pivot_root)")
        return registry(FixedProber(dataclasses.replace(sandbox_tools, bwrap=None)))
    bare = SandboxTools(netns_prefix=None, netns_label=None, prlimit=sandbox_tools.prlimit,
                        setpriv=sandbox_tools.setpriv)
    return registry(FixedProber(bare), require_network_isolation=False)


def processes_with(marker: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmdline = proc.info["cmdline"] or []
        if any(marker in part for part in cmdline) and proc.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(proc)
    return found


async def test_exec_is_disabled_by_default(tmp_path: Path) -> None:
    default = ToolRegistry()
    assert "workspace.exec" not in default.manifest().names()
    result = await run(default, tmp_path, {"argv": ["echo", "hi"]})
    assert code_of(result) == "unknown_tool"
    assert "disabled" in content(result)["error"]["message"]


async def test_echo_runs_in_the_sandbox(tmp_path: Path, netns: SandboxTools) -> None:
    result = await run(registry(), tmp_path, {"argv": ["echo", "hello", "$HOME", "; rm -rf /"]})
    assert not result.is_error, result.content
    assert result.stdout == "hello $HOME ; rm -rf /\n"  # argv, no shell expansion
    body = content(result)
    assert (body["exit_code"], body["timed_out"], body["stdout_bytes"]) == (0, False, len(result.stdout))
    assert result.execution_env == env_label(expected_label(netns))
    assert result.sandbox.kind == "subprocess" and result.sandbox.network is False
    assert result.sandbox.memory_limit_mb == 1024 and result.sandbox.time_limit_s == 60
    assert result.preview.startswith("$ echo hello")


async def test_cwd_is_workspace_and_env_is_built_from_scratch(
    tmp_path: Path, netns: SandboxTools, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CODESDK_TEST_SECRET", "leak")
    reg = registry(env={"EXTRA": "1"})
    pwd = await run(reg, tmp_path, {"argv": ["pwd"]})
    assert pwd.stdout == f"{tmp_path.resolve()}\n"
    env = await run(reg, tmp_path, {"argv": ["env"]})
    names = {line.split("=", 1)[0] for line in (env.stdout or "").splitlines()}
    assert "CODESDK_TEST_SECRET" not in names
    assert {"PATH", "HOME", "LANG", "LC_ALL", "EXTRA"} <= names
    assert names <= {"PATH", "HOME", "LANG", "LC_ALL", "EXTRA", "PWD", "SHLVL", "_"}


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["rm", "-rf", "x"], "'rm' is not allowlisted"),
        (["/bin/echo", "x"], "'/bin/echo' is not allowlisted"),
        (["./echo"], "not allowlisted"),
        (["bash", "-c", "echo"], "'bash' is not allowlisted"),
    ],
)
async def test_allowlist_is_enforced(tmp_path: Path, argv: list[str], fragment: str) -> None:
    result = await run(registry(), tmp_path, {"argv": argv})
    assert code_of(result) == "command_refused"
    assert fragment in content(result)["error"]["message"]
    assert result.execution_env == "supervisor:sandbox" and result.sandbox.kind == "subprocess"


async def test_allowlisted_but_missing_command(tmp_path: Path) -> None:
    result = await run(
        registry(allowlist=("definitely-not-a-command-xyz",)),
        tmp_path,
        {"argv": ["definitely-not-a-command-xyz"]},
    )
    assert code_of(result) == "command_refused"
    assert "not on PATH" in content(result)["error"]["message"]


@pytest.mark.parametrize(
    "args",
    [{"argv": []}, {}, {"argv": "echo hi"}, {"argv": ["echo\x00"]}, {"argv": ["echo"], "timeout_s": 0}],
)
async def test_invalid_exec_input(tmp_path: Path, args: dict[str, Any]) -> None:
    assert code_of(await run(registry(), tmp_path, args)) == "invalid_input"


async def test_nonzero_exit_is_an_error_result_with_output(tmp_path: Path, netns: SandboxTools) -> None:
    result = await run(registry(), tmp_path, {"argv": ["sh", "-c", "echo out; echo err >&2; exit 3"]})
    assert result.is_error
    assert (content(result)["exit_code"], result.stdout, result.stderr) == (3, "out\n", "err\n")


async def test_timeout_kills_the_whole_process_group(tmp_path: Path, netns: SandboxTools) -> None:
    marker = f"31.{uuid.uuid4().int % 10**6:06d}"
    result = await run(
        registry(),
        tmp_path,
        {"argv": ["sh", "-c", f"sleep {marker} & sleep {marker}; wait"], "timeout_s": 0.5},
    )
    body = content(result)
    assert result.is_error and body["timed_out"] is True and body["exit_code"] < 0
    assert "timed out after 0.5s" in result.preview
    assert processes_with(marker) == []  # all ended before the call returned


async def test_timeout_kills_the_group_without_namespaces(
    tmp_path: Path, sandbox_tools: SandboxTools
) -> None:
    """The plain process-group kill, without a pid namespace to help."""
    if sandbox_tools.prlimit is None:
        pytest.skip("`prlimit` is unavailable here")
    prober = FixedProber(SandboxTools(netns_prefix=None, netns_label=None, prlimit=sandbox_tools.prlimit,
                                      setpriv=sandbox_tools.setpriv))
    reg = registry(prober, require_network_isolation=False)
    marker = f"32.{uuid.uuid4().int % 10**6:06d}"
    result = await run(
        reg, tmp_path, {"argv": ["sh", "-c", f"sleep {marker} & sleep {marker}; wait"], "timeout_s": 0.5}
    )
    assert content(result)["timed_out"] is True
    assert result.execution_env == env_label("no-netns") and result.sandbox.network is True
    assert processes_with(marker) == []


async def test_configured_time_limit_caps_the_requested_one(tmp_path: Path, netns: SandboxTools) -> None:
    result = await run(
        registry(), tmp_path, {"argv": ["sleep", "5"], "timeout_s": 100}, ToolLimits(exec_timeout_s=0.3)
    )
    assert content(result)["timed_out"] is True
    assert result.sandbox.time_limit_s == 0.3


async def test_cancelling_the_call_kills_the_command(tmp_path: Path, netns: SandboxTools) -> None:
    marker = f"33.{uuid.uuid4().int % 10**6:06d}"
    before = descendants()
    with trio.fail_after(10):
        with trio.move_on_after(0.5):
            await registry().execute("workspace.exec", {"argv": ["sleep", marker]}, ToolContext(tmp_path))
    assert processes_with(marker) == []
    assert descendants() - before == set()  # reaped too, before the cancelled call returned


async def test_time_limit_at_random_moments_of_start_up_leaves_nothing(tmp_path: Path, netns: SandboxTools) -> None:
    """The limit lands anywhere from before ``unshare`` forked the pid namespace's init to after it exec'd the
    command: whatever exists by then (the init still the leader's child, re-parented, dying) is reaped before
    the call returns — what once left a zombie ``sleep`` behind on a slow machine."""
    reg = registry()
    with EXEC_SEED.rng() as rng, child_subreaper(True):
        for _ in range(12):
            limit = round(rng.uniform(0.001, 0.3), 3)
            before = descendants()
            result = await run(reg, tmp_path, {"argv": ["sleep", "30"]}, ToolLimits(exec_timeout_s=limit))
            assert content(result)["timed_out"] is True, result.content
            assert descendants() - before == set(), f"left behind after a {limit}s limit"


#: A process of the command leaves the group that is killed, and clears its parent-death signal, so that only an
#: explicit kill ends it: for the time limit the command itself where it can (the init of a pid namespace), else
#: a child of it (a session leader cannot). With ``exit`` the command exits once its child has left the group.
LEAVE_THE_GROUP = """\
import ctypes, os, sys, time
ending, marker = sys.argv[1], float(sys.argv[2])
ctypes.CDLL(None).prctl(1, 0, 0, 0, 0)  # PR_SET_PDEATHSIG: none
if ending == "time limit" and os.getsid(0) != os.getpid():
    os.setpgid(0, 0)
    print("left the group", flush=True)
    time.sleep(marker)
done_leaving, left = os.pipe()
if os.fork() == 0:
    os.setpgid(0, 0)
    print("left the group", flush=True)
    os.close(left)
    time.sleep(marker)
    sys.exit()
os.close(left)
os.read(done_leaving, 1)
if ending == "time limit":
    time.sleep(marker)
"""


@pytest.mark.parametrize("ending", ["time limit", "exit"])
async def test_a_process_that_left_the_group_is_killed_and_reaped_before_the_call_returns(
    tmp_path: Path, sandboxed: ToolRegistry, subreaper: None, ending: str
) -> None:
    """Killing the group misses it, but it is still in the command's session: it is ended with the rest, and
    reaped before the call returns if it was re-parented to us."""
    marker = f"34.{uuid.uuid4().int % 10**6:06d}"
    limit = 1.0
    for _ in range(6):  # until it got to leave before the limit: a slow machine needs a longer one
        before = descendants()
        result = await run(sandboxed, tmp_path, {"argv": ["python3", "-c", LEAVE_THE_GROUP, ending, marker]},
                           ToolLimits(exec_timeout_s=limit), budget=60)
        assert processes_with(marker) == [], "it outlived the call"
        assert descendants() - before == set(), "it was left to us as a zombie that nobody reaps"
        if "left the group" in (result.stdout or ""):
            break
        limit *= 2
    else:
        pytest.fail(f"the command never left its group before the time limit, up to {limit / 2:g}s: {result.content}")
    assert content(result)["timed_out"] is (ending == "time limit"), result.content


async def test_no_network_inside(tmp_path: Path, netns: SandboxTools) -> None:
    script = (
        "import socket, sys\n"
        "print(sorted(l.split(':')[0].strip() for l in open('/proc/net/dev').readlines()[2:]))\n"
        "try:\n"
        "    socket.create_connection(('1.1.1.1', 80), timeout=3)\n"
        "except OSError as exc:\n"
        "    print('connect failed:', exc.errno)\n"
        "    sys.exit(0)\n"
        "print('connected')\n"
        "sys.exit(1)\n"
    )
    result = await run(registry(), tmp_path, {"argv": ["python3", "-c", script]})
    assert not result.is_error, (result.stdout, result.stderr)
    assert result.stdout is not None
    assert result.stdout.splitlines()[0] == "['lo']"
    assert "connect failed: 101" in result.stdout  # ENETUNREACH


async def test_required_isolation_unavailable_refuses_to_run(tmp_path: Path) -> None:
    prober = FixedProber(SandboxTools(netns_prefix=None, netns_label=None, prlimit="/usr/bin/prlimit"))
    result = await run(registry(prober), tmp_path, {"argv": ["sh", "-c", "touch ran"]})
    assert code_of(result) == "sandbox_unavailable"
    assert "refusing to run unsandboxed" in content(result)["error"]["message"]
    assert not (tmp_path / "ran").exists()


async def test_missing_prlimit_refuses_to_run(tmp_path: Path, netns: SandboxTools) -> None:
    prober = FixedProber(SandboxTools(netns.netns_prefix, netns.netns_label, prlimit=None))
    result = await run(registry(prober), tmp_path, {"argv": ["sh", "-c", "touch ran"]})
    assert code_of(result) == "sandbox_unavailable"
    assert not (tmp_path / "ran").exists()


async def test_memory_limit(tmp_path: Path, netns: SandboxTools) -> None:
    script = "x = bytearray(1024 * 1024 * 1024)\nprint('allocated')"
    result = await run(
        registry(), tmp_path, {"argv": ["python3", "-c", script]}, ToolLimits(exec_memory_mb=256)
    )
    assert result.is_error
    assert "MemoryError" in (result.stderr or "")
    assert result.sandbox.memory_limit_mb == 256


async def test_output_is_capped(tmp_path: Path, netns: SandboxTools) -> None:
    script = "import sys; sys.stdout.write('x' * 100000); sys.stderr.write('e' * 10)"
    result = await run(
        registry(), tmp_path, {"argv": ["python3", "-c", script]}, ToolLimits(exec_output_max_bytes=1000)
    )
    body = content(result)
    assert (body["stdout_bytes"], body["stderr_bytes"]) == (100000, 10)
    assert result.stdout == "x" * 1000 + "\n[truncated: 99000 more bytes not shown]"
    assert result.stderr == "e" * 10
    assert len(result.preview) <= 500


async def test_prober_caches(sandbox_tools: SandboxTools) -> None:
    prober = SandboxProber()
    with trio.fail_after(30):
        first = await prober.get()
        assert await prober.get() is first
    assert first == sandbox_tools
