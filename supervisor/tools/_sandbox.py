"""What the exec sandbox can use on this machine, found out at run time rather than assumed, and how to build
each kind of sandbox's command line.

**The rule every kind follows: the command never runs with a kernel uid or gid of 0.** "uid 0 with no
capabilities" is still root for the files it owns (``/proc/sys`` is writable by uid 0, a file it makes is
root's and may be set-uid), and a uid mapped to 0 outside a user namespace is uid 0 as well. So a root supervisor
always switches the command to another uid *for real* (``setresuid`` in the init user namespace), chosen by
``supervisor.tools._exec`` (the namespace's uid, or the dedicated exec uid); a non-root supervisor's uid is
already not 0.

**bubblewrap** (``bwrap``, Debian package ``bubblewrap``) is preferred wherever it works: a well-kept sandbox
that builds the new root (system directories read-only, a private /tmp, a minimal /dev, a fresh read-only /proc
of its own pid namespace, no /sys, the workspace read-write; every bind ``nosuid,nodev``) in fresh pid, network,
IPC, UTS and cgroup namespaces, and kills all of it when it ends (``--die-with-parent``; the pid namespace dies
with its init).

- As root it runs *privileged* — without a user namespace, because bwrap's ``--uid`` inside a user namespace
  is mapped to uid 0 outside, which is exactly what must not happen — keeping only CAP_DAC_READ_SEARCH (to
  enter the workspace) and CAP_SETUID, CAP_SETGID and CAP_SETPCAP for ``setpriv`` (util-linux), which it execs first: ``setpriv`` empties the bounding and
  inheritable sets, drops the supplementary groups, sets ``no_new_privs`` and switches to the target uid/gid
  (a change to non-zero uids clears every remaining capability), then execs the command.
  Dropping to the target uid *before* bwrap is not used: unprivileged bwrap resolves its bind sources as that
  uid, which cannot reach a workspace under a 0700 directory (the data dir, a 0700 temp dir).
- As another user it runs unprivileged, in a user namespace that maps the supervisor's own uid to itself, with
  ``--disable-userns`` (no nested user namespaces); it drops every capability and sets ``no_new_privs`` itself.

**The built-in helper** (this file run as a program) is the fallback where bwrap is absent or cannot run.
Network isolation is a fresh network namespace (``unshare -n`` as root, else ``unshare -r -n`` through an
unprivileged user namespace); the namespace has only a down loopback, so nothing can connect anywhere. Where it
works, IPC and pid namespaces are added (``-i -p -f --kill-child``): when the command ends or is killed, the
kernel kills everything left in it, including daemons that escaped the process group with ``setsid``.
With a mount namespace too (``unshare -m``), ``python -I -S _sandbox.py SPEC COMMAND...`` runs inside the fresh
namespaces, before the command: it builds a new root on a tmpfs the same way bwrap does, ``pivot_root``s into it
and detaches the old root, so nothing else — the supervisor's data dir with every namespace's HOME, the store,
the tokens, other workspaces — exists for the command. It then empties the capability sets, switches to the
``run_as`` uid/gid (always given when the supervisor is root; it refuses to exec a command that would still be
uid 0 of the host), sets no_new_privs, and execs the rest of the chain. It runs in a freshly exec'd process, so
it is safe.

The memory limit is RLIMIT_AS set by ``prlimit`` in the exec chain (no Python code runs between fork and exec,
which would be unsafe in a threaded supervisor).
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:  # imported where used: this file also runs as a program, with the standard library only
    from codesdk.procs.children import Children

log = logging.getLogger(__name__)

_PROBE_TIMEOUT_S = 10.0
_PROBE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_PID_FLAGS = ("-i", "-p", "-f", "--kill-child")
#: Tried in order; the first that runs ``true`` wins. Root needs no user namespace.
_VARIANTS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("-n", *_PID_FLAGS), "unshare-n+pid"),
    (("-n",), "unshare-n"),
    (("-r", "-n", *_PID_FLAGS), "unshare-rn+pid"),
    (("-r", "-n"), "unshare-rn"),
)

#: The uid and gid ``workspace.exec`` commands run as when the supervisor is root and the workspace is not a
#: namespace's own: high, with no passwd entry, below 2^31 (some tools read uids as signed numbers) and outside
#: the ranges systemd reserves (containers 524288-1879048191, foreign 2147352576-). ``serve --exec-uid`` sets another.
DEFAULT_EXEC_UID = 2_000_000_000

#: What a confined command sees besides the workspace (read-only; those missing here are left out).
SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
#: Files in /etc only root may read; hidden (a device on a nodev mount: unreadable) whoever the command is.
_HIDDEN_FILES = ("/etc/shadow", "/etc/gshadow", "/etc/shadow-", "/etc/gshadow-", "/etc/sudoers")
_DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
#: Where the new root is assembled: a directory that is always there and whose own content no command
#: needs from the outside (a fresh /proc is mounted inside the new root).
_STAGING = "/proc"
#: Capabilities privileged bwrap keeps past its set-up: to enter a workspace lent to the command's uid (which may
#: be 0700), and for ``setpriv``, which comes next and drops them all before the command.
_SETPRIV_CAPS = ("CAP_DAC_READ_SEARCH", "CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP")


@dataclass(frozen=True)
class SandboxTools:
    """Command prefixes the exec tool can put in front of a command; ``None`` where unavailable.

    ``confine_prefix`` replaces ``netns_prefix`` when the file system is to be confined with the built-in
    helper: the same namespaces plus a mount namespace, and this file as the program that builds the new root.
    It is followed by the JSON spec (``confine_spec``) and then the command. ``bwrap`` is bubblewrap where it
    runs here (see ``bwrap_argv``), preferred to the helper; ``bwrap_problem`` says why it is not used otherwise.
    ``setpriv`` switches a root supervisor's command to another uid outside the helper.
    """

    netns_prefix: tuple[str, ...] | None
    netns_label: str | None
    prlimit: str | None
    confine_prefix: tuple[str, ...] | None = None
    bwrap: str | None = None
    setpriv: str | None = None
    bwrap_problem: str | None = field(default=None, compare=False)


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
    return any(within(real, root) for root in roots)


def within(path: str, root: str) -> bool:
    """``path`` is ``root`` or below it (both normalized, no trailing slash needed)."""
    return path == root or path.startswith(root.rstrip("/") + "/")


def setpriv_argv(setpriv: str, uid: int, gid: int) -> list[str]:
    """Become ``uid``/``gid`` for real, with no supplementary groups, no capability left in any set (bounding
    included) and no_new_privs, then exec the rest. Needs CAP_SETUID, CAP_SETGID and CAP_SETPCAP."""
    if uid == 0 or gid == 0:
        raise ValueError("a sandboxed command must never run as uid or gid 0")
    return [setpriv, f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--inh-caps=-all",
            "--bounding-set=-all", "--no-new-privs", "--"]


def bwrap_argv(bwrap: str, workspace: str, read_only: Sequence[str] = (), *, tmp_mb: int = 64,
               privileged: bool) -> list[str]:
    """bubblewrap's part of the chain, up to its ``--``: what the command sees (see the module docstring).

    ``privileged`` (a root supervisor): no user namespace, and the three capabilities ``setpriv`` needs, which
    must come next in the chain. Otherwise: a user namespace of the caller's own uid, no nested ones."""
    argv = [bwrap, "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent"]
    if not privileged:
        argv += ["--unshare-user", "--disable-userns"]
    bound: list[str] = []  # real directories shown with their content: what lies under them exists already
    for path in SYSTEM_PATHS:
        if os.path.islink(path) and os.path.dirname(path) == "/":  # e.g. /bin -> usr/bin on merged-usr systems
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.exists(path):
            argv += ["--ro-bind", os.path.realpath(path), path]
            bound.append(path)
    for path in _HIDDEN_FILES:
        if os.path.isfile(path):
            argv += ["--ro-bind", "/dev/null", path]
    argv += ["--proc", "/proc", "--remount-ro", "/proc", "--dev", "/dev",
             "--perms", "1777", "--size", str(tmp_mb * 1024 * 1024), "--tmpfs", "/tmp"]
    for path in read_only:
        if os.path.lexists(path):
            argv += [*_parents(path, bound), "--ro-bind", os.path.realpath(path), path]
            bound.append(path)
    argv += [*_parents(workspace, bound), "--bind", workspace, workspace, "--chdir", workspace]
    if privileged:
        argv += ["--cap-drop", "ALL"]
        for cap in _SETPRIV_CAPS:
            argv += ["--cap-add", cap]
    return [*argv, "--"]


def _parents(path: str, bound: Sequence[str]) -> list[str]:
    """bwrap options that make the directories leading to ``path`` traversable (0755) by the command's uid where
    bwrap would create them itself (copying the host's modes: a 0700 temp dir would lock the command out)."""
    argv: list[str] = []
    parent = os.path.dirname(path.rstrip("/"))
    chain: list[str] = []
    while parent not in ("/", ""):
        chain.append(parent)
        parent = os.path.dirname(parent)
    for folder in reversed(chain):
        if folder in ("/tmp", "/proc", "/dev") or any(within(folder, root) for root in bound):
            continue
        argv += ["--perms", "0755", "--dir", folder]
    return argv


async def _works(argv: list[str], children: Children) -> tuple[bool, str]:
    """Whether ``argv`` runs and exits 0, and what it said on stderr otherwise. Run in a session of its own that
    is ended and reaped afterwards, as exec does: bubblewrap's init may outlive bwrap by a moment, and it would
    be left as a zombie to a supervisor that is a child subreaper; owned in ``children`` meanwhile."""
    from functools import partial

    import trio

    from codesdk.procs.orphans import end_command
    from codesdk.procs.process import session_child
    from codesdk.procs.scan import Scans

    end = partial(end_command, scans=Scans())
    with tempfile.TemporaryFile() as err:
        try:
            async with session_child(argv, children=children, deliver_cancel=end, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=err, env={}) as (process, _):
                with trio.move_on_after(_PROBE_TIMEOUT_S) as timer:
                    await process.wait()
                await end(process)
        except OSError as exc:
            return False, str(exc)
        if timer.cancelled_caught:
            return False, f"timed out after {_PROBE_TIMEOUT_S:g}s"
        err.seek(0)
        return process.returncode == 0, err.read().decode(errors="replace").strip()


async def _probe_bwrap(true: str | None, setpriv: str | None, children: Children) -> tuple[str | None, str | None]:
    """(bwrap, None) if bubblewrap runs a command here the way exec will use it, else (None, why not)."""
    bwrap = shutil.which("bwrap", path=_PROBE_PATH)
    if bwrap is None or true is None:
        return None, "bubblewrap is not installed (Debian: apt-get install bubblewrap)"
    privileged = os.geteuid() == 0
    if privileged and setpriv is None:
        return None, "`setpriv` (util-linux) is missing, so a root supervisor cannot switch the command's uid"
    with tempfile.TemporaryDirectory(prefix="codesdk-bwrap-probe-") as workspace:
        argv = bwrap_argv(bwrap, workspace, tmp_mb=1, privileged=privileged)
        if privileged:
            assert setpriv is not None
            argv += setpriv_argv(setpriv, DEFAULT_EXEC_UID, DEFAULT_EXEC_UID)
        ok, said = await _works([*argv, true], children)
    if not ok:
        return None, f"{bwrap} cannot build the sandbox here: {said or 'it failed'}"
    return bwrap, None


async def probe_sandbox(children: Children | None = None) -> SandboxTools:
    """Try bubblewrap, then each ``unshare`` variant with ``true``, and keep what works. ``children``: where the
    probes are owned (None: a registry of their own, where nothing sweeps orphans)."""
    if children is None:
        from codesdk.procs.children import Children

        children = Children()
    unshare = shutil.which("unshare", path=_PROBE_PATH)
    true = shutil.which("true", path=_PROBE_PATH)
    prlimit = shutil.which("prlimit", path=_PROBE_PATH)
    setpriv = shutil.which("setpriv", path=_PROBE_PATH)
    prefix: tuple[str, ...] | None = None
    label: str | None = None
    if unshare and true:
        for flags, name in _VARIANTS:
            candidate = (unshare, *flags, "--")
            if (await _works([*candidate, true], children))[0]:
                prefix, label = candidate, name
                break
    if prlimit and true and not (await _works([prlimit, "--as=1073741824", "--", true], children))[0]:
        prlimit = None
    switch = [*setpriv_argv(setpriv, DEFAULT_EXEC_UID, DEFAULT_EXEC_UID), true] if setpriv and true else []
    if switch and os.geteuid() == 0 and not (await _works(switch, children))[0]:
        setpriv = None
    confine: tuple[str, ...] | None = None
    if prefix is not None and true:
        candidate = (prefix[0], "-m", *prefix[1:-1], "--", sys.executable, "-I", "-S", os.path.abspath(__file__))
        run_as = (DEFAULT_EXEC_UID, DEFAULT_EXEC_UID) if os.geteuid() == 0 else None
        with tempfile.TemporaryDirectory(prefix="codesdk-confine-probe-") as workspace:
            if (await _works([*candidate, confine_spec(workspace, run_as=run_as), true], children))[0]:
                confine = candidate
    bwrap, problem = await _probe_bwrap(true, setpriv, children)
    if problem is not None:
        log.warning("workspace.exec: not using bubblewrap (%s); the built-in sandbox helper is used instead", problem)
    return SandboxTools(netns_prefix=prefix, netns_label=label, prlimit=prlimit, confine_prefix=confine,
                        bwrap=bwrap, setpriv=setpriv, bwrap_problem=problem)


class SandboxProber:
    """Probes once, on first use, and remembers (a registry owns one)."""

    def __init__(self, children: Children | None = None) -> None:
        """``children``: where its probes are owned (see ``probe_sandbox``)."""
        import trio

        self.children = children
        self._found: SandboxTools | None = None
        self._lock = trio.Lock()

    async def get(self) -> SandboxTools:
        async with self._lock:
            if self._found is None:
                self._found = await probe_sandbox(self.children)
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

    def bind(self, source: str, target: str, *, read_only: bool, devices: bool = False) -> None:
        """A bind mount, always ``nosuid`` (a set-uid file in it gives nothing) and ``nodev`` unless it is one of
        the devices of /dev; the flags the source was mounted with are kept (a user namespace must keep them)."""
        self.mount(source, target, None, _MS_BIND | _MS_REC)
        kept = sum(ms for st, ms in _ST_FLAGS.items() if os.statvfs(target).f_flag & st)
        flags = kept | _MS_NOSUID | (0 if devices else _MS_NODEV) | (_MS_RDONLY if read_only else 0)
        self.mount(None, target, None, _MS_REMOUNT | _MS_BIND | flags)


def _b(text: str | None) -> bytes | None:
    return None if text is None else text.encode()


def _inside(root: str, path: str) -> str:
    return os.path.join(root, path.lstrip("/"))


def _make_dirs(path: str) -> None:
    """``os.makedirs`` with 0755 whatever the umask (a 0700 parent would lock a non-root command out)."""
    missing: list[str] = []
    while not os.path.lexists(path):
        missing.append(path)
        path = os.path.dirname(path)
    for folder in reversed(missing):
        os.mkdir(folder)
        os.chmod(folder, 0o755)


def _show(libc: _Libc, root: str, path: str, *, read_only: bool) -> None:
    """Make ``path`` (as it is outside) appear at the same place in the new root."""
    target = _inside(root, path)
    if os.path.islink(path) and os.path.dirname(path) == "/":  # e.g. /bin -> usr/bin on merged-usr systems
        if not os.path.lexists(target):
            os.symlink(os.readlink(path), target)
        return
    real = os.path.realpath(path)
    if os.path.isdir(real):
        _make_dirs(target)
    else:
        _make_dirs(os.path.dirname(target))
        if not os.path.exists(target):
            open(target, "x").close()  # an empty mount point
    libc.bind(real, target, read_only=read_only)


def _clear_inheritable(libc: _Libc) -> None:
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


def _host_uid(uid: int) -> int | None:
    """What ``uid`` of this process's user namespace is in the parent one (``/proc/self/uid_map``)."""
    with open("/proc/self/uid_map") as mapping:
        for line in mapping:
            inside, outside, count = (int(part) for part in line.split())
            if inside <= uid < inside + count:
                return outside + uid - inside
    return None


def _drop_privileges(libc: _Libc, last_cap: int, run_as: tuple[int, int] | None = None) -> None:
    """No capabilities after exec (bounding, inheritable and ambient sets emptied) and no way to regain any
    (no_new_privs); with ``run_as``, also another uid/gid for real and no supplementary groups. Refuses to go on
    if the command would still be uid 0 of the host (a root supervisor that gave no ``run_as``)."""
    for cap in range(last_cap + 1):
        libc.check(libc.lib.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0), f"drop capability {cap}")
    libc.lib.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    _clear_inheritable(libc)
    if run_as is not None:
        uid, gid = run_as
        if uid == 0 or gid == 0:
            raise OSError(0, "refusing to run the command as uid or gid 0")
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)  # every uid non-zero: the kernel clears the permitted and effective sets
    libc.check(libc.lib.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    if (0 in os.getresuid() or 0 in os.getresgid()) and _host_uid(os.getuid()) in (0, None):
        raise OSError(0, "the command would run as uid 0 of the host; refusing (give run_as)")


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
            libc.bind("/dev/null", _inside(root, path), read_only=True)
    dev = _inside(root, "/dev")
    os.mkdir(dev)
    os.chmod(dev, 0o755)
    libc.mount("tmpfs", dev, "tmpfs", _MS_NOSUID | _MS_NOEXEC, "mode=0755,size=64k")
    for name in _DEVICES:
        if os.path.exists(f"/dev/{name}"):
            open(os.path.join(dev, name), "x").close()  # an empty mount point
            libc.bind(f"/dev/{name}", os.path.join(dev, name), read_only=False, devices=True)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, os.path.join(dev, name))
    os.mkdir(_inside(root, "/tmp"))
    libc.mount("tmpfs", _inside(root, "/tmp"), "tmpfs", _MS_NOSUID | _MS_NODEV, f"mode=1777,size={tmp_mb}m")
    for path in extra:
        if os.path.lexists(path):
            _show(libc, root, path, read_only=True)
    _show(libc, root, workspace, read_only=False)
    _make_dirs(_inside(root, "/proc"))
    try:  # this pid namespace's own /proc, read-only; without one (refused in some containers) there is no /proc
        libc.mount("proc", _inside(root, "/proc"), "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC | _MS_RDONLY)
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
