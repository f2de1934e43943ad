"""Per-namespace uids: the configured range, each namespace's identity from it (kept for good), and handing files
to that identity.

Assignments live in ``<data-dir>/worker-uids.json`` and are never removed or reused, so a uid always means the
same tenant and the files it left behind stay its own.
"""

from __future__ import annotations

import fcntl
import grp
import json
import logging
import os
import pwd
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ._files import open_dir, walk_tree, write_private
from ._names import Namespace

#: Where the namespace -> uid assignments live (supervisor-owned, 0600), so they survive restarts.
UIDS_FILE = "worker-uids.json"
_UIDS_LOCK = "worker-uids.lock"
#: uid/gid values the kernel or NFS treat specially (-1 as 32 bits, and "nobody").
_MAX_ID = 2**32 - 2

log = logging.getLogger("codesdk.supervisor.namespaces")


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


def hand_over(root: Path, identity: Identity) -> None:
    """Hand a whole tree to ``identity`` (``hand_over_dir`` of the directory ``root``, opened without following a
    symlink)."""
    fd = open_dir(root)
    try:
        hand_over_dir(fd, identity)
    finally:
        os.close(fd)


def hand_over_dir(fd: int, identity: Identity) -> None:
    """Hand the directory ``fd`` and everything in it to ``identity``: each entry chowned through its directory's
    descriptor, never following a symlink (symlinks are re-owned themselves) — a tenant that swaps a directory for
    a symlink meanwhile cannot redirect the chown outside the tree (``walk_tree``)."""
    for dir_fd, name, _ in walk_tree(fd):
        try:
            os.chown(name, identity.uid, identity.gid, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:  # removed meanwhile
            continue
    os.fchown(fd, identity.uid, identity.gid)


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
