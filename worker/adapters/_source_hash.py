"""The hash an implicit source is recorded with: of a regular file reached without following a symbolic link
anywhere in its path (a workspace's ``CLAUDE.md -> /etc/shadow``, or a ``.claude -> /root/secret`` folder, would
otherwise hand a tenant the hash of a file it cannot read), and never of more than ``MAX_HASHED_BYTES`` (an
instruction file is small; a huge one is named, not read).

Each folder of the path is opened from ``/`` with ``O_NOFOLLOW`` against the one before it, so a link planted
anywhere — even while the walk runs — ends it: the file is named without a hash. (A folder of the operator's that
is itself a link, say a data dir moved elsewhere, costs the hashes of what lies below it, never more.)"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from codesdk.protocol import HASH_PREFIX

#: Above this a found file is named without a hash.
MAX_HASHED_BYTES = 4 << 20
_CHUNK = 1 << 16
_FOLDER = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def source_sha256(path: Path) -> str | None:
    """``sha256:<hex>`` of the file at ``path`` (absolute); None when a link lies anywhere on its path, for anything
    but a regular file, one larger than ``MAX_HASHED_BYTES``, or one that cannot be read."""
    if not path.is_absolute():
        return None
    folder = _open_folder(path.parent)
    if folder is None:
        return None
    try:
        fd = os.open(path.name, _FILE, dir_fd=folder)
    except OSError:
        return None  # a link (ELOOP), gone, or not ours to read
    finally:
        os.close(folder)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_HASHED_BYTES:
            return None
        digest, read = hashlib.sha256(), 0
        while chunk := os.read(fd, _CHUNK):
            read += len(chunk)
            if read > MAX_HASHED_BYTES:  # it grew while being read
                return None
            digest.update(chunk)
        return HASH_PREFIX + digest.hexdigest()
    except OSError:
        return None
    finally:
        os.close(fd)


def _open_folder(folder: Path) -> int | None:
    """A descriptor of ``folder`` reached from ``/`` one folder at a time, none of them a link; None otherwise."""
    fd = os.open("/", _FOLDER)
    for part in folder.parts[1:]:
        try:
            inner = os.open(part, _FOLDER, dir_fd=fd)
        except OSError:  # a link (ELOOP or ENOTDIR), gone, or not searchable
            os.close(fd)
            return None
        os.close(fd)
        fd = inner
    return fd
