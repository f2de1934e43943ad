"""Credential namespaces: validated names, their private directories, and worker environments.

A namespace (``default``, ``user:<id>``, ``ci:<job>``) owns ``<data-dir>/namespaces/<safe-name>/`` (mode 0700)
with home/, config/, state/, cache/, data/, tmp/. A worker's environment is built from scratch from
those paths plus what the operator configured — never the supervisor's whole environment — so one
tenant's OAuth caches and tokens can't leak into another's runtime.

By default every worker runs as the supervisor's own uid: one trust domain, where 0700 keeps other local users
out but does not separate the tenants from each other. With a worker uid range (``UidRange``,
``--worker-uids START:COUNT``) each namespace is given its own uid+gid from the range (``namespace_identity``,
persisted in ``<data-dir>/worker-uids.json`` and never reused), its directories are owned by that uid, and
``<data-dir>`` and ``namespaces/`` become 0711 so a worker can reach its own home by name and nothing else.
"""

from __future__ import annotations

import errno
import fcntl
import grp
import json
import logging
import os
import pwd
import re
import stat
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from protocol import IsolationLevel, IsolationMode, RuntimeEnv

from ._private_files import write_private

_KINDS = ("user", "ci")
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")
SUBDIRS = ("home", "config", "state", "cache", "data", "tmp")
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
#: Where the namespace -> uid assignments live (supervisor-owned, 0600), so they survive restarts.
UIDS_FILE = "worker-uids.json"
_UIDS_LOCK = "worker-uids.lock"
#: uid/gid values the kernel or NFS treat specially (-1 as 32 bits, and "nobody").
_MAX_ID = 2**32 - 2

log = logging.getLogger("codesdk.supervisor.namespaces")


class InvalidNamespace(ValueError):
    """A namespace name that is not ``default``, ``user:<id>`` or ``ci:<job>``."""


@dataclass(frozen=True)
class Namespace:
    name: str

    @classmethod
    def parse(cls, name: str) -> Namespace:
        if name == "default":
            return cls(name)
        kind, sep, ident = name.partition(":")
        if not sep or kind not in _KINDS:
            raise InvalidNamespace(
                f"invalid namespace {name!r}: use 'default', 'user:<id>' or 'ci:<job>'")
        if not _ID.fullmatch(ident) or ".." in ident:
            raise InvalidNamespace(
                f"invalid namespace {name!r}: the id must be 1-64 characters of letters, digits, '_', '.', '@', '-', "
                "start with a letter or digit, and not contain '..'")
        return cls(name)

    @property
    def safe_name(self) -> str:
        """Directory name: ':' becomes '.', which kinds and ids can't otherwise produce, so it's unique."""
        return self.name.replace(":", ".", 1)

    def root(self, data_dir: Path) -> Path:
        return data_dir / "namespaces" / self.safe_name


@dataclass(frozen=True)
class NamespaceDirs:
    root: Path
    home: Path
    config: Path
    state: Path
    cache: Path
    data: Path
    tmp: Path


def prepare_dirs(data_dir: Path, namespace: Namespace, identity: Identity | None = None) -> NamespaceDirs:
    """Create the namespace's directories with mode 0700 (and tighten them if they already exist).

    With an ``identity`` they are owned by its uid/gid — an existing tree not yet theirs (created before the
    uid range was configured) is handed over whole — and ``data_dir`` and ``namespaces/`` become 0711, so the
    worker can pass through them to its own directory but list neither. Directories are opened without
    following symlinks and changed through the descriptor, so a tenant that owns its tree cannot redirect
    the supervisor's chmod/chown elsewhere by swapping in a symlink.
    """
    root = namespace.root(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    # ``namespaces/`` too: an existing one left group/world-readable would expose every tenant's directory names.
    passage = 0o711 if identity is not None else 0o700
    with _open_dir(data_dir, None, create=False) as fd:
        if identity is not None:
            os.fchmod(fd, passage)
        with _open_dir(Path("namespaces"), fd, create=True, shown_as=data_dir / "namespaces") as namespaces_fd:
            os.fchmod(namespaces_fd, passage)
            with _open_dir(Path(namespace.safe_name), namespaces_fd, create=True, shown_as=root) as root_fd:
                handed_over = identity is not None and os.fstat(root_fd).st_uid != identity.uid
                if handed_over:
                    assert identity is not None
                    _chown_tree(root, identity)
                _own(root_fd, identity)
                for name in SUBDIRS:
                    with _open_dir(Path(name), root_fd, create=True, shown_as=root / name) as sub_fd:
                        _own(sub_fd, identity)
    return NamespaceDirs(root=root, **{name: root / name for name in SUBDIRS})


def prepare_namespace(data_dir: Path, namespace: Namespace,
                      uids: UidRange | None) -> tuple[NamespaceDirs, Identity | None]:
    """The namespace's directories, owned by its own uid (returned too) when a worker uid range is configured."""
    if uids is None:
        return prepare_dirs(data_dir, namespace), None
    identity = namespace_identity(data_dir, uids, namespace)
    dirs = prepare_dirs(data_dir, namespace, identity)
    tighten_data_dir(data_dir)  # before a worker can pass through: whatever appeared since start-up is closed
    return dirs, identity


@contextmanager
def _open_dir(path: Path, dir_fd: int | None, *, create: bool, shown_as: Path | None = None) -> Iterator[int]:
    """A directory's descriptor, never through a symlink (``InvalidNamespace`` if one is planted there)."""
    shown = shown_as or path
    if create:
        try:
            os.mkdir(path, 0o700, dir_fd=dir_fd)
        except FileExistsError:
            pass
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(shown):
            raise InvalidNamespace(f"{shown} is a symlink; refusing to use it as a namespace directory") from exc
        raise
    try:
        yield fd
    finally:
        os.close(fd)


def _own(fd: int, identity: Identity | None) -> None:
    os.fchmod(fd, 0o700)
    if identity is not None:
        os.fchown(fd, identity.uid, identity.gid)


def _chown_tree(root: Path, identity: Identity) -> None:
    """Hand a whole tree to ``identity`` (never following symlinks; they are re-owned themselves)."""
    for folder, dirs, files in os.walk(root, followlinks=False):
        for name in (*dirs, *files):
            os.chown(os.path.join(folder, name), identity.uid, identity.gid, follow_symlinks=False)
    os.chown(root, identity.uid, identity.gid, follow_symlinks=False)


def build_env(dirs: NamespaceDirs, extra: Mapping[str, str] | None = None, path: str | None = None) -> dict[str, str]:
    """The worker's whole environment: namespace paths, PATH, LANG and the operator's variables only."""
    env = {
        "HOME": str(dirs.home),
        "XDG_CONFIG_HOME": str(dirs.config),
        "XDG_STATE_HOME": str(dirs.state),
        "XDG_CACHE_HOME": str(dirs.cache),
        "XDG_DATA_HOME": str(dirs.data),
        "TMPDIR": str(dirs.tmp),
        "PATH": path or DEFAULT_PATH,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
    }
    env.update(extra or {})
    return env


def runtime_env(namespace: Namespace, env: Mapping[str, str]) -> RuntimeEnv:
    """The safe view sent to the worker: paths and variable names, never values of other variables."""
    return RuntimeEnv(
        namespace=namespace.name, isolation=IsolationLevel.NAMESPACED, mode=IsolationMode.SUBPROCESS,
        home=env["HOME"], xdg_config_home=env["XDG_CONFIG_HOME"], xdg_state_home=env["XDG_STATE_HOME"],
        xdg_cache_home=env["XDG_CACHE_HOME"], xdg_data_home=env["XDG_DATA_HOME"], tmpdir=env["TMPDIR"],
        path=env["PATH"], variable_names=tuple(sorted(env)),
    )


# --- per-namespace uids ----------------------------------------------------------------------------------


class UidRangeError(RuntimeError):
    """The worker uid range can't be used: bad syntax, no privilege to switch uids, exhausted, or changed."""


@dataclass(frozen=True)
class Identity:
    """The uid and gid a namespace's worker runs as (no passwd entry needed; no supplementary groups)."""

    uid: int
    gid: int


@dataclass(frozen=True)
class UidRange:
    """``COUNT`` consecutive uids (each used as its own gid too) from ``START``, reserved for workers."""

    start: int
    count: int

    def __post_init__(self) -> None:
        if self.start < 1 or self.count < 1 or self.start + self.count - 1 > _MAX_ID:
            raise UidRangeError(
                f"invalid worker uid range {self.start}:{self.count}: START must be at least 1 (never root), COUNT "
                f"at least 1, and the range must end below {_MAX_ID + 1}")

    @classmethod
    def parse(cls, text: str) -> UidRange:
        start, sep, count = text.partition(":")
        if not sep or not start.strip().isdigit() or not count.strip().isdigit():
            raise UidRangeError(f"invalid worker uid range {text!r}: use START:COUNT, e.g. 200000:1000")
        return cls(int(start), int(count))

    def __contains__(self, uid: object) -> bool:
        return isinstance(uid, int) and self.start <= uid < self.start + self.count

    def __str__(self) -> str:
        return f"{self.start}:{self.count}"


#: Capabilities the supervisor needs to run workers as other uids and still manage their files.
_NEEDED_CAPS = {0: "CAP_CHOWN", 1: "CAP_DAC_OVERRIDE", 3: "CAP_FOWNER", 6: "CAP_SETGID", 7: "CAP_SETUID"}


def check_can_switch_uids() -> None:
    """``UidRangeError`` unless this process may start workers as other uids (root, or the capabilities)."""
    try:
        with open("/proc/self/status") as status:
            effective = next(int(line.split()[1], 16) for line in status if line.startswith("CapEff:"))
    except (OSError, StopIteration, ValueError):
        effective = ~0 if os.geteuid() == 0 else 0
    missing = [name for bit, name in sorted(_NEEDED_CAPS.items()) if not effective >> bit & 1]
    if missing:
        raise UidRangeError(
            "a worker uid range needs the supervisor to run as root or with "
            f"{', '.join(_NEEDED_CAPS.values())} (missing: {', '.join(missing)}); run it as root "
            "(e.g. the systemd unit's User=root), grant AmbientCapabilities=, or drop --worker-uids")


_allocation_lock = threading.Lock()


def namespace_identity(data_dir: Path, uids: UidRange, namespace: Namespace) -> Identity:
    """The namespace's uid+gid: the one it was given before, else the lowest free uid of the range.

    Assignments are stored in ``<data-dir>/worker-uids.json`` (0600, written atomically under a lock) and
    never removed, so a uid always means the same tenant — files it left behind stay its own. uids with a
    passwd or group entry are skipped: they belong to someone already.
    """
    path = data_dir / UIDS_FILE
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    with _allocation_lock, _locked(data_dir / _UIDS_LOCK):
        assigned = _read_assignments(path)
        uid = assigned.get(namespace.name)
        if uid is not None:
            if uid not in uids:
                raise UidRangeError(
                    f"namespace {namespace.name!r} was given uid {uid}, outside the configured worker uid range "
                    f"{uids}; configure the range it came from again (or one that contains it), or — if that "
                    f"namespace's files may be disowned — remove its entry from {path}")
            return Identity(uid, uid)
        taken = set(assigned.values())
        uid = next((u for u in range(uids.start, uids.start + uids.count) if u not in taken and _unused(u)), None)
        if uid is None:
            raise UidRangeError(
                f"the worker uid range {uids} is exhausted ({len(taken)} namespaces hold a uid; uids already "
                f"in /etc/passwd or /etc/group are skipped); namespace {namespace.name!r} cannot get one — "
                "configure a larger range (keeping its start) to give it one")
        assigned[namespace.name] = uid
        _write_assignments(path, assigned)
        log.info("namespace %s: assigned worker uid/gid %d", namespace.name, uid)
        return Identity(uid, uid)


def _unused(uid: int) -> bool:
    for lookup in (pwd.getpwuid, grp.getgrgid):
        try:
            lookup(uid)
        except KeyError:
            continue
        return False
    return True


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _read_assignments(path: Path) -> dict[str, int]:
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise UidRangeError(f"cannot read the worker uid assignments in {path} ({exc}); restore it from a "
                            "backup — assigning uids afresh would hand one tenant's files to another") from exc
    assigned = raw.get("assigned") if isinstance(raw, dict) else None
    if not isinstance(assigned, dict) or not all(isinstance(v, int) for v in assigned.values()):
        raise UidRangeError(f"{path} is not a worker uid assignment file (expected {{\"assigned\": {{namespace: "
                            "uid}}}); restore it from a backup")
    return {str(k): int(v) for k, v in assigned.items()}


def _write_assignments(path: Path, assigned: Mapping[str, int]) -> None:
    write_private(path, json.dumps({"version": 1, "assigned": dict(sorted(assigned.items()))}, indent=1))


def secure_data_dir(data_dir: Path) -> None:
    """Create the data dir 0700, or close a pre-existing one that is readable by others (``UnsafeDataDir`` with
    the command to run when that is not ours to do): its store and every tenant's files live below."""
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    mode = stat.S_IMODE(data_dir.stat().st_mode)
    if mode & 0o077 and mode != 0o711:  # 0711: a worker uid range's passage (reachable by name, not listable)
        try:
            os.chmod(data_dir, mode & 0o700)
        except OSError as exc:
            raise UnsafeDataDir(f"the data dir {data_dir} is mode {mode:o} (others may read the store and every "
                                f"tenant's files) and cannot be closed here ({exc.strerror}); run `chmod 700 "
                                f"{data_dir}` as its owner") from exc
        log.warning("data dir %s was mode %o; tightened to %o", data_dir, mode, mode & 0o700)


class UnsafeDataDir(RuntimeError):
    """The data dir is open to other users and we cannot close it."""


def tighten_data_dir(data_dir: Path) -> None:
    """Close every top-level entry of the data dir but ``namespaces/`` to group and others.

    With a uid range the data dir is 0711, so anything in it is reachable by name: the store, blobs and
    token files must then not rely on the umask they were created with.
    """
    for entry in os.scandir(data_dir):
        if entry.name == "namespaces" or entry.is_symlink():
            continue
        mode = stat.S_IMODE(entry.stat(follow_symlinks=False).st_mode)
        if mode & 0o077:
            os.chmod(entry.path, mode & 0o700, follow_symlinks=True)


def check_reachable_by_workers(program: str) -> None:
    """``UidRangeError`` if a worker uid could not run ``program`` (or the interpreter its ``#!`` line names):
    every directory on its real path must be searchable by others and the file executable by them — a venv
    whose interpreter lives under a 0700 ``/root`` is the usual trap."""
    real = Path(os.path.realpath(program))
    for folder in (*reversed(real.parents), real):
        try:
            mode = folder.stat().st_mode
        except OSError as exc:
            raise UidRangeError(f"worker program {program!r}: cannot inspect {folder} ({exc.strerror})") from exc
        if not mode & stat.S_IXOTH:
            raise UidRangeError(
                f"the worker program {program!r} (really {real}) cannot be run by the worker uids: {folder} is "
                f"mode {stat.S_IMODE(mode):o}, not searchable/executable by others; install the interpreter and "
                "the venv under a world-readable prefix (e.g. /opt or /usr/local), or pass a worker argv that is")
    if real.is_file():
        try:
            with open(real, "rb") as script:
                first = script.readline(4096)
        except OSError:
            return
        interpreter = first[2:].split()[0].decode(errors="replace") if first.startswith(b"#!") and first[2:].split() else ""
        if interpreter.startswith("/") and os.path.realpath(interpreter) != str(real):
            check_reachable_by_workers(interpreter)


class WorkspaceRefused(ValueError):
    """A workspace that would expose the supervisor's own files (or the whole host) to a tenant's tools."""


def check_workspace(workspace: Path, data_dir: Path) -> Path:
    """The workspace's real path, unless it is ``/`` or overlaps the data dir (the store, the tokens, every
    namespace's HOME) — is it, contains it, or lies inside it other than under ``workspaces/``."""
    real = workspace.resolve()
    data = data_dir.resolve()
    own = data / "workspaces"  # where the supervisor makes default workspaces: safe, one per session
    if real == Path(real.anchor):
        raise WorkspaceRefused(f"workspace {workspace} is the root of the file system; tools would reach everything")
    if real == data or data.is_relative_to(real):
        raise WorkspaceRefused(f"workspace {workspace} contains the supervisor's data dir {data} (its store, tokens "
                               "and every namespace's HOME); use a directory outside it")
    if real.is_relative_to(data) and not (real != own and real.is_relative_to(own)):
        raise WorkspaceRefused(f"workspace {workspace} lies inside the supervisor's data dir {data}; use a "
                               "directory outside it")
    return real


def give_workspace(workspace: Path, namespace: str, data_dir: Path, uids: UidRange | None) -> Identity | None:
    """Make a session's workspace the namespace's own, so its worker's runtime can work in it.

    A no-op (``None``) without a uid range. Otherwise the workspace tree is handed to the namespace's uid
    (already-owned trees are left alone), and a workspace under the data dir gets 0711 on the directories
    leading to it. Refused when the workspace belongs to another namespace's uid: two tenants sharing a
    workspace would share files. The supervisor keeps access through its capabilities.
    """
    if uids is None:
        return None
    identity = namespace_identity(data_dir, uids, Namespace.parse(namespace))
    workspace = check_workspace(workspace, data_dir)
    data_dir = data_dir.resolve()
    if not workspace.is_dir():
        raise ValueError(f"workspace {workspace} is not a directory that can be given to a namespace")
    owner = workspace.stat().st_uid
    if owner != identity.uid:
        if owner in uids:
            raise ValueError(
                f"workspace {workspace} belongs to another namespace (uid {owner}); namespace {namespace!r} "
                f"(uid {identity.uid}) needs a workspace of its own")
        _chown_tree(workspace, identity)
    if workspace.is_relative_to(data_dir):
        for folder in workspace.relative_to(data_dir).parents:  # includes "." (the data dir itself)
            os.chmod(data_dir / folder, 0o711)
    else:
        closed = [str(p) for p in workspace.parents if not p.stat().st_mode & stat.S_IXOTH]
        if closed:
            log.warning("workspace %s: %s not searchable by others, so namespace %s's worker cannot reach it",
                        workspace, ", ".join(closed), namespace)
    return identity
