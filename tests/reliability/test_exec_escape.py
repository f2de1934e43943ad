"""``workspace.exec`` never holds host root: a hostile tenant's allowlisted ``python3``/``sh`` tries to change
host sysctls, leave a set-uid shell behind, make or use device nodes, mount, reach the supervisor's process, and
read another namespace's HOME, the store and the token files — from inside each sandbox (bubblewrap, the built-in
helper, and ``unshare`` without file-system confinement), as the exec uid and as a namespace's uid. Every attempt
fails, and the command's kernel uid, gid and groups are never 0, with no capability and no_new_privs.

Run as root, as CI does: the threat is a root supervisor. A write that ever succeeds is undone at once, so the
host is never left changed."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import trio

from codesdk.supervisor.tools import (
    DEFAULT_EXEC_UID,
    ExecPolicy,
    SandboxProber,
    SandboxTools,
    ToolContext,
    ToolRegistry,
    ToolResult,
    ToolsConfig,
    probe_sandbox,
)
from tests.sandboxes import NO_BWRAP, FixedProber

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the escapes are those of a root supervisor: run as root "
                                                           "(as CI does); as another uid exec keeps that uid")

#: A --worker-uids range for the "namespace" variants; its first uid owns those workspaces.
NAMESPACE_UIDS = range(3_920_000, 3_920_004)
NAMESPACE_UID = NAMESPACE_UIDS.start
#: The host values the sysctl probe tries to change, and harmless other values for each.
SYSCTLS = ("kernel/core_pattern", "vm/stat_interval")


@pytest.fixture(scope="module")
def tools() -> SandboxTools:
    found = trio.run(probe_sandbox)
    if found.prlimit is None:
        pytest.skip("`prlimit` is unavailable here, so exec refuses to run")
    return found


@dataclasses.dataclass(frozen=True)
class Sandbox:
    name: str
    prober: SandboxProber
    confined: bool  # a mount namespace with a new root (else the host's file system, as the command's uid)


@pytest.fixture(params=["bwrap", "helper", "unconfined"])
def sandbox(request: pytest.FixtureRequest, tools: SandboxTools) -> Sandbox:
    """bubblewrap; the built-in helper (where bubblewrap is absent); ``unshare`` namespaces without file-system
    confinement (an operator's ``confine_filesystem=False``)."""
    if request.param == "bwrap":
        if tools.bwrap is None:
            pytest.skip(NO_BWRAP)
        return Sandbox("bwrap", FixedProber(tools), confined=True)
    if tools.netns_prefix is None:
        pytest.skip("no network namespace here: `unshare -n` and `unshare -r -n` both fail")
    without = FixedProber(dataclasses.replace(tools, bwrap=None))
    if request.param == "helper":
        if tools.confine_prefix is None:
            pytest.skip("no mount namespace with a new root here (`unshare -m` + pivot_root)")
        return Sandbox("helper", without, confined=True)
    return Sandbox("unconfined", without, confined=False)


@pytest.fixture(params=["exec-uid", "namespace-uid"])
def owner(request: pytest.FixtureRequest) -> str:
    """Whose workspace it is: the supervisor's (root: commands run as the exec uid, the workspace lent to it), or
    a namespace's under ``--worker-uids`` (commands run as that uid)."""
    return str(request.param)


def workspace_of(open_tmp: Path, owner: str = "exec-uid") -> tuple[Path, int]:
    """A workspace with a file in it, owned as ``owner`` says; and the uid its commands must run as."""
    ws = open_tmp / "ws"
    (ws / "src").mkdir(parents=True)
    (ws / "src" / "main.py").write_text("print('hi')\n")
    if owner == "namespace-uid":
        for path in (ws, ws / "src", ws / "src" / "main.py"):
            os.chown(path, NAMESPACE_UID, NAMESPACE_UID)
        return ws, NAMESPACE_UID
    return ws, DEFAULT_EXEC_UID


async def run(sandbox: Sandbox, ws: Path, argv: list[str], allow: tuple[str, ...] = ("python3", "sh")) -> ToolResult:
    policy = ExecPolicy(enabled=True, allowlist=allow, confine_filesystem=sandbox.confined,
                        namespace_uids=NAMESPACE_UIDS)
    registry = ToolRegistry(ToolsConfig(exec=policy), prober=sandbox.prober)
    with trio.fail_after(120):
        return await registry.execute("workspace.exec", {"argv": argv}, ToolContext(ws))


def report_of(result: ToolResult) -> dict[str, Any]:
    """The JSON a probe printed last."""
    lines = (result.stdout or "").strip().splitlines()
    assert lines, (result.content, result.stderr)
    found: dict[str, Any] = json.loads(lines[-1])
    return found


#: Prepended to every probe: who the command is, as the kernel sees it.
IDENTITY = r'''
import errno, json, os, sys

def host_id(kind, value):
    """What ``value`` of this user namespace is on the host (the parent namespace)."""
    with open(f"/proc/self/{kind}_map") as mapping:
        for line in mapping:
            inside, outside, count = (int(part) for part in line.split())
            if inside <= value < inside + count:
                return outside + value - inside
    return None

def identity():
    status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines() if ":" in line)
    caps = {name: int(status[name].strip(), 16) for name in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")}
    return {"uids": list(os.getresuid()), "gids": list(os.getresgid()), "groups": os.getgroups(),
            "host_uid": host_id("uid", os.getuid()), "host_gid": host_id("gid", os.getgid()),
            "caps": caps, "no_new_privs": int(status["NoNewPrivs"].strip())}

def err(exc):
    return errno.errorcode.get(exc.errno or 0, str(exc))
'''


def assert_unprivileged(report: dict[str, Any], uid: int) -> None:
    """The command was ``uid`` (gid the same), for the kernel of the host too, with no capability in any set and
    no_new_privs — never root, which is what makes everything else fail."""
    me = report["identity"]
    assert (me["host_uid"], me["host_gid"]) == (uid, uid), me
    assert set(me["uids"]) == {uid} and set(me["gids"]) == {uid}, me
    assert 0 not in me["groups"] and set(me["groups"]) <= {uid}, me
    assert me["caps"] == {"CapInh": 0, "CapPrm": 0, "CapEff": 0, "CapBnd": 0, "CapAmb": 0}, me
    assert me["no_new_privs"] == 1, me


# --- the kernel uid ------------------------------------------------------------------------------------------

WHO = IDENTITY + r'''
print(json.dumps({"identity": identity()}))
'''


async def test_the_command_is_never_uid_0(open_tmp: Path, sandbox: Sandbox, owner: str) -> None:
    """``id -u``/``-g``/``-G`` inside, the probe's view of itself (``/proc/self/status``, mapped through the user
    namespace's maps to the host), and the host's own view of the running command (psutil on its pid)."""
    ws, uid = workspace_of(open_tmp, owner)
    ids = await run(sandbox, ws, ["sh", "-c", "id -u; id -g; id -G"])
    assert ids.stdout == f"{uid}\n{uid}\n{uid}\n", (ids.stdout, ids.stderr)
    assert_unprivileged(report_of(await run(sandbox, ws, ["python3", "-c", WHO])), uid)
    assert ids.execution_env == f"supervisor:sandbox({expected_label(sandbox)},uid={uid})"

    marker = f"47.{uuid.uuid4().int % 10**6:06d}"
    seen: list[psutil.Process] = []
    async with trio.open_nursery() as nursery:
        async def call() -> None:
            await run(sandbox, ws, ["sh", "-c", f"sleep {marker}"])

        nursery.start_soon(call)
        with trio.fail_after(60):
            while not seen:  # until the command is up: a condition, not a duration
                seen = [p for p in psutil.process_iter(["cmdline"]) if (p.info["cmdline"] or [])[-1:] == [marker]]
                await trio.sleep(0.02)
        uids, gids = seen[0].uids(), seen[0].gids()
        nursery.cancel_scope.cancel()  # cancelling the call ends the command
    assert (tuple(uids), tuple(gids)) == ((uid,) * 3, (uid,) * 3), "the host sees another uid/gid"


def expected_label(sandbox: Sandbox) -> str:
    if sandbox.name == "bwrap":
        return "bwrap"
    tools = sandbox.prober.tools if isinstance(sandbox.prober, FixedProber) else None
    assert tools is not None
    return str(tools.netns_label)


# --- /proc/sys -----------------------------------------------------------------------------------------------

SYSCTL_PROBE = IDENTITY + r'''
writable = []
for top, _, files in os.walk("/proc/sys"):
    for name in files:
        path = os.path.join(top, name)
        if os.access(path, os.W_OK):
            writable.append(path)
wrote = {}
for name in sys.argv[1:]:
    path = "/proc/sys/" + name
    try:
        with open(path) as handle:
            before = handle.read()
        other = str(int(before) + 1) if before.strip().isdigit() else ("core.codesdk" if before.strip() == "core" else "core")
        with open(path, "w") as handle:
            handle.write(other)
    except OSError as exc:
        wrote[name] = err(exc)
    else:
        wrote[name] = "WRITTEN"
        with open(path, "w") as handle:  # undo at once; the test checks and restores from outside as well
            handle.write(before)
if "/proc/sys/kernel/ns_last_pid" in writable:  # 0666: the write itself needs CAP_SYS_ADMIN (and is ours alone)
    try:
        with open("/proc/sys/kernel/ns_last_pid", "r+") as handle:
            handle.write(handle.read())
        wrote["kernel/ns_last_pid"] = "WRITTEN"
    except OSError as exc:
        wrote["kernel/ns_last_pid"] = err(exc)
print(json.dumps({"identity": identity(), "writable": writable, "wrote": wrote}))
'''


def sysctl_values() -> dict[str, str]:
    return {name: Path("/proc/sys", name).read_text() for name in SYSCTLS}


@pytest.fixture
def host_sysctls() -> Iterator[dict[str, str]]:
    """The host values before; whatever happens, they are the host values after."""
    before = sysctl_values()
    try:
        yield before
    finally:
        for name, value in before.items():
            if Path("/proc/sys", name).read_text() != value:
                Path("/proc/sys", name).write_text(value)


async def test_no_proc_sys_file_can_be_written(
    open_tmp: Path, sandbox: Sandbox, owner: str, host_sysctls: dict[str, str]
) -> None:
    """No file under /proc/sys is writable for the command (``access(W_OK)`` on every one — nothing is written
    there), and real writes of other, harmless values to kernel/core_pattern and vm/stat_interval fail; the
    host's values are unchanged. Seeing the host's /proc (unconfined), only kernel/ns_last_pid passes the mode
    check (it is 0666), and writing it is refused too (it needs CAP_SYS_ADMIN, and is the sandbox's own)."""
    ws, uid = workspace_of(open_tmp, owner)
    report = report_of(await run(sandbox, ws, ["python3", "-c", SYSCTL_PROBE, *SYSCTLS]))
    assert sysctl_values() == host_sysctls, "a host sysctl changed (restored)"
    assert set(SYSCTLS) <= set(report["wrote"]), report
    assert all(outcome != "WRITTEN" for outcome in report["wrote"].values()), report["wrote"]
    shown = set(report["writable"]) - ({"/proc/sys/kernel/ns_last_pid"} if not sandbox.confined else set())
    assert not shown, f"writable for the command: {sorted(shown)[:10]}"
    assert_unprivileged(report, uid)


# --- set-uid / set-gid files -------------------------------------------------------------------------------

SETID_PROBE = IDENTITY + r'''
import shutil, subprocess
made = {}
shutil.copy("/bin/sh", "suid-sh")
shutil.copy("/bin/sh", "sgid-sh")
os.mkdir("sgid-dir")
shutil.copy("/bin/sh", "sgid-dir/both-sh")
for path, mode in (("suid-sh", 0o4755), ("sgid-sh", 0o2755), ("sgid-dir", 0o2775), ("sgid-dir/both-sh", 0o6755)):
    try:
        os.chmod(path, mode)
        made[path] = oct(os.stat(path).st_mode & 0o7777)
    except OSError as exc:
        made[path] = err(exc)
try:
    os.chown("suid-sh", 0, 0)
    made["chown-to-root"] = "CHOWNED"
except OSError as exc:
    made["chown-to-root"] = err(exc)
ran = subprocess.run(["./suid-sh", "-p", "-c", "id -u"], capture_output=True, text=True).stdout.strip()
print(json.dumps({"identity": identity(), "made": made, "euid_through_suid": ran}))
'''


def entries(root: Path) -> dict[str, os.stat_result]:
    found = {".": root.lstat()}
    for path in root.rglob("*"):
        found[str(path.relative_to(root))] = path.lstat()
    return found


async def test_no_setuid_or_setgid_file_survives(open_tmp: Path, sandbox: Sandbox, owner: str) -> None:
    """The command copies a shell and makes it set-uid, set-gid, both (in a set-gid directory), and tries to give
    it to root: inside, the set-uid bit gives it nothing; afterwards nothing in the workspace (files and
    directories) has a set-uid or set-gid bit, and everything belongs to the workspace's owner — what was someone else's stays theirs, and
    nothing is left to the exec uid."""
    ws, uid = workspace_of(open_tmp, owner)
    someone = 12_345
    (ws / "theirs.txt").write_text("a local user's file\n")
    os.chown(ws / "theirs.txt", someone, someone)
    workspace_owner = ws.stat().st_uid
    report = report_of(await run(sandbox, ws, ["python3", "-c", SETID_PROBE]))
    assert report["made"]["chown-to-root"] == "EPERM"
    assert report["euid_through_suid"] == str(uid), report
    landed = entries(ws)
    assert {"suid-sh", "sgid-sh", "sgid-dir/both-sh"} <= set(landed), sorted(landed)
    for name, info in landed.items():
        if name != ".":  # the workspace itself keeps the modes its owner gave it
            assert not info.st_mode & (stat.S_ISUID | stat.S_ISGID), f"{name} kept {oct(info.st_mode)}"
        expected = someone if name == "theirs.txt" else workspace_owner
        assert (info.st_uid, info.st_gid) == (expected, expected), f"{name} is {info.st_uid}:{info.st_gid}"
    assert DEFAULT_EXEC_UID not in {info.st_uid for info in landed.values()}
    assert_unprivileged(report, uid)


# --- device nodes and mounts ----------------------------------------------------------------------------------

DEVICE_PROBE = IDENTITY + r'''
tried = {}
for name, mode in (("char", 0o20666), ("block", 0o60666)):
    try:
        os.mknod(name, mode, os.makedev(1, 5))
        tried[name] = "MADE"
    except OSError as exc:
        tried[name] = err(exc)
try:
    with open(sys.argv[1], "rb") as zero:
        tried["placed"] = "OPENED %d bytes" % len(zero.read(4))
except OSError as exc:
    tried["placed"] = err(exc)
print(json.dumps({"identity": identity(), "tried": tried}))
'''


async def test_no_device_node_can_be_made_or_used(open_tmp: Path, sandbox: Sandbox) -> None:
    """mknod of a character and a block device fails; and a device node put in the workspace from outside (a
    0666 copy of /dev/zero — what a hostile worker could leave there) cannot be opened through the confined
    sandbox's ``nodev`` workspace."""
    ws, uid = workspace_of(open_tmp)
    os.mknod(ws / "placed-zero", 0o666 | stat.S_IFCHR, os.makedev(1, 5))
    os.chmod(ws / "placed-zero", 0o666)
    report = report_of(await run(sandbox, ws, ["python3", "-c", DEVICE_PROBE, str(ws / "placed-zero")]))
    assert report["tried"]["char"] == report["tried"]["block"] == "EPERM", report["tried"]
    if sandbox.confined:
        assert report["tried"]["placed"] == "EACCES", report["tried"]
    assert not (ws / "char").exists() and not (ws / "block").exists()
    assert_unprivileged(report, uid)


MOUNT_PROBE = IDENTITY + r'''
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
tried = {}
os.mkdir("m")
for name, args in (("tmpfs", (b"none", b"m", b"tmpfs", 0, None)), ("bind", (b"/", b"m", None, 0x1000, None)),
                   ("remount-proc-rw", (None, b"/proc", None, 0x20, None))):
    if libc.mount(*args) == 0:
        tried[name] = "MOUNTED"
        libc.umount2(b"m", 2)
    else:
        tried[name] = errno.errorcode[ctypes.get_errno()]
mounts = {}
for line in open("/proc/self/mountinfo"):
    fields = line.split()
    mounts[fields[4]] = fields[5].split(",")
print(json.dumps({"identity": identity(), "tried": tried, "mounts": mounts, "cwd": os.getcwd(),
                  "sys": os.path.exists("/sys/kernel")}))
'''


async def test_nothing_can_be_mounted_and_the_mounts_are_safe(open_tmp: Path, sandbox: Sandbox) -> None:
    """mount(2) fails (a tmpfs, a bind of /, /proc remounted writable). In the confined sandboxes the workspace is
    mounted ``nosuid,nodev``, /proc is this pid namespace's own and read-only, and there is no /sys."""
    ws, uid = workspace_of(open_tmp)
    report = report_of(await run(sandbox, ws, ["python3", "-c", MOUNT_PROBE]))
    assert set(report["tried"].values()) == {"EPERM"}, report["tried"]
    if sandbox.confined:
        mounts = report["mounts"]
        assert {"nosuid", "nodev"} <= set(mounts[report["cwd"]]), mounts[report["cwd"]]
        assert "ro" in mounts["/proc"], mounts["/proc"]
        assert report["sys"] is False and "/sys" not in mounts
    assert_unprivileged(report, uid)


# --- the supervisor's process and other tenants' files --------------------------------------------------------

SUPERVISOR_PROBE = IDENTITY + r'''
import ctypes, signal
pid = int(sys.argv[1])
tried = {}
try:
    os.kill(pid, 0)
    tried["signal"] = "ALLOWED"
except OSError as exc:
    tried["signal"] = err(exc)
libc = ctypes.CDLL(None, use_errno=True)
if libc.ptrace(16, pid, None, None) == 0:  # PTRACE_ATTACH
    tried["ptrace"] = "ATTACHED"
    libc.ptrace(17, pid, None, None)  # PTRACE_DETACH
else:
    tried["ptrace"] = errno.errorcode[ctypes.get_errno()]
for name in ("environ", "mem", "maps", "auxv"):
    try:
        with open(f"/proc/{pid}/{name}", "rb") as handle:
            handle.read(1)
        tried[name] = "READ"
    except OSError as exc:
        tried[name] = err(exc)
for name in ("fd", "root", "cwd"):
    try:
        os.listdir(f"/proc/{pid}/{name}")
        tried[name] = "LISTED"
    except OSError as exc:
        tried[name] = err(exc)
print(json.dumps({"identity": identity(), "tried": tried}))
'''


async def test_the_supervisor_process_is_out_of_reach(open_tmp: Path, sandbox: Sandbox) -> None:
    """This process stands for the supervisor: the command can neither signal nor ptrace it, nor read its
    environment, memory, maps, descriptors or root through /proc."""
    ws, uid = workspace_of(open_tmp)
    report = report_of(await run(sandbox, ws, ["python3", "-c", SUPERVISOR_PROBE, str(os.getpid())]))
    tried = report["tried"]
    assert tried["signal"] in ("ESRCH", "EPERM") and tried["ptrace"] in ("ESRCH", "EPERM"), tried
    for name in ("environ", "mem", "maps", "auxv", "fd", "root", "cwd"):
        assert tried[name] in ("ENOENT", "EACCES", "EPERM"), (name, tried)
    assert_unprivileged(report, uid)


SECRET = "tenant-secret-" + uuid.uuid4().hex

FILES_PROBE = IDENTITY + r'''
tried = {}
for path in sys.argv[1:]:
    try:
        if os.path.isdir(path):
            tried[path] = "LISTED %s" % os.listdir(path)
        else:
            with open(path) as handle:
                tried[path] = "READ " + handle.read()
    except OSError as exc:
        tried[path] = err(exc)
print(json.dumps({"identity": identity(), "tried": tried}))
'''


async def test_other_tenants_files_are_out_of_reach(open_tmp: Path, sandbox: Sandbox) -> None:
    """A data dir laid out as the service keeps it (0711 as with --worker-uids, so that only the files' own
    modes and owners protect them): another namespace's HOME and its files, the store, the token files and a
    namespace's stored variables. The command reads and lists none of it — confined, none of it exists for it;
    unconfined, it is not root, so the modes hold."""
    ws, uid = workspace_of(open_tmp)
    data = open_tmp / "data"
    home = data / "namespaces" / "user.bob" / "home"
    home.mkdir(parents=True)
    (home / ".claude.json").write_text(SECRET)
    (data / "namespace-env").mkdir()
    files = [home / ".claude.json", data / "codesdk.sqlite3", data / "admin.token", data / "api-tokens.json",
             data / "namespace-env" / "user.bob.json"]
    for path in files[1:]:
        path.write_text(SECRET)
    for path in files:
        os.chmod(path, 0o600)
    for folder in (home, home.parent, data / "namespace-env"):
        os.chmod(folder, 0o700)
    os.chmod(data, 0o711)
    os.chmod(data / "namespaces", 0o711)
    targets = [*files, home, data / "namespace-env"]
    report = report_of(await run(sandbox, ws, ["python3", "-c", FILES_PROBE, *map(str, targets)]))
    refused = ("ENOENT",) if sandbox.confined else ("EACCES",)
    assert {path: report["tried"][str(path)] for path in targets} == {path: refused[0] for path in targets}
    assert SECRET not in json.dumps(report)
    assert_unprivileged(report, uid)
