"""workspace.exec in the namespace's resource group: a fork bomb stays at the namespace's process cap, a /tmp filler
is stopped at its memory limit, a daemon a call leaves behind dies with the call; without groups the per-uid cap
(RLIMIT_NPROC) still holds. As root (CI); skipped, saying why, elsewhere."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]
import pytest
import trio

from codesdk.supervisor.groups import GroupLimits, ResourceGroups
from codesdk.supervisor.tools import ExecPolicy, ToolContext, ToolLimits, ToolRegistry, ToolResult, ToolsConfig

from tests.groups.conftest import MEMORY_CAP, PIDS_CAP, MakeGroups
from tests.waits import wait_for

#: Forks children that wait (each a process of the namespace) until a fork fails or 200 are running; prints how
#: many it started and why it stopped. 200 is over the cap and still small for this shared machine.
BOMB = """
import errno, os, signal
started = 0
why = "none"
for _ in range(200):
    try:
        pid = os.fork()
    except OSError as exc:
        why = errno.errorcode.get(exc.errno, str(exc.errno))
        break
    if pid == 0:
        signal.pause()
        os._exit(0)
    started += 1
print(started, why)
"""
#: Writes 200 MiB into the sandbox's private /tmp (a tmpfs) with the namespace's memory limit at 64 MiB.
FILLER = "head -c 209715200 /dev/zero > /tmp/fill; echo written=$(stat -c %s /tmp/fill)"


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    os.chmod(tmp_path, 0o711)
    os.chmod(ws, 0o777)  # the exec uid works here
    return ws


def registry(groups: ResourceGroups | None, **policy: Any) -> ToolRegistry:
    settings: dict[str, Any] = {"enabled": True, "allowlist": ("sh", "python3"), **policy}
    return ToolRegistry(ToolsConfig(exec=ExecPolicy(**settings)), groups=groups)


async def run(reg: ToolRegistry, ws: Path, argv: list[str], namespace: str | None = "user:tenant") -> ToolResult:
    with trio.fail_after(60):
        return await reg.execute("workspace.exec", {"argv": argv, "timeout_s": 30},
                                 ToolContext(ws, ToolLimits(), namespace=namespace))


def content(result: ToolResult) -> dict[str, Any]:
    assert isinstance(result.content, dict)
    return result.content


def _host_processes() -> int:
    return sum(1 for name in os.listdir("/proc") if name.isdigit())


def _bomb(reg: ToolRegistry, ws: Path, namespace: str | None = "user:tenant") -> tuple[int, str]:
    result = trio.run(run, reg, ws, ["python3", "-c", BOMB], namespace)
    out = content(result)
    assert out["exit_code"] == 0, out
    started, why = str(out["stdout"]).split()
    return int(started), why


def test_an_exec_fork_bomb_stays_at_the_namespace_cap_and_the_host_returns_to_baseline(
        make_groups: MakeGroups, workspace: Path) -> None:
    groups = make_groups(GroupLimits(pids=PIDS_CAP, memory=512 * 1024**2))  # the process cap is what binds here
    baseline = _host_processes()
    started, why = _bomb(registry(groups), workspace)
    # The sandbox's own processes (bwrap, the interpreter) count too: the bomb stopped below the cap, refused.
    assert why == "EAGAIN" and PIDS_CAP - 8 <= started < PIDS_CAP, (started, why)
    wait_for(f"the host's process count back at its baseline of {baseline} (+ slack for other users)",
             lambda: _host_processes() <= baseline + 16)
    assert groups.tree is not None and groups.tree.children() == []  # the call's leaf and the namespace's group


def test_without_groups_the_exec_process_cap_still_holds(workspace: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("the cap is per uid: as a non-root user the command runs as us, with our own processes")
    started, why = _bomb(registry(None, max_processes=32), workspace)
    assert why == "EAGAIN" and started < 32, (started, why)


def test_a_tmp_filler_is_stopped_at_the_namespace_memory_limit(groups: ResourceGroups, workspace: Path) -> None:
    shmem_before = _meminfo("Shmem")
    result = trio.run(run, registry(groups), workspace, ["sh", "-c", FILLER])
    out = content(result)
    assert result.is_error, out
    written = str(out["stdout"]).removeprefix("written=").strip()
    assert out["exit_code"] == -9 or (written.isdigit() and int(written) <= MEMORY_CAP), out
    # Its tmpfs went with its mount namespace: the host's shared memory is where it was (other users aside).
    wait_for("the filler's tmpfs pages released",
             lambda: _meminfo("Shmem") <= shmem_before + MEMORY_CAP // 2)


def test_a_daemon_an_exec_call_leaves_dies_with_the_call(groups: ResourceGroups, workspace: Path) -> None:
    marker = "codesdk-groups-daemon-test"
    # Double fork into a session of its own, and exit: the daemon outlives the command's own tree.
    daemon = (f"setsid sh -c 'exec -a {marker} sleep 1000' </dev/null >/dev/null 2>&1 & echo spawned")
    result = trio.run(run, registry(groups), workspace, ["sh", "-c", daemon])
    assert content(result)["exit_code"] == 0, result.content
    wait_for("no daemon left", lambda: not _named(marker))


def _named(marker: str) -> list[int]:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        if marker in " ".join(process.info["cmdline"] or []):
            found.append(process.pid)
    return found


def _meminfo(key: str) -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        name, _, value = line.partition(":")
        if name == key:
            return int(value.split()[0]) * 1024
    raise AssertionError(f"no {key} in /proc/meminfo")




def test_a_tmp_filler_is_the_one_killed_not_its_namespaces_worker(groups: ResourceGroups, workspace: Path) -> None:
    """An exec call's tmpfs pages belong to no process, so the memory limit's OOM kill would pick the namespace's
    biggest process — its worker — and the call's tasks would fail WORKER_CRASHED while the filler went on. The
    call's processes are the first to go: the worker (here a stand-in holding 24 MiB) lives."""
    import subprocess
    import sys

    namespace = "user:tenant"
    worker = subprocess.Popen([sys.executable, "-c", "import sys; held = bytearray(24 << 20); sys.stdin.read()"],
                              stdin=subprocess.PIPE)
    try:
        wait_for("the stand-in worker holding its memory",
                 lambda: psutil.Process(worker.pid).memory_info().rss >= 24 << 20)
        groups.place_worker(namespace, worker.pid)
        result = trio.run(run, registry(groups), workspace, ["sh", "-c", FILLER], namespace)
        out = content(result)
        assert result.is_error and out["exit_code"] == -9, out
        assert worker.poll() is None, "the namespace's worker was killed for the exec call's /tmp"
    finally:
        groups.worker_ended(namespace)
        worker.wait()
        assert worker.stdin is not None
        worker.stdin.close()
