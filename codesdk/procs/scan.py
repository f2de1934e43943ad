"""Reading /proc when descriptors may have run out: ``Scans`` retries a scan or says it failed (rate-limited, with what
to do), and never takes "could not look" for "nothing there"; ``stat`` reads one process's state, parent and session.

Standard library only.
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from collections.abc import Callable
from typing import NamedTuple, TypeVar

log = logging.getLogger("codesdk.supervisor.orphans")

#: errnos that mean "no descriptor (or memory) to open /proc with now": a scan is retried or skipped, never
#: taken as "nothing there".
DESCRIPTORS_EXHAUSTED = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM})
#: Seconds between tries of a scan that has to finish when descriptors ran out.
EMFILE_RETRY_S = 0.1
#: Seconds between two warnings of one ``Scans`` about scans that failed (they come in bursts).
WARN_EVERY_S = 10.0

_T = TypeVar("_T")


class Scans:
    """The /proc scans of one owner (the orphan sweep, a pool's workers): retried while descriptors are exhausted,
    and their failures logged at most every ``WARN_EVERY_S``. Thread-safe: scans run in threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last_warning = float("-inf")

    def retrying(self, what: str, scan: Callable[[], _T], *, for_s: float | None) -> _T:
        """``scan()``, tried again (with a warning) while descriptors are exhausted, for up to ``for_s`` seconds
        (None: until it succeeds). Blocks: run it in a thread. Any other OSError, or the last one once the time is
        up, goes to the caller: a scan that could not look never answers "nothing there"."""
        deadline = None if for_s is None else time.monotonic() + for_s
        while True:
            try:
                return scan()
            except OSError as exc:
                if exc.errno not in DESCRIPTORS_EXHAUSTED or (deadline is not None and time.monotonic() > deadline):
                    raise
                self.failed(what, exc)
            time.sleep(EMFILE_RETRY_S)

    def failed(self, what: str, exc: OSError, then: str = "trying again shortly") -> None:
        """Log (at most every ``WARN_EVERY_S``) that a scan failed, what happens next, and what to do."""
        with self._lock:
            now = time.monotonic()
            if now - self._last_warning < WARN_EVERY_S:
                return
            self._last_warning = now
        log.warning("%s failed (%s); %s. If this is EMFILE, raise LimitNOFILE= or lower the API's "
                    "--max-connections", what, exc, then)


class Stat(NamedTuple):
    """What /proc/PID/stat says of a process, from one read, so the fields agree with each other."""

    zombie: bool
    parent: int
    session: int


def stat(pid: int, *, strict: bool = False) -> Stat | None:
    """``pid``'s state, parent and session (also of a zombie); None if it is gone (or, unless ``strict``, if there
    is no descriptor to look with: ``strict`` raises that OSError rather than take the process for gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            fields = file.read().rsplit(b")", 1)[1].split()
        return Stat(zombie=fields[0] == b"Z", parent=int(fields[1]), session=int(fields[3]))
    except OSError as exc:
        if strict and exc.errno in DESCRIPTORS_EXHAUSTED:
            raise
        return None
    except (IndexError, ValueError):
        return None


def session_of(pid: int) -> int | None:
    """The session id of ``pid`` (also of a zombie), from /proc; None if it is gone."""
    found = stat(pid)
    return None if found is None else found.session
