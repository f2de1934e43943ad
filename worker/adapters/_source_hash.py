"""The hash an implicit source is recorded with: of a regular file the worker's user owns the reading of, never
through a symlink (a workspace's ``CLAUDE.md -> /etc/shadow`` would hand a tenant the hash of a file it cannot read)
and never of more than ``MAX_HASHED_BYTES`` (an instruction file is small; a huge one is named, not read)."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from codesdk.protocol import HASH_PREFIX

#: Above this a found file is named without a hash.
MAX_HASHED_BYTES = 4 << 20
_CHUNK = 1 << 16


def source_sha256(path: Path) -> str | None:
    """``sha256:<hex>`` of the file at ``path``; None for a symlink, anything but a regular file, one larger than
    ``MAX_HASHED_BYTES`` or one that cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None  # a symlink (ELOOP), gone, or not ours to read
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
