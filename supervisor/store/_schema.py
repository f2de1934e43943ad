"""Versioned schema migrations.

``PRAGMA user_version`` holds the schema version (it lives in the database header and is transactional);
``schema_migrations`` keeps a readable history. To change the schema, append a ``Migration`` — never
edit a released one. Opening an older database applies the missing steps in one write transaction, so
a failure leaves it at its old version; a database newer than ``LATEST`` is refused (``SchemaTooNew``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import apsw

from ._db import Db, SQLiteDb
from ._errors import MigrationFailed, SchemaTooNew, StoreError, translate
from ._questions import QUESTIONS_TABLE
from ._webhooks import WEBHOOK_TABLES
from ._sql import hold_named_blobs
from ._time import now_text


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str
    #: Run after ``sql``, in the same transaction: fills what SQL alone cannot (either engine's ``Db``).
    backfill: Callable[[Db], None] | None = None


MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "sessions, tasks, events, blobs",
        """
        CREATE TABLE sessions (
            session_id TEXT PRIMARY KEY,
            runtime TEXT NOT NULL,
            namespace TEXT NOT NULL,
            workspace TEXT,
            created_at TEXT NOT NULL,
            metadata TEXT NOT NULL DEFAULT '{}',
            runtime_session_id TEXT,
            last_seq INTEGER NOT NULL DEFAULT 0 CHECK (last_seq >= 0)
        );
        CREATE TABLE tasks (
            task_id TEXT PRIMARY KEY,
            session_id TEXT NOT NULL REFERENCES sessions(session_id),
            state TEXT NOT NULL
                CHECK (state IN ('pending', 'running', 'completed', 'failed', 'stopped')),
            runtime TEXT NOT NULL,
            created_at TEXT NOT NULL,
            started_at TEXT,
            ended_at TEXT,
            worker_pid INTEGER,
            terminal_type TEXT,
            error TEXT,
            metadata TEXT NOT NULL DEFAULT '{}'
        );
        CREATE INDEX tasks_by_session ON tasks(session_id, created_at);
        CREATE TABLE events (
            session_id TEXT NOT NULL REFERENCES sessions(session_id),
            seq INTEGER NOT NULL CHECK (seq >= 1),
            task_id TEXT,
            type TEXT NOT NULL,
            time TEXT NOT NULL,
            schema_version INTEGER NOT NULL,
            body TEXT NOT NULL,
            PRIMARY KEY (session_id, seq)
        ) WITHOUT ROWID;
        CREATE TABLE blobs (
            ref TEXT PRIMARY KEY,
            size INTEGER NOT NULL CHECK (size >= 0),
            media_type TEXT NOT NULL,
            created_at TEXT NOT NULL
        ) WITHOUT ROWID;
        """,
    ),
    Migration(
        2,
        "events-by-task index, one active task per session",
        """
        CREATE INDEX events_by_task ON events(task_id, seq) WHERE task_id IS NOT NULL;
        CREATE UNIQUE INDEX one_active_task_per_session
            ON tasks(session_id) WHERE state IN ('pending', 'running');
        """,
    ),
    Migration(
        3,
        "durable tool-call approvals",
        """
        CREATE TABLE approvals (
            approval_id TEXT PRIMARY KEY,
            session_id TEXT NOT NULL REFERENCES sessions(session_id),
            task_id TEXT NOT NULL REFERENCES tasks(task_id),
            namespace TEXT NOT NULL,
            tool_call_id TEXT NOT NULL,
            attempt INTEGER NOT NULL,
            tool_name TEXT NOT NULL,
            tool_class TEXT NOT NULL,
            input TEXT NOT NULL,
            reason TEXT NOT NULL,
            state TEXT NOT NULL CHECK (state IN ('pending', 'approved', 'denied', 'expired')),
            created_at TEXT NOT NULL,
            expires_at TEXT NOT NULL,
            decided_at TEXT,
            decided_by TEXT,
            decision_reason TEXT
        );
        CREATE INDEX approvals_pending ON approvals(state, namespace) WHERE state = 'pending';
        """,
    ),
    Migration(
        4,
        "idempotent appends",
        """
        CREATE TABLE appends (
            session_id TEXT NOT NULL REFERENCES sessions(session_id),
            idempotency_key TEXT NOT NULL,
            first_seq INTEGER NOT NULL,
            last_seq INTEGER NOT NULL,
            PRIMARY KEY (session_id, idempotency_key)
        ) WITHOUT ROWID;
        """,
    ),
    Migration(
        5,
        "small blobs stored in the database, committed with the events that name them",
        """
        ALTER TABLE blobs ADD COLUMN content BLOB;
        """,
    ),
    Migration(
        6,
        "stored bytes per session and events/bytes per namespace, for quotas",
        """
        ALTER TABLE sessions ADD COLUMN stored_bytes INTEGER NOT NULL DEFAULT 0 CHECK (stored_bytes >= 0);
        UPDATE sessions SET stored_bytes = (
            SELECT COALESCE(SUM(length(CAST(body AS BLOB))), 0) FROM events WHERE events.session_id = sessions.session_id
        );
        CREATE TABLE namespace_usage (
            namespace TEXT PRIMARY KEY,
            events INTEGER NOT NULL DEFAULT 0 CHECK (events >= 0),
            bytes INTEGER NOT NULL DEFAULT 0 CHECK (bytes >= 0)
        ) WITHOUT ROWID;
        INSERT INTO namespace_usage(namespace, events, bytes)
            SELECT namespace, SUM(last_seq), SUM(stored_bytes) FROM sessions GROUP BY namespace;
        """,
    ),
    Migration(
        7,
        "sessions by namespace, for the sessions-per-namespace quota",
        """
        CREATE INDEX sessions_by_namespace ON sessions(namespace, created_at);
        """,
    ),
    Migration(
        8,
        "a row the store's probe rewrites (proof that writes reach the disk)",
        """
        CREATE TABLE store_probe (
            id INTEGER PRIMARY KEY CHECK (id = 1),
            probes INTEGER NOT NULL
        );
        """,
    ),
    Migration(
        9,
        "API requests by idempotency key: a retried request gets the first one's answer",
        """
        CREATE TABLE api_requests (
            principal TEXT NOT NULL,
            idempotency_key TEXT NOT NULL,
            fingerprint TEXT NOT NULL,
            claim TEXT NOT NULL,
            status INTEGER,
            answer TEXT,
            created_at TEXT NOT NULL,
            PRIMARY KEY (principal, idempotency_key)
        ) WITHOUT ROWID;
        CREATE INDEX api_requests_by_age ON api_requests(created_at);
        """,
    ),
    Migration(
        10,
        "session titles, archiving and forks; task prompts to search; the sessions holding each blob",
        """
        ALTER TABLE sessions ADD COLUMN title TEXT;
        ALTER TABLE sessions ADD COLUMN archived_at TEXT;
        ALTER TABLE sessions ADD COLUMN forked_from TEXT;
        ALTER TABLE sessions ADD COLUMN forked_at_seq INTEGER;
        ALTER TABLE tasks ADD COLUMN prompt TEXT;
        UPDATE tasks SET prompt = json_extract(metadata, '$.prompt_preview')
            WHERE json_type(metadata, '$.prompt_preview') = 'text';
        CREATE TABLE blob_holders (
            ref TEXT NOT NULL,
            session_id TEXT NOT NULL,
            PRIMARY KEY (ref, session_id)
        ) WITHOUT ROWID;
        CREATE INDEX blob_holders_by_session ON blob_holders(session_id);
        """,
        backfill=hold_named_blobs,
    ),
    Migration(
        11,
        "each session's isolation level (its HOME: the namespace's, one of its own, or the operator's)",
        """
        ALTER TABLE sessions ADD COLUMN isolation TEXT NOT NULL DEFAULT 'namespaced';
        """,
    ),
    Migration(12, "questions a runtime asks its user", QUESTIONS_TABLE.format(rowid="")),
    Migration(
        13,
        "session budgets (limits, spent, paused) and each namespace's spend per calendar month",
        """
        ALTER TABLE sessions ADD COLUMN budget TEXT;
        CREATE TABLE namespace_spend (
            namespace TEXT NOT NULL,
            month TEXT NOT NULL,
            cost_usd REAL NOT NULL DEFAULT 0,
            tokens INTEGER NOT NULL DEFAULT 0,
            unpriced_reports INTEGER NOT NULL DEFAULT 0,
            PRIMARY KEY (namespace, month)
        ) WITHOUT ROWID;
        """,
    ),
    Migration(14, "webhook endpoints, their outbox of deliveries, and each delivery's attempts",
              WEBHOOK_TABLES.format(rowid="")),
)

LATEST = MIGRATIONS[-1].version

_HISTORY = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    applied_at TEXT NOT NULL
)
"""


def schema_version(conn: apsw.Connection) -> int:
    return int(conn.pragma("user_version"))


def check_version(conn: apsw.Connection, path: str) -> None:
    """For a reader beside the writer, which never migrates: the database must be at ``LATEST`` exactly."""
    found = schema_version(conn)
    if found > LATEST:
        raise SchemaTooNew(path, found, LATEST)
    if found < LATEST:
        raise StoreError(f"{path} has schema version {found}; this codesdk reads version {LATEST}: start the "
                         "supervisor (or `codesdk run`) on this data dir once to migrate it")


def migrate(conn: apsw.Connection, path: str, target: int = LATEST) -> int:
    """Bring the database at ``path`` up to ``target``; return the version it was at."""
    found = schema_version(conn)
    if found > LATEST:
        raise SchemaTooNew(path, found, LATEST)
    if found >= target:
        return found
    conn.execute("BEGIN IMMEDIATE")  # take the write lock before re-reading the version
    try:
        found = schema_version(conn)
        if found > LATEST:
            raise SchemaTooNew(path, found, LATEST)
        if found == 0 and conn.execute("SELECT count(*) FROM sqlite_schema").get:
            raise StoreError(f"{path} is a SQLite database but not a codesdk one; use another data dir")
        conn.execute(_HISTORY)
        for step in MIGRATIONS[found:target]:
            try:
                conn.execute(step.sql)
                if step.backfill is not None:
                    step.backfill(SQLiteDb(conn))
            except apsw.Error as exc:
                raise MigrationFailed(
                    f"migrating {path} to schema version {step.version} ({step.name}) failed; the database "
                    f"was left at version {found}: {translate(exc, 'migration')}"
                ) from exc
            conn.execute(
                "INSERT INTO schema_migrations(version, name, applied_at) VALUES (?, ?, ?)",
                (step.version, step.name, now_text()),
            )
        conn.pragma("user_version", target)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return found
