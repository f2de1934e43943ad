"""PostgreSQL connections for the store (psycopg 3): the ``Db`` the SQL core runs on, and its errors.

Every connection runs in autocommit mode and the writer issues BEGIN/COMMIT itself, as it does on SQLite, so one
``run_batch`` serves both engines. A connection that broke (the server restarted, the network dropped) is
replaced before the next transaction or read (``ready``), never in the middle of one: a transaction cut off is
failed as a whole and nothing of it is acknowledged.

The location shown in messages and logs is the URL without its password (``redacted``).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from ._db import Rows
from ._errors import DatabaseError, StoreClosed, StoreError, translate
from ._fencing import Fence

#: The channel a commit's appended sessions are announced on (payload: "<origin> <session id>").
CHANNEL = "codesdk_events"
#: Seconds a connection attempt may take before the store reports the database unreachable.
CONNECT_TIMEOUT_S = 5


def redacted(url: str) -> str:
    """``url`` as it may be shown: every part but the password (``postgresql://user@host:port/db``)."""
    try:
        parts = conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "postgresql://(an unreadable URL)"
    user = f"{parts['user']}@" if parts.get("user") else ""
    host = str(parts.get("host") or "")
    port = f":{parts['port']}" if parts.get("port") else ""
    shown = f"postgresql://{user}{host if '/' not in host else ''}{port}/{parts.get('dbname') or ''}"
    return shown + (f"?host={host}" if "/" in host else "")


def check_url(url: str) -> str:
    """``url`` if psycopg can read it, else ``StoreError`` (naming it without its password)."""
    try:
        conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        # (not libpq's reason: it quotes the token it could not read, which may be the password)
        raise StoreError(f"{redacted(url)} is not a PostgreSQL URL psycopg can read (look for a stray '%' or space, "
                         "or an IPv6 host without [brackets]); expected postgresql://USER[:PASSWORD]@HOST[:PORT]/DBNAME "
                         "or ?host=/socket/dir") from None
    return url


@functools.lru_cache(maxsize=512)
def _placeholders(sql: str) -> str:
    """The core's ``?`` placeholders as psycopg's ``%s`` (the core's SQL has no ``?`` or ``%`` of its own)."""
    return sql.replace("%", "%%").replace("?", "%s")


_PLAIN_INSERT = re.compile(r"INSERT INTO (\w+)\(([\w, ]+)\) VALUES \((\?(?:, \?)*)\)")


@functools.lru_cache(maxsize=64)
def _copy_of(sql: str) -> str | None:
    """The COPY that stores the rows of ``sql`` if it is a plain insert of one row's values (no ``ON CONFLICT``,
    no ``RETURNING``, a placeholder per column), else None."""
    match = _PLAIN_INSERT.fullmatch(sql.strip())
    if match is None or match[2].count(",") != match[3].count(","):
        return None
    return f"COPY {match[1]}({match[2]}) FROM STDIN"


class PostgresDb:
    """One psycopg connection, (re)made on demand; used by one thread at a time."""

    for_update = " FOR UPDATE"
    text_position = "strpos"

    def __init__(self, url: str, location: str, origin: str, settings: Mapping[str, str] | None = None) -> None:
        self._url = url
        #: server settings of this connection's sessions (``-c name=value``), e.g. the writer's idle-transaction bound
        self._settings = dict(settings or {})
        self.location = location
        self._origin = origin  # who the announcements come from: a store skips its own
        self._conn: psycopg.Connection[Any] | None = None
        self._closed = False
        #: the fence of the write running on this connection (``_fencing``; set by the store for that write)
        self.fence: Fence | None = None

    @property
    def conn(self) -> psycopg.Connection[Any]:
        if self._conn is None:
            raise psycopg.OperationalError("not connected")
        return self._conn

    def ready(self) -> None:
        if self._closed:
            raise StoreClosed(f"using the database at {self.location}")
        conn = self._conn
        if conn is not None and not conn.closed and not conn.broken:
            return
        self._conn = None
        if conn is not None:
            conn.close()
        self._conn = connect(self._url, self._settings)

    def lost_connection(self, exc: BaseException) -> bool:
        return isinstance(exc, psycopg.OperationalError) and (self._conn is None or self._conn.broken)

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Rows:
        return self.conn.execute(_placeholders(sql), tuple(params))

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        """A plain ``INSERT INTO t(columns) VALUES (?, …)`` goes as one COPY (no row of it is sent as a statement of
        its own: 29 µs a row with ``executemany`` against a few with COPY, which checks the same constraints);
        any other statement as psycopg's pipelined ``executemany``."""
        copy = _copy_of(sql)
        with self.conn.cursor() as cursor:
            if copy is None:
                cursor.executemany(_placeholders(sql), rows)
                return
            with cursor.copy(copy) as into:
                for row in rows:
                    into.write_row(row)

    def scalar(self, sql: str, params: Sequence[Any] = ()) -> Any:
        row = self.conn.execute(_placeholders(sql), tuple(params)).fetchone()
        return None if row is None else row[0]

    def begin(self) -> None:
        """BEGIN; a connection found dead here (the server restarted since it was last used) is replaced once:
        nothing of the transaction was sent yet."""
        try:
            self.conn.execute("BEGIN")
        except psycopg.OperationalError as exc:
            if not self.lost_connection(exc):
                raise
            self.ready()
            self.conn.execute("BEGIN")

    def announce(self, sessions: Collection[str]) -> None:
        if sessions:
            self.conn.execute("SELECT pg_notify(%s, %s || ' ' || s) FROM unnest(%s::text[]) AS s",
                              (CHANNEL, self._origin, sorted(sessions)))

    def commit(self) -> None:
        self.conn.execute("COMMIT")

    def rollback(self) -> None:
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            return  # the server ended the transaction with the connection
        if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            try:
                conn.execute("ROLLBACK")
            except psycopg.Error:
                conn.close()  # in no state to be reused; ``ready`` makes another

    def translate(self, exc: BaseException, where: str) -> BaseException:
        return translate_pg(exc, where, self.location)

    def close(self) -> None:
        self._closed = True
        if self._conn is not None:
            self._conn.close()
            self._conn = None


#: How a TCP connection to the server that went dead (a host lost, a network cut) is noticed, where the URL does not
#: say otherwise: keepalive probes on an idle connection, and a bound on data the server leaves unacknowledged.
#: Without them a call waits forever in its thread, which trio cannot cancel. (Unix sockets ignore them.)
DEAD_PEER_PARAMS = {"keepalives": "1", "keepalives_idle": "5", "keepalives_interval": "2", "keepalives_count": "3",
                    "tcp_user_timeout": "15000"}


def connect(url: str, settings: Mapping[str, str] | None = None) -> psycopg.Connection[Any]:
    params = {**DEAD_PEER_PARAMS, **conninfo_to_dict(url)}
    if settings:  # after the URL's own options (a search_path, say)
        params["options"] = " ".join([str(params.get("options") or ""),
                                      *(f"-c {name}={value}" for name, value in settings.items())]).strip()
    return psycopg.connect(make_conninfo("", **params), autocommit=True, connect_timeout=CONNECT_TIMEOUT_S,
                           application_name="codesdk-supervisor")


#: SQLSTATE classes that mean the server or its storage failed, not the request: 08 connection, 53 resources
#: (disk full, out of memory), 57 operator intervention (shutdown, crash recovery), 58 system (I/O), XX internal.
_STORAGE_CLASSES = ("08", "53", "57", "58", "XX")


def translate_pg(exc: BaseException, where: str, location: str) -> BaseException:
    """The store's error for ``exc``; psycopg's become ``DatabaseError`` naming the database and what to do."""
    if not isinstance(exc, psycopg.Error):
        return translate(exc, where)  # StoreError passes; OS errors get their file
    state = exc.sqlstate or _connect_state(exc)
    if state[:2] == "28":
        hint = (f"PostgreSQL at {location} refused the credentials; check the user and the password (given by "
                "PGPASSWORD or ~/.pgpass, never on the command line) and pg_hba.conf")
        storage_fault = False
    elif state == "3D000":
        hint = f"there is no such database at {location}; create it (createdb -O USER NAME) or fix the URL"
        storage_fault = False
    elif (isinstance(exc, psycopg.OperationalError) and not state) or state[:2] in _STORAGE_CLASSES:
        hint = (f"PostgreSQL at {location} is unreachable or failed; check that it runs and accepts this "
                "supervisor's connections; what failed was not stored (a running supervisor goes on by itself once "
                "the database is back)")
        storage_fault = True
    elif isinstance(exc, pg_errors.ReadOnlySqlTransaction):
        hint = f"PostgreSQL at {location} is read-only (a standby?); point --store at the primary"
        storage_fault = True
    elif isinstance(exc, psycopg.IntegrityError):
        hint = "an integrity constraint failed (this is a bug in the caller or the store)"
        storage_fault = False
    elif isinstance(exc, pg_errors.InsufficientPrivilege):
        hint = f"the database user may not do this at {location}; grant it ownership of CodeSDK's tables"
        storage_fault = False
    else:
        hint = "unexpected PostgreSQL error"
        storage_fault = False
    error = DatabaseError(f"{where}: {hint} (postgresql: {first_line(exc)})", storage_fault=storage_fault)
    error.__cause__ = exc
    return error


def _connect_state(exc: psycopg.Error) -> str:
    """The SQLSTATE a refused connection carries only in its message (psycopg gives none): 28… bad credentials,
    3D000 no such database."""
    text = str(exc)
    if "password authentication failed" in text or "no pg_hba.conf entry" in text or (
            "role" in text and "does not exist" in text):
        return "28000"
    if "database" in text and "does not exist" in text:
        return "3D000"
    return ""


def first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
