"""The event store on PostgreSQL: what a host needs once one machine is not enough (several supervisors, one
database). The embedded default stays SQLite (``EventStore.open``); this opens the same ``EventStore`` over
PostgreSQL connections, so both backends share one SQL core, one writer and one set of semantics.

- **Writes**: one connection and the same group-committing writer as SQLite (``_writer``); seqs are taken by
  an ``UPDATE … RETURNING`` of the session's row inside the inserting transaction, so they stay gap-free even
  when several supervisors write one database. ``synchronous_commit`` is the server's: keep it ``on`` (the
  default) for the promise that an acknowledged event survives a crash of the database.
- **Reads**: a small pool of connections, each reconnecting after the server went away.
- **Live tail**: each commit announces its sessions with NOTIFY; a listener (``_pg_listen``) wakes the local
  subscribers of sessions another supervisor appended to, and the table is read for the events themselves.
- **Blobs**: all of them in the ``blobs`` table, not in files. Every supervisor must read every blob (a task's
  tool output, a transcript, a support bundle) whichever host wrote it; the database already is the one thing
  they all reach, is backed up as a whole, and commits a blob with the row that names it. A directory mounted on
  every host would add a second system whose fsync and locking semantics over the network vary. Blob sizes are
  bounded by the callers (tool outputs and bundles are capped), far below PostgreSQL's 1 GB per value.
"""

from __future__ import annotations

import logging

import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import trio

from codesdk.protocol import UpcasterRegistry
from codesdk.protocol import upcasters as this_builds_upcasters

from ._errors import StoreError
from ._leases import LEASE_S
from ._lock import DataDirLock
from ._readers import ReaderPool, close_all
from ._store import EventStore, lock_data_dir, running
from ._subscribe import Hub
from ._writer import Writer

if TYPE_CHECKING:
    from ._tokens import TokenTable


log = logging.getLogger(__name__)


def is_postgres_url(location: object) -> bool:
    """Whether ``--store`` names a PostgreSQL database rather than a data dir."""
    return isinstance(location, str) and location.startswith(("postgresql://", "postgres://"))


def check_store_url(url: str) -> None:
    """``--store`` names a PostgreSQL database psycopg can read: ``StoreError`` saying what is wrong (never the
    password) before anything is started, rather than once the service runs."""
    if not is_postgres_url(url):  # not echoed: it may be a connection string with a password in it
        raise StoreError("--store (or $CODESDK_STORE) takes a postgresql://USER@HOST/DBNAME URL, and what was given "
                         "does not start with postgresql://; without it the store is SQLite in the data dir")
    _pg_module().check_url(url)


def _pg_module() -> ModuleType:
    """The psycopg half of the backend (``_pg``), or ``StoreError`` saying how to install it: psycopg is an optional
    dependency (``codesdk[postgresql]``)."""
    try:
        from . import _pg
    except ImportError as exc:
        raise StoreError(f"a PostgreSQL store needs psycopg ({exc}): pip install 'codesdk[postgresql]'") from None
    return _pg


def open_token_table(url: str) -> TokenTable:
    """The API tokens table of the PostgreSQL database at ``url``, connected and its schema current (blocking:
    call it from a thread in a trio program). ``StoreError`` when psycopg is missing or the database refuses."""
    _pg_module().check_url(url)
    from ._pg_tokens import PostgresTokenTable

    table = PostgresTokenTable(url)
    try:
        table.open()
    except BaseException:
        table.close()
        raise
    return table


def connect_postgres(url: str) -> Any:
    """A psycopg connection (autocommit, with the store's keepalives) for tables kept beside the store's own:
    the namespaces' variables and limits (``namespaces._pg_state``)."""
    return _pg_module().connect(url)


def redact_store_url(url: str) -> str:
    """``url`` without its password, to name the database in messages."""
    return str(_pg_module().redacted(url))


def migrate_postgres(url: str) -> None:
    """Bring the database's schema up to date, as a supervisor opening it does (for commands that use only
    the tables beside the event store: ``secret-key rotate``, imports)."""
    from . import _pg_schema

    pg = _pg_module()
    db = pg.PostgresDb(url, pg.redacted(url), "codesdk-supervisor " + secrets.token_hex(4))
    try:
        db.ready()
        _pg_schema.migrate(db)
    except Exception as exc:
        raise db.translate(exc, "migrating the database") from exc
    finally:
        db.close()


#: The longest a transaction of a supervisor stopped mid-write (SIGSTOP, a hung host) may hold up others, as a share
#: of the lease: it holds its namespace's lease row (``_fencing``) and session rows, which a takeover and then the new
#: holder's writes wait for. The server's ``idle_in_transaction_session_timeout`` (set to this) is armed only once it
#: answered a Sync, which a pipelined transaction does not send before it commits; so a write blocked this long ends
#: the transactions blocking it that have waited this long for their client (``_pg.end_stalled_blockers``), as a
#: blocked claim does (``_leases.TAKEOVER_WAIT``).
WRITER_IDLE_IN_TRANSACTION = 0.25

#: Seconds an idle subscriber waits for a notice before it reads anyway. Notices wake it (and every subscriber
#: when the listener reconnects): the reads are only the fallback, so they need not cost the database often.
PG_POLL_INTERVAL_S = 5.0


@asynccontextmanager
async def open_postgres(
    url: str,
    *,
    readers: int = 2,
    max_batch: int = 256,
    subscriber_buffer: int = 1024,
    page_size: int = 500,
    upcasters: UpcasterRegistry = this_builds_upcasters,
    poll_interval_s: float = PG_POLL_INTERVAL_S,
    data_dir: Path | None = None,
    holder: str = "a CodeSDK event store writer",
    lease_s: float = LEASE_S,
) -> AsyncIterator[EventStore]:
    """Open (creating or migrating the schema) the store in the PostgreSQL database at ``url``; closing commits
    what is queued. ``StoreError`` when psycopg is missing, the URL can't be read or the database can't be
    reached; ``SchemaTooNew`` when a newer CodeSDK migrated it. ``poll_interval_s``: how long an idle subscriber
    relies on notices alone before it reads anyway. ``data_dir``: the supervisor's own directory, whose lock it holds
    while the store is open (``DataDirBusy`` if another process has it), as a SQLite store's writer does.
    ``lease_s``: the namespace leases' length, which bounds how long the writer may leave a transaction idle
    (``WRITER_IDLE_IN_TRANSACTION``). The other knobs are ``EventStore.open``'s."""
    if min(readers, max_batch, subscriber_buffer, page_size) < 1:
        raise ValueError("readers, max_batch, subscriber_buffer and page_size must be >= 1")
    _pg_module().check_url(url)
    lock = None if data_dir is None else await trio.to_thread.run_sync(lock_data_dir, Path(data_dir), holder)
    try:
        async with _opened(url, lock, readers=readers, max_batch=max_batch, subscriber_buffer=subscriber_buffer,
                           page_size=page_size, upcasters=upcasters, poll_interval_s=poll_interval_s,
                           lease_s=lease_s) as store:
            yield store
    finally:
        if lock is not None:
            lock.release()  # once every write is committed and the connections closed


@asynccontextmanager
async def _opened(url: str, lock: DataDirLock | None, *, readers: int, max_batch: int, subscriber_buffer: int,
                  page_size: int, upcasters: UpcasterRegistry, poll_interval_s: float,
                  lease_s: float) -> AsyncIterator[EventStore]:
    from . import _pg, _pg_listen, _pg_schema  # psycopg is there: open_postgres looked

    location = _pg.redacted(url)
    origin = secrets.token_hex(8)
    idle_ms = max(1, round(lease_s * WRITER_IDLE_IN_TRANSACTION * 1000))
    writer_db = _pg.PostgresDb(url, location, origin, {"idle_in_transaction_session_timeout": str(idle_ms)})
    reader_dbs = [_pg.PostgresDb(url, location, origin) for _ in range(readers)]

    def connect_and_migrate() -> None:
        try:
            writer_db.ready()
            _pg_schema.migrate(writer_db)
        except Exception as exc:
            translated = writer_db.translate(exc, f"opening the event store at {location}")
            if translated is exc:
                raise
            raise translated from exc

    try:
        await trio.to_thread.run_sync(connect_and_migrate)
    except BaseException:
        await trio.to_thread.run_sync(close_all, [writer_db, *reader_dbs])
        raise
    unblocker_db = _pg.PostgresDb(url, location, origin)
    stalled_s = lease_s * WRITER_IDLE_IN_TRANSACTION

    def unblock() -> None:
        """A batch blocked past ``stalled_s``: end the stalled transactions holding it up (``end_stalled_blockers``)."""
        waiting = writer_db.backend_pid
        if waiting is None:
            return
        try:
            ended = _pg.end_stalled_blockers(unblocker_db, waiting, stalled_s)
        except Exception as exc:
            unblocker_db.rollback()
            log.warning("a write is blocked, and what blocks it could not be ended: %s",
                        unblocker_db.translate(exc, "ending a stalled transaction"))
            return
        if ended:
            log.warning("a write was blocked by %d transaction(s) stalled for %g s (a supervisor stopped in the "
                        "middle of a write?): ended them", ended, stalled_s)

    hub = Hub()
    writer = Writer(writer_db, hub.publish, max_batch=max_batch, unblock=(unblock, stalled_s))
    pool = ReaderPool(list(reader_dbs))
    store = EventStore(location, writer, pool, hub, None, subscriber_buffer=subscriber_buffer,
                       page_size=page_size, upcasters=upcasters, poll_interval_s=poll_interval_s, lock=lock)
    listener = _pg_listen.Listener(url, location, [_pg_listen.events_channel(origin, hub)])
    try:
        async with running(store, writer, writer_db, pool, hub, background=[listener]):
            yield store
    finally:
        unblocker_db.close()
