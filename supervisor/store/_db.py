"""One database connection as the store's SQL core (``_sql``) uses it, whichever engine is behind it.

The core is written once, in SQL both engines run (``?`` placeholders, ``ON CONFLICT``, ``RETURNING``; tables
ordered by a ``rowid`` column, which PostgreSQL's schema declares as an identity). What differs sits here: how
a write transaction begins, how rows are locked for it, how a broken connection comes back, how commits
are announced to other processes, and how the driver's errors become the store's (``translate``). SQLite's
``Db`` is here; PostgreSQL's is in ``_pg``, imported only when a PostgreSQL store is opened.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import apsw

from ._errors import translate

if TYPE_CHECKING:
    from ._fencing import Fence

BUSY_TIMEOUT_MS = 5_000


class Rows(Protocol):
    """What a query returns: iterable tuples (a cursor of either driver)."""

    def __iter__(self) -> Iterator[Any]: ...

    def fetchall(self) -> list[Any]: ...


class Db(Protocol):
    """A connection used by one thread at a time (the writer's, or one reader's)."""

    #: Added to a SELECT whose rows the transaction must hold until it ends ('' where a write transaction
    #: already holds the whole database, as SQLite's does).
    for_update: str
    #: The SQL function giving the 1-based position of a substring (0: absent), ``f(text, part)``.
    text_position: str
    #: The fence of the write running on it (``_fencing``; None: not fenced, always so on SQLite).
    fence: Fence | None

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Rows: ...

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None: ...

    def scalar(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """The first column of the first row (None when there is no row)."""

    def ready(self) -> None:
        """Before a transaction or a read: reconnect if the connection broke (never inside a transaction)."""

    def lost_connection(self, exc: BaseException) -> bool:
        """Whether ``exc`` means the connection was lost (the server restarted): a read may be repeated on a new
        one, which ``ready`` makes."""

    def begin(self, *, pipelined: bool = False) -> None:
        """Start a write transaction. ``pipelined``: its statements may be sent without waiting for each answer
        (PostgreSQL's pipeline mode), so a statement's error may surface only at the next read of a result, ``sync``
        or ``commit``."""

    def sync(self, *, quiet: bool = False) -> None:
        """Inside a pipelined transaction: wait until every statement sent has been answered, raising the first
        error among them (``quiet``: none, unless the connection is lost)."""

    def announce(self, sessions: Collection[str]) -> None:
        """Inside the write transaction: tell other processes, once it commits, that these sessions got events."""

    def commit(self) -> None: ...

    def rollback(self) -> None:
        """End the transaction without keeping it; quiet when there is none or the connection is gone."""

    def translate(self, exc: BaseException, where: str) -> BaseException:
        """The store's error for a driver's (``StoreError`` subclasses pass through)."""

    def close(self) -> None: ...


class SQLiteDb:
    """An apsw connection (see ``open_connection`` for its pragmas)."""

    for_update = ""
    text_position = "instr"
    fence: Fence | None = None  # one supervisor: nothing to fence

    def __init__(self, conn: apsw.Connection) -> None:
        self.conn = conn

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Rows:
        return self.conn.execute(sql, params)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        self.conn.executemany(sql, rows)

    def scalar(self, sql: str, params: Sequence[Any] = ()) -> Any:
        for row in self.conn.execute(sql, params):
            return row[0]
        return None

    def ready(self) -> None:
        """A file does not disconnect."""

    def lost_connection(self, exc: BaseException) -> bool:
        return False

    def begin(self, *, pipelined: bool = False) -> None:
        self.conn.execute("BEGIN IMMEDIATE")  # the write lock now, not at the first write

    def sync(self, *, quiet: bool = False) -> None:
        """Each statement ran when it was given."""

    def announce(self, sessions: Collection[str]) -> None:
        """Processes sharing a data dir find new events by reading it (their subscriptions look every so often)."""

    def commit(self) -> None:
        self.conn.execute("COMMIT")

    def rollback(self) -> None:
        if self.conn.in_transaction:
            self.conn.execute("ROLLBACK")

    def translate(self, exc: BaseException, where: str) -> BaseException:
        return translate(exc, where)

    def close(self) -> None:
        self.conn.close()


def open_connection(path: str, *, readonly: bool, synchronous: str, vfs: str | None = None) -> apsw.Connection:
    """A connection with the pragmas every store connection needs (WAL, foreign keys, busy timeout)."""
    flags = apsw.SQLITE_OPEN_READONLY if readonly else apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_CREATE
    conn = apsw.Connection(path, flags=flags, vfs=vfs) if vfs else apsw.Connection(path, flags=flags)
    try:
        conn.set_busy_timeout(BUSY_TIMEOUT_MS)
        if not readonly:
            conn.pragma("journal_mode", "WAL")  # persistent: readers opened later see WAL too
        conn.pragma("synchronous", synchronous)
        conn.pragma("foreign_keys", True)
    except BaseException:
        conn.close()
        raise
    return conn
