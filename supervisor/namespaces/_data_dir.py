"""The data dir's own modes: closed to other users, since the store and every tenant's files live below it."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

log = logging.getLogger("codesdk.supervisor.namespaces")


class UnsafeDataDir(RuntimeError):
    """The data dir is open to other users and we cannot close it."""


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


def tighten_data_dir(data_dir: Path) -> None:
    """Close every top-level entry of the data dir to group and others, but the passages to the tenants' own
    directories: ``namespaces/`` (``prepare_dirs`` sets it) and ``workspaces/`` (and ``ephemeral/``) when 0711.

    With a uid range the data dir is 0711, so anything in it is reachable by name: the store, blobs and
    token files must then not rely on the umask they were created with. ``workspaces/`` is made 0711 when a
    session's default workspace in it is given to a namespace (``give_workspace``); closing it again would cut
    that namespace's worker off from its own workspace (each is 0700 and its namespace's; the session ids that
    name them are not listable).
    """
    for entry in os.scandir(data_dir):
        if entry.name == "namespaces" or entry.is_symlink():
            continue
        mode = stat.S_IMODE(entry.stat(follow_symlinks=False).st_mode)
        # volumes/: namespaces' disks (``_disk``); ephemeral/: ephemeral sessions' HOMEs (``_sessions``)
        if entry.name in ("workspaces", "volumes", "ephemeral") and mode == 0o711:
            continue
        if mode & 0o077:
            os.chmod(entry.path, mode & 0o700, follow_symlinks=True)
