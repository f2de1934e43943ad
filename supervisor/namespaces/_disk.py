"""A disk quota per namespace, kept by the kernel: each namespace's files live on an ext4 image of its own.

Why an image: the data dir's file system here (and on many hosts) is mounted without project quotas, and the
supervisor may not remount the host's file systems; a loop-mounted ext4 image is bounded by its size (bytes) and
its inode count (``mkfs.ext4 -N``: files), and a write past either fails in the kernel with ENOSPC, for the
supervisor's tools, the worker, its runtime and ``workspace.exec`` alike.

Layout, for a namespace with a quota::

    <data-dir>/volumes/<safe>.img              the image (sparse: it takes host disk as it fills)
    <data-dir>/volumes/<safe>/                 where it is mounted (nosuid,nodev), root-owned 0711
    <data-dir>/volumes/<safe>/namespace/       bind-mounted over <data-dir>/namespaces/<safe>/ (HOME and the rest)
    <data-dir>/volumes/<safe>/workspaces/      the namespace's default session workspaces (root-owned 0711)

``workspaces/`` is not inside the tenant-owned tree, so a tenant cannot swap it for a symlink. Exec is allowed
on the volume (no ``noexec``): runtimes keep programs in HOME (installers, caches) and commands run scripts in
their workspace.

A namespace's files found in place when its quota is first enabled are copied into the new image before it is
mounted over them, and removed from the host disk only once the copy is whole; when they do not fit, the image
is discarded and ``DiskQuotaError`` tells the operator how much they take. Blocking (mount, mkfs, copies): run
in a thread.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

from ._limits import JsonLimitFile, LimitTable, LimitTableUnreadable
from ._pg_errors import NamespaceStateUnavailable
from ._names import InvalidNamespace, Namespace

log = logging.getLogger("codesdk.supervisor.namespaces")

VOLUMES_DIR = "volumes"
DISK_QUOTAS_FILE = "namespace-disks.json"
#: Bytes per file when a quota gives no file count: ext4's own default (one inode per 16 KiB).
DEFAULT_BYTES_PER_FILE = 16 * 1024
MIN_QUOTA_BYTES = 8 << 20  # below this ext4's own metadata takes most of it
MIN_QUOTA_FILES = 32
#: ext4 with 4 KiB blocks and 32-bit block numbers holds at most 16 TiB; a quota above it could never be an image.
MAX_QUOTA_BYTES = 16 << 40
_MOUNT_OPTIONS = "loop,nosuid,nodev"
_SIZE = re.compile(r"^([0-9]+)([kmgt]?)$")
_SCALE = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


class DiskQuotaError(RuntimeError):
    """A namespace's volume cannot be set up as configured (the operator's to fix: the message says how)."""


def _size(text: str) -> int:
    match = _SIZE.fullmatch(text.strip().lower())
    if match is None:
        raise ValueError(f"invalid size {text!r}: a number of bytes, K/M/G/T allowed (e.g. 512M)")
    return int(match.group(1)) * _SCALE[match.group(2)]


def _mib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.1f} MiB"


@dataclass(frozen=True)
class DiskQuota:
    """``SIZE[:FILES]``: the bytes and files a namespace's volume holds (files: ext4's default ratio if not given)."""

    bytes: int
    files: int | None = None

    @classmethod
    def parse(cls, text: str) -> DiskQuota:
        size, sep, files = text.partition(":")
        quota = cls(_size(size), int(files) if sep and files.strip().isdigit() else None)
        if sep and quota.files is None:
            raise ValueError(f"invalid file count in {text!r}: SIZE:FILES takes a whole number of files")
        if quota.bytes < MIN_QUOTA_BYTES:
            raise ValueError(f"disk quota {text!r} is below {MIN_QUOTA_BYTES >> 20}M, too small for a file system")
        if quota.bytes > MAX_QUOTA_BYTES:
            raise ValueError(f"disk quota {text!r} is above {MAX_QUOTA_BYTES >> 40}T, the most a namespace's ext4 "
                             "volume can hold")
        if quota.files is not None and quota.files < MIN_QUOTA_FILES:
            raise ValueError(f"disk quota {text!r}: at least {MIN_QUOTA_FILES} files")
        if quota.files is not None and quota.files >= 2**32:
            raise ValueError(f"disk quota {text!r}: at most {2**32 - 1} files (ext4's inode numbers)")
        return quota

    @property
    def inodes(self) -> int:
        return self.files if self.files is not None else max(MIN_QUOTA_FILES, self.bytes // DEFAULT_BYTES_PER_FILE)

    def __str__(self) -> str:
        size = f"{self.bytes >> 20}M" if self.bytes % (1 << 20) == 0 else str(self.bytes)
        return f"{size}:{self.files}" if self.files is not None else size


@dataclass(frozen=True)
class DiskUsage:
    """A mounted volume's fill, as the kernel counts it (``statvfs``)."""

    used_bytes: int
    limit_bytes: int
    used_files: int
    limit_files: int

    @classmethod
    def of(cls, path: Path | str) -> DiskUsage:
        st = os.statvfs(path)
        return cls(used_bytes=(st.f_blocks - st.f_bfree) * st.f_frsize, limit_bytes=st.f_blocks * st.f_frsize,
                   used_files=st.f_files - st.f_ffree, limit_files=st.f_files)

    @property
    def full(self) -> bool:
        """Nearly nothing more fits: under 1 MiB (or 2 %) free, or no free inode (why a write failed, likely)."""
        free = self.limit_bytes - self.used_bytes
        return free < max(1 << 20, self.limit_bytes // 50) or self.used_files >= self.limit_files

    def describe(self) -> str:
        return (f"{_mib(self.used_bytes)} of {_mib(self.limit_bytes)} and {self.used_files} of {self.limit_files} "
                "files used")


def disk_unsupported() -> str | None:
    """Why per-namespace volumes cannot be made here (None when they can): they need root, loop devices and the
    ext4 tools."""
    if os.geteuid() != 0:
        return "the supervisor is not root, so it cannot mount a namespace's volume"
    if not os.path.exists("/dev/loop-control") and not os.path.exists("/dev/loop0"):
        return "this host has no loop devices (/dev/loop-control), so a namespace's volume cannot be mounted"
    missing = [tool for tool in ("mkfs.ext4", "resize2fs", "losetup", "mount", "umount") if _which(tool) is None]
    if missing:
        return f"{', '.join(missing)} not found (e2fsprogs, util-linux): install them to give namespaces volumes"
    return None


def _which(tool: str) -> str | None:
    return shutil.which(tool, path="/usr/sbin:/usr/bin:/sbin:/bin")


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    exe = _which(argv[0]) or argv[0]
    return subprocess.run([exe, *argv[1:]], capture_output=True, text=True, check=False, timeout=120)


def _check(what: str, done: subprocess.CompletedProcess[str]) -> None:
    if done.returncode != 0:
        reason = (done.stderr or done.stdout).strip().splitlines()
        raise DiskQuotaError(f"{what} failed: {reason[-1] if reason else f'exit {done.returncode}'}")


def _mount_source(mount_point: Path) -> str | None:
    """The device mounted at ``mount_point`` (the last mount there), from /proc/self/mountinfo."""
    target = os.fsencode(str(mount_point))
    found = None
    with open("/proc/self/mountinfo", "rb") as info:
        for line in info:
            fields = line.split()
            if len(fields) > 4 and _unescape(fields[4]) == target:
                tail = line.split(b" - ", 1)[1].split()
                found = tail[1].decode(errors="replace") if len(tail) > 1 else None
    return found


def _unescape(field: bytes) -> bytes:
    return re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m.group(1), 8)]), field)


class NamespaceDisks:
    """Each namespace's volume: its quota (``default``, or the operator's override stored in the data dir), made,
    mounted, grown, measured and unmounted. Thread-safe: the pool prepares workers in threads."""

    def __init__(self, data_dir: Path, default: DiskQuota | None = None, table: LimitTable | None = None) -> None:
        self.data_dir = data_dir
        self.default = default
        self._lock = threading.Lock()
        #: The operator's overrides: the data dir's file, or the shared database's table.
        self.table: LimitTable = table if table is not None else JsonLimitFile(data_dir / DISK_QUOTAS_FILE)

    # -- quotas ------------------------------------------------------------------------------

    def overrides(self) -> dict[str, DiskQuota]:
        """The operator's per-namespace quotas (``namespace disk set``)."""
        try:
            raw = self.table.load()
            return {name: DiskQuota.parse(str(text)) for name, text in raw.items()}
        except (OSError, ValueError, LimitTableUnreadable, NamespaceStateUnavailable) as exc:
            raise DiskQuotaError(f"{self.table.location} cannot be read ({exc}); fix or remove it") from exc

    def set_override(self, namespace: str, quota: DiskQuota | None) -> None:
        """Store (or with None remove) a namespace's own quota; it applies when its volume is next prepared."""
        Namespace.parse(namespace)
        try:
            self.table.store(namespace, None if quota is None else str(quota))
        except (LimitTableUnreadable, NamespaceStateUnavailable) as exc:
            raise DiskQuotaError(f"{self.table.location} cannot be written ({exc})") from exc

    def quota_for(self, namespace: str) -> DiskQuota | None:
        return self.overrides().get(namespace, self.default)

    @property
    def enabled(self) -> bool:
        return self.default is not None or bool(self.overrides())

    # -- places ------------------------------------------------------------------------------

    def volume(self, namespace: Namespace) -> Path:
        return self.data_dir / VOLUMES_DIR / namespace.safe_name

    def image(self, namespace: Namespace) -> Path:
        return self.data_dir / VOLUMES_DIR / f"{namespace.safe_name}.img"

    def workspaces(self, namespace: str) -> Path | None:
        """Where the namespace's default session workspaces go: on its volume when it has a quota, else None
        (the data dir's shared ``workspaces/``)."""
        if self.quota_for(namespace) is None:
            return None
        return self.volume(Namespace.parse(namespace)) / "workspaces"

    # -- mounting ----------------------------------------------------------------------------

    def ensure(self, namespace: Namespace, *, move_files_in: bool = True) -> Path | None:
        """The namespace's volume made, grown to its quota and mounted, with its tree bind-mounted over
        ``namespaces/<safe>``: the volume's root, or None when the namespace has no quota. Idempotent.
        ``DiskQuotaError``.

        ``move_files_in=False``: when a new volume would take over files the namespace already has (its worker may
        be running on them), leave it for the next worker start (``prepare_launch``) and return None."""
        quota = self.quota_for(namespace.name)
        if quota is None and not self.image(namespace).exists():
            return None  # (a volume whose quota was dropped is still mounted, as it is: its files are there)
        if (reason := disk_unsupported()) is not None:
            raise DiskQuotaError(f"namespace {namespace.name} has a disk quota ({quota or 'its volume'}) but {reason}")
        with self._lock:
            volume, image, root = self.volume(namespace), self.image(namespace), namespace.root(self.data_dir)
            self.data_dir.mkdir(parents=True, mode=0o700, exist_ok=True)
            (self.data_dir / VOLUMES_DIR).mkdir(mode=0o700, exist_ok=True)
            # mount(8) follows symlinks: one planted at any of these would put a tenant's volume (or the image it
            # mounts) anywhere on the host. Refused before anything is mounted.
            _refuse_symlinks(namespace, root.parent, root, self.data_dir / VOLUMES_DIR, volume, image,
                             volume / "namespace", volume / "workspaces")
            if not os.path.ismount(volume):
                if quota is not None and not image.exists():
                    if not move_files_in and root.is_dir() and any(root.iterdir()):
                        return None
                    self._create(namespace, quota)
                volume.mkdir(mode=0o700, exist_ok=True)
                _check(f"mounting {image} at {volume}", _run("mount", "-o", _MOUNT_OPTIONS, str(image), str(volume)))
            try:
                if quota is not None:
                    self._grow(image, volume, quota)
            except DiskQuotaError as exc:  # it keeps its old size meanwhile: not a reason to stop the namespace
                if not os.path.ismount(volume):  # (unless it could not be mounted again)
                    raise
                log.warning("namespace %s: its volume stays at its old size: %s", namespace.name, exc)
            for name in ("namespace", "workspaces"):
                (volume / name).mkdir(mode=0o700, exist_ok=True)
            os.chmod(volume, 0o711)
            os.chmod(volume / "workspaces", 0o711)
            root.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            root.mkdir(mode=0o700, exist_ok=True)
            if not os.path.ismount(root):
                _check(f"mounting {volume / 'namespace'} over {root}",
                       _run("mount", "--bind", str(volume / "namespace"), str(root)))
            return volume

    def _create(self, namespace: Namespace, quota: DiskQuota) -> None:
        """A new image, holding whatever the namespace already had on the host disk (moved in whole, or not at
        all: ``DiskQuotaError`` with what it takes)."""
        image, root = self.image(namespace), namespace.root(self.data_dir)
        fresh = image.with_name(image.name + ".new")
        fresh.unlink(missing_ok=True)
        fd = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:  # 0600: other tenants' uids may pass through volumes/ (0711) by name
            os.ftruncate(fd, quota.bytes)  # sparse
        except OSError as exc:  # EFBIG: the host's file system takes no file that large
            fresh.unlink(missing_ok=True)
            raise DiskQuotaError(f"cannot make {image} of {quota}: {exc.strerror or exc}; give a smaller quota "
                                 f"(codesdk-supervisor namespace disk set {namespace.name} SIZE)") from exc
        finally:
            os.close(fd)
        try:
            _check(f"making the file system of {image}",
                   _run("mkfs.ext4", "-q", "-F", "-m", "0", "-N", str(quota.inodes), "-E", "root_owner=0:0",
                        "-L", "codesdk-ns", str(fresh)))
            had = root.is_dir() and not os.path.ismount(root) and any(root.iterdir())
            if had:
                self._copy_in(namespace, quota, fresh, root)
            os.replace(fresh, image)
        except BaseException:
            fresh.unlink(missing_ok=True)
            raise
        if had:  # the copy is whole and durable in the image: the originals leave the host disk
            for entry in list(root.iterdir()):
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
        log.info("namespace %s: made its volume %s (%s)", namespace.name, image, quota)

    def _copy_in(self, namespace: Namespace, quota: DiskQuota, fresh: Path, root: Path) -> None:
        staging = fresh.with_name(fresh.name + ".mnt")
        staging.mkdir(mode=0o700, exist_ok=True)
        _check(f"mounting {fresh}", _run("mount", "-o", _MOUNT_OPTIONS, str(fresh), str(staging)))
        try:
            (staging / "namespace").mkdir(mode=0o700)
            copied = _run("cp", "-a", "--", f"{root}/.", str(staging / "namespace"))
            if copied.returncode != 0:
                held = _run("du", "-sh", "--", str(root)).stdout.split("\t")[0] or "?"
                files = sum(len(dirs) + len(names) for _, dirs, names in os.walk(root))
                why = (copied.stderr.strip().splitlines() or ["the copy failed"])[-1]
                raise DiskQuotaError(
                    f"namespace {namespace.name}'s existing files ({held}, {files} files in {root}) do not fit its "
                    f"disk quota {quota} ({why}); nothing was moved: raise it with "
                    f"`codesdk-supervisor namespace disk set {namespace.name} SIZE[:FILES]`")
            os.sync()
        finally:
            _run("umount", str(staging))
            staging.rmdir()

    def _grow(self, image: Path, volume: Path, quota: DiskQuota) -> None:
        """Grow the image online to a raised quota (a lower one is kept until the operator shrinks it by hand)."""
        size = image.stat().st_size
        if quota.bytes <= size:
            if quota.bytes < size:
                log.warning("volume %s is %s, above its quota %s: shrinking is not done online", image, _mib(size),
                            quota)
            return
        device = _mount_source(volume)
        if device is None or not device.startswith("/dev/loop"):
            raise DiskQuotaError(f"cannot grow {image}: no loop device is mounted at {volume}")
        try:
            with open(image, "r+b") as out:
                out.truncate(quota.bytes)
        except (OSError, OverflowError) as exc:  # the host's file system takes no file that large
            raise DiskQuotaError(f"cannot grow {image} to {quota}: {exc}") from exc
        _check(f"growing {device}", _run("losetup", "-c", device))
        online = _run("resize2fs", device)
        if online.returncode != 0:  # online resizing needs CAP_SYS_RESOURCE: offline, if nothing uses it
            log.info("volume %s: online resize failed (%s); resizing it unmounted", image, online.stderr.strip())
            try:
                self._grow_offline(image, volume)
            except DiskQuotaError:
                if not os.path.ismount(volume):
                    raise
                with open(image, "r+b") as out:  # still mounted at its old size: tried again at the next start
                    out.truncate(size)
                _run("losetup", "-c", device)
                raise
        log.info("volume %s grown to %s", image, _mib(quota.bytes))

    def _grow_offline(self, image: Path, volume: Path) -> None:
        root = Namespace.parse(_namespace_name(volume.name)).root(self.data_dir)
        for point in (root, volume):
            if os.path.ismount(point):
                done = _run("umount", str(point))
                if done.returncode != 0:
                    raise DiskQuotaError(f"cannot grow {image} now: {point} is in use ({done.stderr.strip()}); it "
                                         "grows at a later start when nothing holds it")
        _check(f"checking {image}", _run("e2fsck", "-f", "-p", str(image)))
        _check(f"growing the file system of {image}", _run("resize2fs", str(image)))
        _check(f"mounting {image} at {volume}", _run("mount", "-o", _MOUNT_OPTIONS, str(image), str(volume)))

    def usage(self, namespace: str) -> DiskUsage | None:
        """The namespace's volume fill, or None when it has none mounted."""
        try:
            volume = self.volume(Namespace.parse(namespace))
        except InvalidNamespace:
            return None
        if not os.path.ismount(volume):
            return None
        return DiskUsage.of(volume)

    def mounted(self) -> list[Namespace]:
        """The namespaces whose volumes are mounted now (found under ``volumes/``)."""
        base = self.data_dir / VOLUMES_DIR
        if not base.is_dir():
            return []
        found = []
        for entry in sorted(base.iterdir()):
            if entry.is_dir() and os.path.ismount(entry):
                try:
                    found.append(Namespace.parse(_namespace_name(entry.name)))
                except InvalidNamespace:
                    continue
        return found

    def unmount_all(self) -> None:
        """Unmount every volume this data dir has mounted (lazily where still busy: it goes when its last user
        does). At shutdown."""
        with self._lock:
            for namespace in self.mounted():
                for point in (namespace.root(self.data_dir), self.volume(namespace)):
                    if os.path.ismount(point):
                        _unmount(point)


def _namespace_name(safe_name: str) -> str:
    """``Namespace.safe_name`` undone: the first '.' was the ':' (kinds have no '.')."""
    return safe_name if safe_name == "default" else safe_name.replace(".", ":", 1)


def _unmount(point: Path) -> None:
    done = _run("umount", str(point))
    if done.returncode != 0:
        busy = "busy" in done.stderr
        lazy = _run("umount", "-l", str(point))
        if lazy.returncode != 0:
            log.error("cannot unmount %s: %s", point, lazy.stderr.strip())
        elif busy:
            log.warning("%s was busy: unmounted lazily (it goes when its last user does)", point)


def is_disk_full(exc: OSError) -> bool:
    return exc.errno in (errno.ENOSPC, errno.EDQUOT)


def _refuse_symlinks(namespace: Namespace, *paths: Path) -> None:
    """``DiskQuotaError`` naming the first of ``paths`` that is a symlink (absent ones are fine: they are made)."""
    for path in paths:
        if path.is_symlink():
            raise DiskQuotaError(f"{path} is a symlink; refusing to mount namespace {namespace.name}'s volume "
                                 "through it: remove it (the volume's files are in its image)")
