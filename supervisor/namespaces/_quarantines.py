"""Where quarantines are kept: in this process (one host), or in the database every supervisor shares.

A quarantine stops a namespace's workers from starting until it ends or an operator lifts it. Whether one is still in
force is judged by one clock per backend so hosts never disagree: the monotonic clock of this process
(``MemoryQuarantines``), or the database server's ``now()`` (``PostgresQuarantines`` in ``_pg_state``) — never a
host's own wall clock.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Protocol

from ._names import Namespace


@dataclass(frozen=True)
class QuarantineRecord:
    since: float  # Unix time, for people
    until: float  # Unix time, for people
    reason: str


class Quarantines(Protocol):
    def current(self, namespace: str) -> QuarantineRecord | None:
        """The namespace's quarantine if in force now (an expired one is gone)."""
        ...

    def begin(self, namespace: str, seconds: float, reason: str) -> QuarantineRecord:
        """Quarantine the namespace for ``seconds`` from now (replacing any)."""
        ...

    def lift(self, namespace: str) -> bool:
        """End it now; False when none was in force."""
        ...

    def all(self) -> dict[str, QuarantineRecord]:
        """Every quarantine in force."""
        ...


class MemoryQuarantines:
    """This process's quarantines: gone when it exits, judged by its monotonic clock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, tuple[float, QuarantineRecord]] = {}  # namespace -> (monotonic deadline, record)

    def current(self, namespace: str) -> QuarantineRecord | None:
        name = Namespace.parse(namespace).name
        with self._lock:
            held = self._held.get(name)
            if held is None:
                return None
            if time.monotonic() >= held[0]:
                del self._held[name]
                return None
            return held[1]

    def begin(self, namespace: str, seconds: float, reason: str) -> QuarantineRecord:
        name = Namespace.parse(namespace).name
        wall = time.time()
        record = QuarantineRecord(since=wall, until=wall + seconds, reason=reason)
        with self._lock:
            self._held[name] = (time.monotonic() + seconds, record)
        return record

    def lift(self, namespace: str) -> bool:
        with self._lock:
            return self._held.pop(Namespace.parse(namespace).name, None) is not None

    def all(self) -> dict[str, QuarantineRecord]:
        with self._lock:
            names = list(self._held)
        return {name: record for name in names if (record := self.current(name)) is not None}
