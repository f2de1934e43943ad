"""Tool safety beyond the per-tool unit tests: symlinks swapped in after the check (deterministically and under
a racing thread), hard links, huge and binary files, patches that aim outside, and ``workspace.exec``'s sandbox
proved with real processes (a loopback listener it cannot reach, a CPU loop, an allocation, a daemon)."""

from __future__ import annotations

import ctypes
import os
import shutil
import socket
import threading
import tracemalloc
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import trio

from codesdk.supervisor.tools import (
    ExecPolicy,
    SandboxTools,
    ToolContext,
    ToolLimits,
    ToolRegistry,
    ToolResult,
    ToolsConfig,
    _files,
    _patch,
    probe_sandbox,
)

SECRET = "outside-secret\n"


def js(value: object) -> Any:
    """A JSON result as ``Any``, for indexing in assertions."""
    return value


def error_of(result: ToolResult) -> tuple[str, str]:
    assert result.is_error, result.content
    error = js(result.content)["error"]
    return str(error["code"]), str(error["message"])


def tree(root: Path) -> dict[str, bytes | None]:
    """Every entry under ``root`` with file contents (symlinks by target), to prove nothing changed."""
    state: dict[str, bytes | None] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            state[rel] = os.readlink(path).encode()
        else:
            state[rel] = path.read_bytes() if path.is_file() else None
    return state


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    """A workspace with ``d/f.txt``; ``tmp_path/outside`` holds a secret the tools must never touch."""
    workspace = tmp_path / "ws"
    (workspace / "d").mkdir(parents=True)
    (workspace / "d" / "f.txt").write_text("inside\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "f.txt").write_text(SECRET)
    return workspace


def outside_of(ws: Path) -> Path:
    return ws.parent / "outside"


async def call(ws: Path, name: str, args: dict[str, Any], limits: ToolLimits | None = None,
               registry: ToolRegistry | None = None) -> ToolResult:
    with trio.fail_after(30):
        return await (registry or ToolRegistry()).execute(name, args, ToolContext(ws, limits or ToolLimits()))


def swap_in_symlink(ws: Path) -> None:
    """Replace the directory ``d`` by a symlink to the outside directory."""
    os.rename(ws / "d", ws / "d.real")
    os.symlink(outside_of(ws), ws / "d")


# --- symlink swapped in after the check --------------------------------------------------------------

CALLS: dict[str, tuple[str, dict[str, Any]]] = {
    "read": ("workspace.read", {"path": "d/f.txt"}),
    "write": ("workspace.write", {"path": "d/f.txt", "content": "pwned\n"}),
    "write-new": ("workspace.write", {"path": "d/sub/new.txt", "content": "pwned\n"}),
    "list": ("workspace.list", {"path": "d"}),
    "patch": ("patch.apply", {"patch": "--- d/f.txt\n+++ d/f.txt\n@@ -1 +1 @@\n-inside\n+pwned\n"}),
    "patch-create": ("patch.apply", {"patch": "--- /dev/null\n+++ d/new.txt\n@@ -0,0 +1 @@\n+pwned\n"}),
}


@pytest.mark.parametrize("kind", sorted(CALLS))
async def test_symlink_swapped_in_between_check_and_open_is_refused(
    ws: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The path is confined while ``d`` is a real directory; the swap happens right after that check."""
    name, args = CALLS[kind]
    module = _patch if name == "patch.apply" else _files
    real_confine = module.confine

    def confine_then_swap(workspace: Path, given: str) -> Any:
        confined = real_confine(workspace, given)
        if not (ws / "d").is_symlink():
            swap_in_symlink(ws)
        return confined

    monkeypatch.setattr(module, "confine", confine_then_swap)
    before = tree(outside_of(ws))
    result = await call(ws, name, args)
    code, message = error_of(result)
    assert code == "path_refused", message
    assert "symlink" in message
    assert tree(outside_of(ws)) == before
    assert "outside-secret" not in str(result.content)


async def test_symlink_swapped_in_between_patch_staging_and_commit_is_refused(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """patch.apply reads and checks everything first, then commits: a swap in between must not redirect writes."""
    real_read = _patch.read_whole  # type: ignore[attr-defined]

    def read_then_swap(*args: Any) -> bytes | None:
        data = real_read(*args)
        if not (ws / "d").is_symlink():
            swap_in_symlink(ws)
        return data

    monkeypatch.setattr(_patch, "read_whole", read_then_swap)
    before = tree(outside_of(ws))
    code, message = error_of(await call(ws, *CALLS["patch"]))
    assert code == "path_refused", message
    assert "a symlink appeared" in message and message.endswith("no file was changed"), message
    assert tree(outside_of(ws)) == before


def _exchange(a: Path, b: Path) -> Callable[[], None]:
    """Atomically swap two names (renameat2 RENAME_EXCHANGE) so ``a`` is always present, as dir or symlink."""
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        pytest.skip("libc has no renameat2")
    at_fdcwd, rename_exchange = -100, 2

    def swap() -> None:
        if renameat2(at_fdcwd, bytes(a), at_fdcwd, bytes(b), rename_exchange) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))

    return swap


@pytest.fixture
def racing_swapper(ws: Path) -> Iterator[threading.Event]:
    """A thread flipping ``d`` between the real directory and a symlink to outside as fast as it can."""
    os.symlink(outside_of(ws), ws / "d.link")
    swap = _exchange(ws / "d", ws / "d.link")
    try:
        swap()
        swap()
    except OSError as exc:
        pytest.skip(f"RENAME_EXCHANGE unsupported here: {exc}")
    stop, flips = threading.Event(), threading.Event()
    count = 0

    def flip() -> None:
        nonlocal count
        while not stop.is_set():
            swap()
            count += 1
            if count > 100:
                flips.set()

    thread = threading.Thread(target=flip, daemon=True)
    thread.start()
    try:
        yield flips
    finally:
        stop.set()
        thread.join()
        if (ws / "d").is_symlink():
            swap()


async def test_racing_symlink_swaps_never_leak_or_write_outside(ws: Path, racing_swapper: threading.Event) -> None:
    """Hundreds of calls while another thread swaps ``d``: every answer is the inside file or a refusal."""
    outside = outside_of(ws)
    before = tree(outside)
    with trio.fail_after(10):
        await trio.to_thread.run_sync(racing_swapper.wait)
    codes: set[str] = set()
    for _ in range(60):
        for kind in ("read", "write-new", "list", "patch-create", "write"):
            name, args = CALLS[kind]
            result = await call(ws, name, args)
            assert "outside-secret" not in str(result.content)
            if result.is_error:
                codes.add(error_of(result)[0])
    assert codes <= {"path_refused", "not_a_directory", "already_exists", "not_found"}, codes
    assert tree(outside) == before


# --- hard links, huge and binary files ---------------------------------------------------------------

async def test_writes_replace_a_hard_link_instead_of_writing_through_it(ws: Path) -> None:
    """A hard link inside the workspace to an outside file is replaced by rename, never written into."""
    outside = outside_of(ws) / "f.txt"
    os.link(outside, ws / "hard.txt")
    assert not (await call(ws, "workspace.write", {"path": "hard.txt", "content": "new\n"})).is_error
    os.link(outside, ws / "hard2.txt")
    patch = "--- hard2.txt\n+++ hard2.txt\n@@ -1 +1 @@\n-outside-secret\n+patched\n"
    assert not (await call(ws, "patch.apply", {"patch": patch})).is_error
    assert outside.read_text() == SECRET
    assert (ws / "hard.txt").read_text() == "new\n" and (ws / "hard2.txt").read_text() == "patched\n"


@pytest.fixture
def huge_file(ws: Path) -> Path:
    """A 64 GiB sparse file (no disk used) whose first line is text, followed by a hole."""
    path = ws / "huge.log"
    with open(path, "wb") as handle:
        handle.write(b"first line\n")
        handle.truncate(64 << 30)
    return path


async def _call_measuring_peak(ws: Path, name: str, args: dict[str, Any]) -> tuple[ToolResult, float]:
    """The call's result and the peak of Python allocations (all threads) during it, in MiB."""
    tracemalloc.start()
    try:
        result = await call(ws, name, args)
        return result, tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


async def test_reading_a_huge_file_is_bounded_and_says_so(ws: Path, huge_file: Path) -> None:
    """The read stops at the byte cap (never loading the file) and tells the caller how to continue."""
    result, peak = await _call_measuring_peak(ws, "workspace.read", {"path": huge_file.name})
    content = js(result.content)
    assert not result.is_error and content["truncated"] and content["has_more"]
    assert content["text"].startswith("first line\n") and "continue with offset=1" in content["text"]
    assert content["size_bytes"] == 64 << 30
    assert peak < 16, f"peak {peak:.1f} MiB"


async def test_patching_a_huge_file_is_refused_before_reading_it(ws: Path, huge_file: Path) -> None:
    patch = "--- huge.log\n+++ huge.log\n@@ -1 +1 @@\n-first line\n+x\n"
    result, peak = await _call_measuring_peak(ws, "patch.apply", {"patch": patch})
    code, message = error_of(result)
    assert code == "too_large" and f"{64 << 30} bytes" in message and "no file was changed" in message
    assert peak < 16, f"peak {peak:.1f} MiB"


async def test_oversized_write_is_refused_with_the_limit(ws: Path) -> None:
    code, message = error_of(await call(ws, "workspace.write", {"path": "big.txt", "content": "x" * 2048},
                                        ToolLimits(write_max_bytes=1024)))
    assert code == "too_large" and "limit 1024" in message
    assert not (ws / "big.txt").exists()


async def test_binary_files_are_refused_clearly_by_read_and_patch(ws: Path) -> None:
    """A real executable and a non-UTF-8 file: read says it is binary, patch says it is not text; nothing changes."""
    shutil.copy(shutil.which("true") or "/bin/true", ws / "prog")
    (ws / "latin1.txt").write_bytes("café\n".encode("latin-1"))
    code, message = error_of(await call(ws, "workspace.read", {"path": "prog"}))
    assert code == "not_text" and "binary" in message
    before = tree(ws)
    code, message = error_of(await call(ws, "patch.apply", {
        "patch": "--- latin1.txt\n+++ latin1.txt\n@@ -1 +1 @@\n-café\n+cafe\n"}))
    assert code == "not_text" and "not UTF-8" in message
    assert tree(ws) == before


# --- patches aimed outside ---------------------------------------------------------------------------

@pytest.mark.parametrize("target", [
    "a/../../outside/f.txt", "b/d/../../../outside/f.txt", "d/../../outside/f.txt", "link_file", "link_dir/f.txt",
])
async def test_patch_sections_aimed_outside_are_refused_and_change_nothing(ws: Path, target: str) -> None:
    """Even after a first, valid section: all or nothing, so the valid edit is not applied either."""
    (ws / "link_file").symlink_to(outside_of(ws) / "f.txt")
    (ws / "link_dir").symlink_to(outside_of(ws))
    patch = ("--- a/d/f.txt\n+++ b/d/f.txt\n@@ -1 +1 @@\n-inside\n+edited\n"
             f"--- {target}\n+++ {target}\n@@ -1 +1 @@\n-outside-secret\n+pwned\n")
    before_ws, before_out = tree(ws), tree(outside_of(ws))
    code, message = error_of(await call(ws, "patch.apply", {"patch": patch}))
    assert code == "path_refused" and message.endswith("no file was changed"), message
    assert (tree(ws), tree(outside_of(ws))) == (before_ws, before_out)


@pytest.mark.parametrize("target", ["../escape.txt", "/tmp/escape-{}.txt", "link_dir/new.txt", "d/../../new.txt"])
async def test_patch_creating_a_file_outside_is_refused(ws: Path, target: str) -> None:
    (ws / "link_dir").symlink_to(outside_of(ws))
    target = target.format(uuid.uuid4().hex)
    before = tree(ws.parent)
    code, _ = error_of(await call(ws, "patch.apply", {"patch": f"--- /dev/null\n+++ {target}\n@@ -0,0 +1 @@\n+x\n"}))
    assert code == "path_refused"
    assert tree(ws.parent) == before
    assert not Path(target).is_absolute() or not Path(target).exists()


# --- workspace.exec: real sandbox --------------------------------------------------------------------

@pytest.fixture(scope="module")
def sandbox() -> SandboxTools:
    tools = trio.run(probe_sandbox)
    if tools.netns_prefix is None:
        pytest.skip("the kernel refuses new network namespaces here (`unshare -n` and `unshare -r -n` fail)")
    if tools.prlimit is None:
        pytest.skip("`prlimit` is unavailable, so the memory limit cannot be enforced")
    return tools


def exec_registry(*allow: str) -> ToolRegistry:
    return ToolRegistry(ToolsConfig(exec=ExecPolicy(enabled=True, allowlist=allow)))


def _alive_with(marker: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        if any(marker in part for part in proc.info["cmdline"] or []) and proc.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(proc)
    return found


CONNECT = """
import socket, sys
try:
    socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5)
except OSError as exc:
    print("refused", exc.errno)
else:
    print("connected")
"""


async def test_exec_cannot_reach_a_listener_on_the_hosts_loopback(ws: Path, sandbox: SandboxTools) -> None:
    """A server listening on 127.0.0.1 in the supervisor's own network namespace is out of reach."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        listener.setblocking(False)
        port = listener.getsockname()[1]
        result = await call(ws, "workspace.exec", {"argv": ["python3", "-c", CONNECT, str(port)]},
                            registry=exec_registry("python3"))
        assert (result.stdout or "").split()[:1] == ["refused"], (result.stdout, result.stderr)
        assert result.sandbox.network is False
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing ever connected


async def test_exec_cpu_loop_is_killed_at_the_time_limit(ws: Path, sandbox: SandboxTools) -> None:
    marker = f"cpu-loop-{uuid.uuid4().hex}"
    result = await call(ws, "workspace.exec", {"argv": ["python3", "-c", "while True: pass", marker],
                                                "timeout_s": 0.5}, registry=exec_registry("python3"))
    body = js(result.content)
    assert result.is_error and body["timed_out"] is True and body["exit_code"] < 0
    assert "timed out after 0.5s and was killed" in result.preview
    assert _alive_with(marker) == []


async def test_exec_allocation_over_the_memory_limit_fails(ws: Path, sandbox: SandboxTools) -> None:
    """RLIMIT_AS: a 512 MiB allocation under a 128 MiB limit fails inside the command (not in the supervisor)."""
    result = await call(ws, "workspace.exec", {"argv": ["head", "-c", str(512 << 20), "/dev/zero"]},
                        limits=ToolLimits(exec_memory_mb=128), registry=exec_registry("head", "python3"))
    assert not result.is_error, "streaming 512 MiB needs no memory: the limit must not break ordinary commands"
    result = await call(ws, "workspace.exec", {"argv": ["python3", "-c", f"b = bytearray({512 << 20})"]},
                        limits=ToolLimits(exec_memory_mb=128), registry=exec_registry("python3"))
    assert result.is_error and "MemoryError" in (result.stderr or "")
    assert result.sandbox.memory_limit_mb == 128


DAEMONIZE = """
import os, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.closerange(0, 3)
        time.sleep(300)
    os._exit(0)
os.wait()
print("daemon started")
"""


async def test_exec_leaves_no_daemon_behind(ws: Path, sandbox: SandboxTools) -> None:
    """A double-forked, setsid'd grandchild has left the process group; the pid namespace still takes it down."""
    if "pid" not in (sandbox.netns_label or ""):
        pytest.skip(f"no pid namespace here ({sandbox.netns_label}); only the process group is killed")
    marker = f"daemon-{uuid.uuid4().hex}"
    result = await call(ws, "workspace.exec", {"argv": ["python3", "-c", DAEMONIZE, marker]},
                        registry=exec_registry("python3"))
    assert not result.is_error and result.stdout == "daemon started\n", (result.stdout, result.stderr)
    assert _alive_with(marker) == []


async def test_exec_is_unavailable_unless_enabled(ws: Path) -> None:
    result = await call(ws, "workspace.exec", {"argv": ["sh", "-c", "touch pwned"]},
                        registry=ToolRegistry(ToolsConfig(exec=ExecPolicy(enabled=False, allowlist=("sh",)))))
    code, message = error_of(result)
    assert code == "unknown_tool" and "disabled" in message
    assert not (ws / "pwned").exists()


CONFINED_PROBE = """
import os, sys
for path in sys.argv[1:]:
    try:
        with open(path) as handle:
            print(path, "READ", handle.read().strip())
    except OSError as exc:
        print(path, "REFUSED", os.strerror(exc.errno))
"""


async def test_exec_cannot_read_files_outside_the_workspace(ws: Path, sandbox: SandboxTools) -> None:
    """A real command tries a sibling of the workspace, another namespace's HOME and the store under a data
    dir, the supervisor's environment and /etc/shadow: none of it exists for it. Its workspace works."""
    if sandbox.confine_prefix is None:
        pytest.skip("the kernel refuses a mount namespace with a new root here (`unshare -m` + pivot_root)")
    data = ws.parent / "data"
    bob_home = data / "namespaces" / "user.bob" / "home"
    bob_home.mkdir(parents=True)
    (bob_home / "secret.txt").write_text(SECRET)
    (data / "codesdk.sqlite3").write_text(SECRET)
    (data / "admin.token").write_text(SECRET)
    targets = [outside_of(ws) / "f.txt", bob_home / "secret.txt", data / "codesdk.sqlite3", data / "admin.token",
               Path(f"/proc/{os.getpid()}/environ"), ws / "d" / "f.txt"]
    result = await call(ws, "workspace.exec", {"argv": ["python3", "-c", CONFINED_PROBE, *map(str, targets)]},
                        registry=exec_registry("python3"))
    lines = dict(line.split(" ", 1) for line in (result.stdout or "").splitlines())
    assert set(lines) == set(map(str, targets)), (result.stdout, result.stderr)
    for target in targets[:-1]:
        assert lines[str(target)] == "REFUSED No such file or directory", target
    assert lines[str(ws / "d" / "f.txt")] == "READ inside"
    assert "outside-secret" not in (result.stdout or "") + (result.stderr or "")
    if Path("/etc/shadow").exists():
        shadow = await call(ws, "workspace.exec", {"argv": ["cat", "/etc/shadow"]}, registry=exec_registry("cat"))
        assert shadow.stdout == "", "hidden: a confined command may still be uid 0"
    script = "echo made > d/new.txt && ls / && mount -t tmpfs none /tmp || echo mount-refused"
    wrote = await call(ws, "workspace.exec", {"argv": ["sh", "-c", script]}, registry=exec_registry("sh"))
    assert (ws / "d" / "new.txt").read_text() == "made\n"
    assert set((wrote.stdout or "").split()[:-1]) <= {"bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc",
                                                      "sbin", "tmp", "usr"}, wrote.stdout
    assert (wrote.stdout or "").split()[-1] == "mount-refused"  # no capability left to undo the confinement
