"""PostgreSQL connections for the store (psycopg 3): the ``Db`` the SQL core runs on, and its errors.

Every connection runs in autocommit mode and the writer issues BEGIN/COMMIT itself, as it does on SQLite, so one
``run_batch`` serves both engines. The writer's transactions are pipelined (``begin(pipelined=True)``): statements
whose results nobody reads are sent without waiting for their answers, so a lone append costs two round trips (the
locked read of the session, then everything else with the COMMIT) instead of one per statement.

A connection that broke (the server restarted, the network dropped) is replaced before the next transaction or read
(``ready``), never in the middle of one: a transaction cut off is failed as a whole and nothing of it is
acknowledged.

The location shown in messages and logs is the URL without its password (``redacted``).
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from ._db import Rows
from ._errors import DatabaseError, StoreClosed, StoreError, translate
from ._fencing import SUPERVISOR_APPLICATION, Fence

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


#: From this many rows, a plain insert inside a pipelined transaction leaves the pipeline for one COPY (a round trip
#: more, then the server's multi-row insert); below it, the rows go as one ``INSERT … SELECT FROM unnest`` queued with
#: the rest. (Measured through the store, docs/performance.md: COPY wins from about a hundred rows.)
COPY_FROM_ROWS = 100


@functools.lru_cache(maxsize=64)
def _plain_insert(sql: str) -> tuple[str, tuple[str, ...]] | None:
    """(table, columns) if ``sql`` is a plain insert of one row's values (what ``_copy_of`` takes), else None."""
    if _copy_of(sql) is None:
        return None
    match = _PLAIN_INSERT.fullmatch(sql.strip())
    assert match is not None
    return match[1], tuple(column.strip() for column in match[2].split(","))


def _array_literal(values: Sequence[Any]) -> str | None:
    """``values`` as a PostgreSQL array literal (text form, every element quoted so none reads as NULL), or None if
    one is not a str, an int or None (the caller COPYs such rows instead). The escaping is done on all values
    joined at once (one pass of str.replace, not one per value): NUL, which a text value cannot hold, separates them."""
    if all(type(value) is int for value in values):
        return "{" + ",".join(map(str, values)) + "}"
    if all(value is None or type(value) is int for value in values):
        return "{" + ",".join("NULL" if value is None else str(value) for value in values) + "}"
    if not all(value is None or type(value) is str for value in values):
        return None
    texts = ["" if value is None else value for value in values]
    joined = "\0".join(texts)
    if joined.count("\0") != len(texts) - 1:
        return None  # a NUL of its own would split the value: COPY it, for the server to refuse as ever
    quoted = joined.replace("\\", "\\\\").replace('"', '\\"').split("\0")
    return "{" + ",".join("NULL" if value is None else f'"{text}"' for value, text in zip(values, quoted)) + "}"


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
        #: The pipeline of the transaction under way (``begin(pipelined=True)``), and how to leave it.
        self._pipeline: psycopg.Pipeline | None = None
        self._in_pipeline: contextlib.ExitStack | None = None
        self._column_types: dict[str, dict[str, str]] = {}  # table -> column -> SQL type (for ``unnest``)

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

    @property
    def backend_pid(self) -> int | None:
        """The server process of the current connection (None: not connected)."""
        conn = self._conn
        return None if conn is None or conn.closed else conn.info.backend_pid

    def lost_connection(self, exc: BaseException) -> bool:
        return isinstance(exc, psycopg.OperationalError) and (self._conn is None or self._conn.broken)

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Rows:
        return self.conn.execute(_placeholders(sql), tuple(params))

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        """A plain ``INSERT INTO t(columns) VALUES (?, …)`` goes as one COPY (no row of it is sent as a statement of
        its own: 29 µs a row with ``executemany`` against a few with COPY, which checks the same constraints); inside
        a pipeline, where COPY cannot run, fewer than COPY_FROM_ROWS rows go as one ``INSERT … SELECT FROM unnest``
        queued with the rest, more leave the pipeline for their COPY. Any other statement goes as psycopg's
        pipelined ``executemany``."""
        copy = _copy_of(sql)
        if copy is not None and self._pipeline is not None:
            rows = list(rows)
            if len(rows) < COPY_FROM_ROWS and self._insert_unnested(sql, rows):
                return
            self._leave_pipeline()  # a round trip: the request's earlier statements' errors surface here
            try:
                self._copy(copy, rows)
            finally:
                self._enter_pipeline()
            return
        with self.conn.cursor() as cursor:
            if copy is None:
                cursor.executemany(_placeholders(sql), rows)
                return
            with cursor.copy(copy) as into:
                for row in rows:
                    into.write_row(row)

    def _copy(self, copy: str, rows: Iterable[Sequence[Any]]) -> None:
        with self.conn.cursor() as cursor, cursor.copy(copy) as into:
            for row in rows:
                into.write_row(row)

    def _insert_unnested(self, sql: str, rows: Sequence[Sequence[Any]]) -> bool:
        """Queue ``rows`` of a plain insert as one statement of an array per column; False where a value has no
        array literal (``_array_literal``)."""
        plain = _plain_insert(sql)
        assert plain is not None
        if not rows:
            return True
        literals = [_array_literal(column) for column in zip(*rows)]
        if None in literals:
            return False
        table, columns = plain
        types = self._types_of(table)
        arrays = ", ".join(f"%s::{types[column]}[]" for column in columns)
        self.conn.execute(f"INSERT INTO {table}({', '.join(columns)}) SELECT * FROM unnest({arrays})", literals)
        return True

    def _types_of(self, table: str) -> dict[str, str]:
        """The SQL types of ``table``'s columns, read once (one round trip the first time a table is seen)."""
        types = self._column_types.get(table)
        if types is None:
            types = self._column_types[table] = dict(self.conn.execute(
                "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
                "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped", (table,)).fetchall())
        return types

    def scalar(self, sql: str, params: Sequence[Any] = ()) -> Any:
        row = self.conn.execute(_placeholders(sql), tuple(params)).fetchone()
        return None if row is None else row[0]

    def begin(self, *, pipelined: bool = False) -> None:
        """BEGIN; a connection found dead here (the server restarted since it was last used) is replaced once:
        nothing of the transaction was sent yet. ``pipelined``: the transaction's statements are sent without
        waiting for their answers until a result is read, ``sync``, or ``commit`` (an error surfaces there)."""
        try:
            self._begin(pipelined)
        except psycopg.OperationalError as exc:
            if not self.lost_connection(exc):
                raise
            self._leave_pipeline(quiet=True)
            self.ready()
            self._begin(pipelined)

    def _begin(self, pipelined: bool) -> None:
        if pipelined:  # (sending BEGIN reads what waits on the socket: a connection the server ended shows here)
            self._enter_pipeline()
        self.conn.execute("BEGIN")

    def sync(self, *, quiet: bool = False) -> None:
        """Inside a pipelined transaction: wait for the answers to every statement sent, raising the first error
        among them (``quiet``: none, unless the connection is lost). Outside one, nothing to wait for."""
        if self._pipeline is None:
            return
        try:
            self._pipeline.sync()
        except psycopg.Error:
            if not quiet or self.conn.broken:
                raise

    def _enter_pipeline(self) -> None:
        stack = contextlib.ExitStack()
        self._pipeline = stack.enter_context(self.conn.pipeline())
        self._in_pipeline = stack

    def _leave_pipeline(self, *, quiet: bool = False) -> None:
        """Out of pipeline mode (the transaction goes on): waits for every answer, raising the first error unless
        ``quiet``."""
        stack, self._in_pipeline, self._pipeline = self._in_pipeline, None, None
        if stack is None:
            return
        try:
            stack.close()
        except psycopg.Error:
            if not quiet:
                raise

    def announce(self, sessions: Collection[str]) -> None:
        if sessions:
            self.conn.execute("SELECT pg_notify(%s, %s || ' ' || s) FROM unnest(%s::text[]) AS s",
                              (CHANNEL, self._origin, sorted(sessions)))

    def commit(self) -> None:
        self.conn.execute("COMMIT")
        self._leave_pipeline()  # the answers to everything queued, the COMMIT's last

    def rollback(self) -> None:
        self._leave_pipeline(quiet=True)
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
        self._leave_pipeline(quiet=True)
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def end_stalled_blockers(db: PostgresDb, waiting: int, stalled_s: float) -> int:
    """End the backends that block the ``waiting`` backend and have waited for their own client inside a transaction
    for ``stalled_s``: a supervisor stopped mid-write (SIGSTOP, a hung host), whose locks (a lease row ``FOR SHARE``,
    a session's row) the server's idle-in-transaction timeout does not free when its transaction was pipelined. Only
    supervisors' connections (``SUPERVISOR_APPLICATION``); how many were ended."""
    db.ready()
    return int(db.scalar(
        "SELECT count(*) FILTER (WHERE pg_terminate_backend(a.pid)) FROM pg_stat_activity a "
        "WHERE a.pid = ANY(pg_blocking_pids(?)) AND a.application_name = ? AND a.wait_event_type = 'Client' "
        "AND a.xact_start IS NOT NULL AND a.state_change < now() - make_interval(secs => ?)",
        (waiting, SUPERVISOR_APPLICATION, stalled_s)) or 0)


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
                           application_name=SUPERVISOR_APPLICATION)


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
