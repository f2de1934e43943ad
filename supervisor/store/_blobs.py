"""Content-addressed blob files under ``<data_dir>/blobs/sha256/<2 hex>/<62 hex>`` (blocking; run in threads).

A blob is written to a temp file in its final directory, fsynced and renamed into place, so a reader sees
either nothing or the whole blob; writing the same bytes twice is a no-op. Reads re-hash the bytes, so a
damaged file is reported (``BlobCorrupt``) instead of being served.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from codesdk.protocol import HASH_PREFIX, is_hash, sha256_hex

from ._errors import BlobCorrupt, BlobNotFound, InvalidBlobRef


def check_ref(ref: object) -> str:
    if not isinstance(ref, str) or not is_hash(ref):
        raise InvalidBlobRef(ref)
    return ref


class BlobFiles:
    def __init__(self, root: Path, *, fsync: bool = True) -> None:
        self.root = root  # <data_dir>/blobs
        self._fsync = fsync

    def path(self, ref: str) -> Path:
        digest = check_ref(ref)[len(HASH_PREFIX):]
        return self.root / "sha256" / digest[:2] / digest[2:]

    def put(self, data: bytes, ref: str | None = None) -> tuple[str, bool]:
        """Store ``data`` (whose ref is ``ref``, when the caller has hashed it already); return its ref and whether
        a new file was written."""
        ref = ref or sha256_hex(data)
        target = self.path(ref)
        if target.exists():
            return ref, False
        new_shard = not target.parent.is_dir()
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, temp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                if self._fsync:
                    os.fsync(handle.fileno())
            os.replace(temp, target)  # atomic; a concurrent writer of the same bytes is harmless
        except BaseException:
            Path(temp).unlink(missing_ok=True)
            raise
        if self._fsync:
            _fsync_dir(target.parent)
            if new_shard:
                _fsync_dir(target.parent.parent)
        return ref, True

    def get(self, ref: str) -> bytes:
        path = self.path(ref)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise BlobNotFound(ref) from None
        actual = HASH_PREFIX + hashlib.sha256(data).hexdigest()
        if actual != ref:
            raise BlobCorrupt(ref, str(path), actual)
        return data

    def exists(self, ref: str) -> bool:
        return self.path(ref).is_file()

    def remove(self, ref: str) -> None:
        """Unlink the blob's file (gone already: nothing to do)."""
        self.path(ref).unlink(missing_ok=True)

    def size(self, ref: str) -> int:
        try:
            return self.path(ref).stat().st_size
        except FileNotFoundError:
            raise BlobNotFound(ref) from None


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
