"""One writer per data dir: an exclusive ``flock`` on ``<data-dir>/supervisor.lock`` for the writer's lifetime.

Two supervisors writing one store (a second service, or ``codesdk run`` beside the service) would each take the
other's running tasks for ones a dead process left behind and fail them. The kernel drops a flock when its holder
dies, however it dies, so a stale lock never blocks a restart. The holder writes who it is into the file (pid,
command, the addresses its API listens on), so whoever finds the data dir busy can name the holder and, where it
serves an API, talk to it instead. Readers need no lock: SQLite's WAL lets them read beside the writer.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ._errors import StoreError
from ._time import now_text

LOCK_FILENAME = "supervisor.lock"
#: Bytes of the lock file read back; what a holder writes is far smaller.
_MAX_INFO_BYTES = 64 * 1024


@dataclass(frozen=True)
class LockHolder:
    """Who holds a data dir: as it wrote itself into the lock file."""

    pid: int
    command: str
    api: tuple[str, ...] = field(default_factory=tuple)  # "unix:/path/api.sock", "http://127.0.0.1:PORT"
    started_at: str = ""

    def describe(self) -> str:
        return f"{self.command} (pid {self.pid})"


class DataDirBusy(StoreError):
    """Another process holds the data dir's writer lock. ``holder`` says who, when it could be read."""

    def __init__(self, data_dir: Path, holder: LockHolder | None) -> None:
        self.data_dir = data_dir
        self.holder = holder
        who = holder.describe() if holder is not None else "another process (its pid could not be read)"
        served = f"; it serves the API at {', '.join(holder.api)}" if holder is not None and holder.api else ""
        super().__init__(
            f"the data dir {data_dir} is in use by {who}{served}: only one supervisor may write it. Use that "
            f"supervisor's API (--url … with a token), wait for it to end, or pass another --data-dir")


class DataDirLock:
    """The held lock. Create with ``DataDirLock.acquire``; the kernel releases it if the process dies."""

    def __init__(self, path: Path, fd: int, holder: LockHolder) -> None:
        self.path = path
        self._fd: int | None = fd
        self.holder = holder

    @classmethod
    def acquire(cls, data_dir: Path, command: str) -> DataDirLock:
        """Take the lock without waiting (``DataDirBusy`` if it is held) and write who holds it."""
        path = Path(data_dir) / LOCK_FILENAME
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise DataDirBusy(Path(data_dir), current_holder(data_dir)) from None
            raise
        lock = cls(path, fd, LockHolder(pid=os.getpid(), command=command, started_at=now_text()))
        lock._write()
        return lock

    def announce(self, api: Sequence[str]) -> None:
        """Record where the holder's API listens, for the CLI to find it."""
        self.holder = LockHolder(self.holder.pid, self.holder.command, tuple(api), self.holder.started_at)
        self._write()

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # closing the only descriptor drops the flock

    def _write(self) -> None:
        assert self._fd is not None
        info = {"pid": self.holder.pid, "command": self.holder.command, "api": list(self.holder.api),
                "started_at": self.holder.started_at}
        data = json.dumps(info).encode()
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, data, 0)


def current_holder(data_dir: Path) -> LockHolder | None:
    """Who holds the data dir's lock now; None if nobody does (or the file can't be read)."""
    path = Path(data_dir) / LOCK_FILENAME
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                return None
        else:
            return None  # nobody holds it: what the file says is a dead holder's
        info = json.loads(os.pread(fd, _MAX_INFO_BYTES, 0) or b"null")
        return LockHolder(pid=int(info["pid"]), command=str(info["command"]),
                          api=tuple(str(a) for a in info.get("api") or ()), started_at=str(info.get("started_at", "")))
    except (OSError, ValueError, TypeError, KeyError):
        return None
    finally:
        os.close(fd)
