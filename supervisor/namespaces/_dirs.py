"""A namespace's private directories (home/, config/, state/, cache/, data/, tmp/), made and tightened through
descriptors, so a tenant that owns its tree cannot redirect the supervisor's chmod/chown with a symlink."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ._files import make_dir, open_dir
from ._data_dir import tighten_data_dir
from ._names import InvalidNamespace, Namespace
from ._uids import Identity, UidRange, hand_over_dir, namespace_identity

SUBDIRS = ("home", "config", "state", "cache", "data", "tmp")


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
                    hand_over_dir(root_fd, identity)
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
        make_dir(path, dir_fd, 0o700)
    try:
        fd = open_dir(path, dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP and os.path.islink(shown):
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
