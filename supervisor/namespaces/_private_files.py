"""Writing the supervisor's own small private files (tokens, uid assignments, namespace variables)."""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def write_private(path: Path, text: str) -> None:
    """Replace ``path`` atomically with a 0600 file holding ``text``: a fresh temp file (never through a symlink),
    fsynced before the rename and the directory after it, so a crash leaves the old file or the new one whole."""
    temp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
