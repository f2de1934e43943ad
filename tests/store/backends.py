"""The store backends the recorder contract runs against.

The contract is every test in tests/store that takes the ``backend`` or ``recorder`` fixture (and the state machine
in ``test_store_stateful``): those tests use only the recorder interfaces (``supervisor.store.Recorder``) and run
once per entry of ``BACKENDS``: SQLite in a data dir of the test's own, PostgreSQL in a fresh database of the
session's throwaway server (``tests/postgres.py``; those runs skip where no server can be started).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypedDict, Unpack

from codesdk.supervisor.store import EventStore, Recorder, Synchronous, open_postgres


class Sizes(TypedDict, total=False):
    """Small sizes a test asks for, so feed overflow, paging and group commit happen within a few events."""

    subscriber_buffer: int  # events a subscriber's feed holds
    page_size: int  # events a subscriber reads at a time
    max_batch: int  # write requests one transaction takes


class Backend(Protocol):
    """One test's store: opened as often as the test likes, over the same data each time."""

    def open(self, **sizes: Unpack[Sizes]) -> AbstractAsyncContextManager[Recorder]:
        """Open the recorder; closing it flushes what was written and a later ``open`` finds it all again.
        A backend without one of the ``sizes`` knobs ignores it."""
        ...

    def subscriber_count(self, recorder: Recorder, session_id: str) -> int:
        """Subscriptions of the session the recorder still holds: one that ended must be released."""
        ...


@dataclass(frozen=True)
class SQLiteBackend:
    """``EventStore`` in a data dir of its own."""

    data_dir: Path
    #: NORMAL keeps the suite fast; FULL (the default) is covered by its own tests.
    synchronous: Synchronous = "NORMAL"

    def open(self, **sizes: Unpack[Sizes]) -> AbstractAsyncContextManager[EventStore]:
        return EventStore.open(self.data_dir, synchronous=self.synchronous, **sizes)

    def subscriber_count(self, recorder: Recorder, session_id: str) -> int:
        assert isinstance(recorder, EventStore)
        return recorder.subscriber_count(session_id)


@dataclass(frozen=True)
class PostgresBackend:
    """``EventStore`` on a PostgreSQL database of its own."""

    url: str

    def open(self, **sizes: Unpack[Sizes]) -> AbstractAsyncContextManager[EventStore]:
        return open_postgres(self.url, **sizes)

    def subscriber_count(self, recorder: Recorder, session_id: str) -> int:
        assert isinstance(recorder, EventStore)
        return recorder.subscriber_count(session_id)


#: Backend name -> factory, given what the test has: a scratch directory, and a function that makes a database
#: on the session's PostgreSQL server (skipping the test where there is none).
BACKENDS: dict[str, Callable[[Path, Callable[[], str]], Backend]] = {
    "sqlite": lambda data_dir, _: SQLiteBackend(data_dir),
    "postgresql": lambda _, new_database: PostgresBackend(new_database()),
}
