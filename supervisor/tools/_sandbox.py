"""What the exec sandbox can use on this machine, found out at run time rather than assumed.

Network isolation is a fresh network namespace (``unshare -n`` as root, else ``unshare -r -n`` through an
unprivileged user namespace); the namespace has only a down loopback, so nothing can connect anywhere.
Where it works, a pid namespace is added (``-p -f --kill-child``): when the command ends or is killed, the
kernel kills everything left in it, including daemons that escaped the process group with ``setsid``.
The memory limit is RLIMIT_AS set by ``prlimit`` in the exec chain (no Python code runs between fork and
exec, which would be unsafe in a threaded supervisor).

File-system confinement: where a mount namespace can be made too (``unshare -m``), this file runs as a small
program (``python -I -S _sandbox.py SPEC COMMAND...``) inside the fresh namespaces, before the command: it
builds a new root on a tmpfs holding only the system directories (read-only), the operator's extra read-only
paths, a private /tmp and /dev, a fresh /proc of the pid namespace, and the workspace (read-write);
``pivot_root``s into it and detaches the old root, so nothing else — the supervisor's data dir with every
namespace's HOME, the store, the tokens, other workspaces — exists for the command. It then drops every
capability (root stays uid 0 but powerless: it cannot mount, chroot or mknod its way out) and sets
no_new_privs, and execs the rest of the chain. It runs in a freshly exec'd process, so it is safe.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

_PROBE_TIMEOUT_S = 10.0
_PROBE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_PID_FLAGS = ("-p", "-f", "--kill-child")
#: Tried in order; the first that runs ``true`` wins. Root needs no user namespace.
_VARIANTS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("-n", *_PID_FLAGS), "unshare-n+pid"),
    (("-n",), "unshare-n"),
    (("-r", "-n", *_PID_FLAGS), "unshare-rn+pid"),
    (("-r", "-n"), "unshare-rn"),
)


#: What a confined command sees besides the workspace (read-only; those missing here are left out).
SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
#: Files in /etc only root may read; hidden (an empty device) since a confined command may still be uid 0.
_HIDDEN_FILES = ("/etc/shadow", "/etc/gshadow", "/etc/shadow-", "/etc/gshadow-", "/etc/sudoers")
_DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
#: Where the new root is assembled: a directory that is always there and whose own content no command
#: needs from the outside (a fresh /proc is mounted inside the new root).
_STAGING = "/proc"


@dataclass(frozen=True)
class SandboxTools:
    """Command prefixes the exec tool can put in front of a command; ``None`` where unavailable.

    ``confine_prefix`` replaces ``netns_prefix`` when the file system is to be confined too: the same
    namespaces plus a mount namespace, and this file as the program that builds the new root. It is followed
    by the JSON spec (``confine_spec``) and then the command.
    """

    netns_prefix: tuple[str, ...] | None
    netns_label: str | None
    prlimit: str | None
    confine_prefix: tuple[str, ...] | None = None


def confine_spec(workspace: str, read_only: Sequence[str] = (), tmp_mb: int = 64,
                 run_as: tuple[int, int] | None = None) -> str:
    """The argument that tells the confinement program what to show the command, and whom to run it as."""
    spec: dict[str, Any] = {"workspace": workspace, "read_only": list(read_only), "tmp_mb": tmp_mb}
    if run_as is not None:
        spec["run_as"] = list(run_as)
    return json.dumps(spec)


def visible_in_confinement(path: str, read_only: Sequence[str] = ()) -> bool:
    """Whether a confined command could see ``path`` (its real path) through the system or extra paths."""
    real = os.path.realpath(path)
    roots = [os.path.realpath(p) for p in (*SYSTEM_PATHS, *read_only)]
    return any(real == root or real.startswith(root.rstrip("/") + "/") for root in roots)


async def _works(argv: list[str]) -> bool:
    import trio

    with trio.move_on_after(_PROBE_TIMEOUT_S):
        try:
            done = await trio.run_process(
                argv, check=False, stdin=subprocess.DEVNULL, capture_stdout=True, capture_stderr=True, env={}
            )
        except OSError:
            return False
        return done.returncode == 0
    return False


async def probe_sandbox() -> SandboxTools:
    """Try each isolation variant with ``true`` and keep the first that works."""
    unshare = shutil.which("unshare", path=_PROBE_PATH)
    true = shutil.which("true", path=_PROBE_PATH)
    prlimit = shutil.which("prlimit", path=_PROBE_PATH)
    prefix: tuple[str, ...] | None = None
    label: str | None = None
    if unshare and true:
        for flags, name in _VARIANTS:
            candidate = (unshare, *flags, "--")
            if await _works([*candidate, true]):
                prefix, label = candidate, name
                break
    if prlimit and true and not await _works([prlimit, "--as=1073741824", "--", true]):
        prlimit = None
    confine: tuple[str, ...] | None = None
    if prefix is not None and true:
        candidate = (prefix[0], "-m", *prefix[1:-1], "--", sys.executable, "-I", "-S", os.path.abspath(__file__))
        with tempfile.TemporaryDirectory(prefix="codesdk-confine-probe-") as workspace:
            if await _works([*candidate, confine_spec(workspace), true]):
                confine = candidate
    return SandboxTools(netns_prefix=prefix, netns_label=label, prlimit=prlimit, confine_prefix=confine)


class SandboxProber:
    """Probes once, on first use, and remembers (a registry owns one)."""

    def __init__(self) -> None:
        import trio

        self._found: SandboxTools | None = None
        self._lock = trio.Lock()

    async def get(self) -> SandboxTools:
        async with self._lock:
            if self._found is None:
                self._found = await probe_sandbox()
            return self._found


# --- the confinement program (runs inside the new namespaces, before the command) -------------------------

_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 0x20, 0x1000, 0x4000, 1 << 18
_MNT_DETACH = 2
_PR_SET_NO_NEW_PRIVS, _PR_CAPBSET_DROP, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 38, 24, 47, 4
_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}
_ST_FLAGS = {os.ST_NOSUID: _MS_NOSUID, os.ST_NODEV: _MS_NODEV, os.ST_NOEXEC: _MS_NOEXEC}


class _Libc:
    def __init__(self) -> None:
        self.lib = ctypes.CDLL(None, use_errno=True)

    def check(self, result: int, what: str) -> None:
        if result != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"{what}: {os.strerror(err)}")

    def mount(self, source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
        self.check(self.lib.mount(_b(source), _b(target), _b(fstype), ctypes.c_ulong(flags), _b(data)),
                   f"mount {target}")

    def bind(self, source: str, target: str, *, read_only: bool) -> None:
        self.mount(source, target, None, _MS_BIND | _MS_REC)
        if read_only:  # the flags the source was mounted with are kept (a user namespace must keep them)
            kept = sum(ms for st, ms in _ST_FLAGS.items() if os.statvfs(target).f_flag & st)
            self.mount(None, target, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | kept)


def _b(text: str | None) -> bytes | None:
    return None if text is None else text.encode()


def _inside(root: str, path: str) -> str:
    return os.path.join(root, path.lstrip("/"))


def _show(libc: _Libc, root: str, path: str, *, read_only: bool) -> None:
    """Make ``path`` (as it is outside) appear at the same place in the new root."""
    target = _inside(root, path)
    if os.path.islink(path) and os.path.dirname(path) == "/":  # e.g. /bin -> usr/bin on merged-usr systems
        if not os.path.lexists(target):
            os.symlink(os.readlink(path), target)
        return
    real = os.path.realpath(path)
    if os.path.isdir(real):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if not os.path.exists(target):
            open(target, "x").close()  # an empty mount point
    libc.bind(real, target, read_only=read_only)


def _drop_privileges(libc: _Libc, last_cap: int, run_as: tuple[int, int] | None = None) -> None:
    """No capabilities after exec (bounding, inheritable and ambient sets emptied), and no way to regain any;
    with ``run_as``, also another uid/gid and no supplementary groups (the namespace's own identity)."""
    for cap in range(last_cap + 1):
        libc.check(libc.lib.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0), f"drop capability {cap}")
    libc.lib.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    if run_as is not None:
        uid, gid = run_as
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)  # every uid non-zero: the kernel clears the permitted and effective capabilities
        libc.check(libc.lib.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
        return

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]

    header, data = Header(0x20080522, 0), (Data * 2)()
    libc.check(libc.lib.capget(ctypes.byref(header), data), "capget")
    for half in data:
        half.inheritable = 0
    libc.check(libc.lib.capset(ctypes.byref(header), data), "capset")
    libc.check(libc.lib.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")


def confine_and_exec(spec: dict[str, Any], command: list[str]) -> NoReturn:
    """Build the new root, enter it, drop privileges, exec ``command``. Needs a fresh mount namespace."""
    workspace = os.path.realpath(str(spec["workspace"]))
    extra = [str(p) for p in spec.get("read_only") or []]
    tmp_mb = int(spec.get("tmp_mb", 64))
    libc = _Libc()
    with open("/proc/sys/kernel/cap_last_cap") as last:
        last_cap = int(last.read())
    root = _STAGING
    libc.mount(None, "/", None, _MS_REC | _MS_PRIVATE)  # nothing done here propagates back out
    libc.mount("tmpfs", root, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0755,size=4m")
    for path in SYSTEM_PATHS:
        if os.path.lexists(path):
            _show(libc, root, path, read_only=True)
    for path in _HIDDEN_FILES:
        if os.path.isfile(path):
            libc.bind("/dev/null", _inside(root, path), read_only=False)
    dev = _inside(root, "/dev")
    os.mkdir(dev)
    libc.mount("tmpfs", dev, "tmpfs", _MS_NOSUID | _MS_NOEXEC, "mode=0755,size=64k")
    for name in _DEVICES:
        if os.path.exists(f"/dev/{name}"):
            open(os.path.join(dev, name), "x").close()  # an empty mount point
            libc.bind(f"/dev/{name}", os.path.join(dev, name), read_only=False)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, os.path.join(dev, name))
    os.mkdir(_inside(root, "/tmp"))
    libc.mount("tmpfs", _inside(root, "/tmp"), "tmpfs", _MS_NOSUID | _MS_NODEV, f"mode=1777,size={tmp_mb}m")
    for path in extra:
        if os.path.lexists(path):
            _show(libc, root, path, read_only=True)
    _show(libc, root, workspace, read_only=False)
    os.makedirs(_inside(root, "/proc"), exist_ok=True)
    try:  # this pid namespace's own /proc; without one (refused in some containers) there is just no /proc
        libc.mount("proc", _inside(root, "/proc"), "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    except OSError:
        pass
    os.chdir(root)
    number = _SYS_PIVOT_ROOT.get(os.uname().machine)
    if number is None:
        raise OSError(0, f"pivot_root: unknown syscall number on {os.uname().machine}")
    libc.check(libc.lib.syscall(number, b".", b"."), "pivot_root")
    libc.check(libc.lib.umount2(b".", _MNT_DETACH), "detach the old root")  # the outside is gone for good
    os.chdir("/")
    try:
        libc.mount(None, "/", None, _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)
    except OSError:
        pass
    os.chdir(workspace)
    run_as = spec.get("run_as")
    _drop_privileges(libc, last_cap, (int(run_as[0]), int(run_as[1])) if run_as else None)
    os.execv(command[0], command)


def _main(argv: list[str]) -> NoReturn:
    try:
        confine_and_exec(json.loads(argv[0]), argv[1:])
    except (OSError, ValueError, IndexError, KeyError) as exc:
        print(f"codesdk sandbox: cannot confine the file system ({exc}); the command was not run", file=sys.stderr)
        sys.exit(126)


if __name__ == "__main__":
    _main(sys.argv[1:])
