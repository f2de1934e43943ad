"""The PostgreSQL schema and its versioned migrations.

The same tables and constraints as SQLite's latest schema (``_schema``), in PostgreSQL's types (but for the
events' reference to their session, checked by triggers once per statement: migration 4); the SQL core
(``_sql``) runs unchanged on both. Insertion order, which SQLite reads from ``rowid``, is an identity column of
that name here. Blobs are all kept in ``blobs.content`` (see ``_postgres`` for why).

``schema_migrations`` holds the versions applied. Opening applies the missing steps in one transaction under an
advisory lock, so supervisors starting together migrate once; a database whose version is newer than ``LATEST``
is refused (``SchemaTooNew``), and a database with tables of its own but no ``schema_migrations`` is not ours.
Append a ``Migration`` to change the schema — never edit a released one.
"""

from __future__ import annotations

from ._errors import MigrationFailed, SchemaTooNew, StoreError
from ._pg import PostgresDb
from ._schema import Migration
from ._questions import QUESTIONS_TABLE
from ._webhooks import WEBHOOK_TABLES
from ._sql import hold_named_blobs
from ._time import now_text

MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "sessions, tasks, events, blobs, approvals, idempotent appends, usage",
        """
        CREATE TABLE sessions (
            rowid BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE,
            session_id TEXT PRIMARY KEY,
            runtime TEXT NOT NULL,
            namespace TEXT NOT NULL,
            workspace TEXT,
            created_at TEXT NOT NULL,
            metadata TEXT NOT NULL DEFAULT '{}',
            runtime_session_id TEXT,
            last_seq BIGINT NOT NULL DEFAULT 0 CHECK (last_seq >= 0),
            stored_bytes BIGINT NOT NULL DEFAULT 0 CHECK (stored_bytes >= 0)
        );
        CREATE INDEX sessions_by_namespace ON sessions(namespace, created_at);
        CREATE TABLE tasks (
            rowid BIGINT GENERATED ALWAYS AS IDENTITY,
            task_id TEXT PRIMARY KEY,
            session_id TEXT NOT NULL REFERENCES sessions(session_id),
            state TEXT NOT NULL
                CHECK (state IN ('pending', 'running', 'completed', 'failed', 'stopped')),
            runtime TEXT NOT NULL,
            created_at TEXT NOT NULL,
            started_at TEXT,
            ended_at TEXT,
            worker_pid BIGINT,
            terminal_type TEXT,
            error TEXT,
            metadata TEXT NOT NULL DEFAULT '{}'
        );
        CREATE INDEX tasks_by_session ON tasks(session_id, created_at);
        CREATE UNIQUE INDEX one_active_task_per_session ON tasks(session_id) WHERE state IN ('pending', 'running');
        CREATE INDEX active_tasks ON tasks(created_at) WHERE state IN ('pending', 'running');
        CREATE TABLE events (
            session_id TEXT NOT NULL REFERENCES sessions(session_id),
            seq BIGINT NOT NULL CHECK (seq >= 1),
            task_id TEXT,
            type TEXT NOT NULL,
            time TEXT NOT NULL,
            schema_version INTEGER NOT NULL,
            body TEXT NOT NULL,
            PRIMARY KEY (session_id, seq)
        );
        CREATE INDEX events_by_task ON events(task_id, seq) WHERE task_id IS NOT NULL;
        CREATE TABLE blobs (
            ref TEXT PRIMARY KEY,
            size BIGINT NOT NULL CHECK (size >= 0),
            media_type TEXT NOT NULL,
            created_at TEXT NOT NULL,
            content BYTEA
        );
        CREATE TABLE approvals (
            rowid BIGINT GENERATED ALWAYS AS IDENTITY,
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
        CREATE TABLE appends (
            session_id TEXT NOT NULL REFERENCES sessions(session_id),
            idempotency_key TEXT NOT NULL,
            first_seq BIGINT NOT NULL,
            last_seq BIGINT NOT NULL,
            PRIMARY KEY (session_id, idempotency_key)
        );
        CREATE TABLE namespace_usage (
            namespace TEXT PRIMARY KEY,
            events BIGINT NOT NULL DEFAULT 0 CHECK (events >= 0),
            bytes BIGINT NOT NULL DEFAULT 0 CHECK (bytes >= 0)
        );
        """,
    ),
    Migration(
        2,
        "supervisors sharing the database, and their namespace leases",
        """
        CREATE TABLE supervisors (
            supervisor_id TEXT PRIMARY KEY,
            host TEXT NOT NULL,
            pid BIGINT NOT NULL,
            api TEXT NOT NULL DEFAULT '[]',
            started_at TEXT NOT NULL,
            heartbeat_at TIMESTAMPTZ NOT NULL
        );
        CREATE TABLE namespace_leases (
            namespace TEXT PRIMARY KEY,
            supervisor_id TEXT NOT NULL,
            expires_at TIMESTAMPTZ NOT NULL,
            taken_at TIMESTAMPTZ NOT NULL,
            epoch BIGINT NOT NULL DEFAULT 1
        );
        CREATE INDEX leases_by_supervisor ON namespace_leases(supervisor_id);
        """,
    ),
    Migration(
        3,
        "a row the store's probe rewrites (proof that writes reach the database)",
        """
        CREATE TABLE store_probe (
            id INTEGER PRIMARY KEY CHECK (id = 1),
            probes BIGINT NOT NULL
        );
        """,
    ),
    Migration(
        4,
        "events name stored sessions: checked once per statement, not once per row",
        # The foreign key checked each appended row on its own (an index probe and a row lock each: 4 of the 9 µs
        # of server time a row costs); a statement-level trigger checks each statement's sessions once, locking
        # them as the key did, and a row trigger on sessions refuses what the key refused there.
        """
        ALTER TABLE events DROP CONSTRAINT events_session_id_fkey;
        CREATE FUNCTION codesdk_appended_sessions_exist() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF (SELECT count(DISTINCT session_id) FROM appended) <> (SELECT count(*) FROM (
                    SELECT 1 FROM sessions WHERE session_id IN (SELECT session_id FROM appended) FOR KEY SHARE) s)
            THEN
                RAISE foreign_key_violation USING MESSAGE = 'an event names a session that is not stored';
            END IF;
            RETURN NULL;
        END $$;
        CREATE TRIGGER events_name_sessions AFTER INSERT ON events REFERENCING NEW TABLE AS appended
            FOR EACH STATEMENT EXECUTE FUNCTION codesdk_appended_sessions_exist();
        CREATE FUNCTION codesdk_session_keeps_its_events() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF (TG_OP = 'DELETE' OR NEW.session_id <> OLD.session_id)
                    AND EXISTS (SELECT 1 FROM events WHERE session_id = OLD.session_id) THEN
                RAISE foreign_key_violation USING MESSAGE = 'the session has stored events';
            END IF;
            IF TG_OP = 'DELETE' THEN
                RETURN OLD;
            END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER sessions_keep_events BEFORE DELETE OR UPDATE OF session_id ON sessions
            FOR EACH ROW EXECUTE FUNCTION codesdk_session_keeps_its_events();
        """,
    ),
    Migration(
        5,
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
        );
        CREATE INDEX api_requests_by_age ON api_requests(created_at);
        """,
    ),
    Migration(
        6,
        "session titles, archiving and forks; task prompts to search; the sessions holding each blob",
        # a metadata text with an escaped NUL is no jsonb: its prompt is left unsearched rather than fail the step
        r"""
        ALTER TABLE sessions ADD COLUMN title TEXT, ADD COLUMN archived_at TEXT, ADD COLUMN forked_from TEXT,
            ADD COLUMN forked_at_seq BIGINT;
        ALTER TABLE tasks ADD COLUMN prompt TEXT;
        UPDATE tasks SET prompt = metadata::jsonb ->> 'prompt_preview'
            WHERE strpos(metadata, '\u0000') = 0 AND jsonb_typeof(metadata::jsonb -> 'prompt_preview') = 'string';
        CREATE TABLE blob_holders (
            ref TEXT NOT NULL,
            session_id TEXT NOT NULL,
            PRIMARY KEY (ref, session_id)
        );
        CREATE INDEX blob_holders_by_session ON blob_holders(session_id);
        """,
        backfill=hold_named_blobs,
    ),
    Migration(
        7,
        "each session's isolation level (its HOME: the namespace's, one of its own, or the operator's)",
        """
        ALTER TABLE sessions ADD COLUMN isolation TEXT NOT NULL DEFAULT 'namespaced';
        """,
    ),
    Migration(8, "questions a runtime asks its user",
              QUESTIONS_TABLE.format(rowid="rowid BIGINT GENERATED ALWAYS AS IDENTITY,\n            ")),
    Migration(
        9,
        "session budgets (limits, spent, paused) and each namespace's spend per calendar month",
        """
        ALTER TABLE sessions ADD COLUMN budget TEXT;
        CREATE TABLE namespace_spend (
            namespace TEXT NOT NULL,
            month TEXT NOT NULL,
            cost_usd DOUBLE PRECISION NOT NULL DEFAULT 0,
            tokens BIGINT NOT NULL DEFAULT 0,
            unpriced_reports BIGINT NOT NULL DEFAULT 0,
            PRIMARY KEY (namespace, month)
        );
        """,
    ),
    Migration(10, "webhook endpoints, their outbox of deliveries, and each delivery's attempts",
              WEBHOOK_TABLES.format(rowid="rowid BIGINT GENERATED ALWAYS AS IDENTITY,\n            ")),
    Migration(
        11,
        "API tokens (sha256 digests, never the tokens) shared by every supervisor of the database",
        # the admin token is a row like the others (admin true); a change is announced on codesdk_tokens; the ids
        # moved from a data dir are kept, so that moving it again never brings back a token revoked since
        """
        CREATE TABLE api_tokens (
            rowid BIGINT GENERATED ALWAYS AS IDENTITY,
            token_id TEXT PRIMARY KEY,
            name TEXT NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
            sha256 TEXT NOT NULL CHECK (sha256 ~ '^[0-9a-f]{64}$'),
            admin BOOLEAN NOT NULL DEFAULT false,
            metrics BOOLEAN NOT NULL DEFAULT false,
            namespaces TEXT[] NOT NULL DEFAULT '{}',
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            CHECK (NOT (metrics AND (admin OR cardinality(namespaces) > 0)))
        );
        CREATE TABLE api_token_imports (
            token_id TEXT PRIMARY KEY,
            imported_at TEXT NOT NULL
        );
        """,
    ),
    Migration(
        12,
        "namespace variables (encrypted), their change stamps, per-namespace limits and quarantines",
        # Variables: AES-256-GCM ciphertexts only, each naming the key id it was sealed under (namespaces/_pg_state).
        # PostgreSQL only: on SQLite these stay in the data dir's files, next to the one supervisor using them.
        """
        CREATE TABLE namespace_variables (
            namespace TEXT NOT NULL,
            name TEXT NOT NULL,
            key_id TEXT NOT NULL,
            nonce BYTEA NOT NULL,
            ciphertext BYTEA NOT NULL,
            updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
            PRIMARY KEY (namespace, name)
        );
        CREATE INDEX namespace_variables_by_key ON namespace_variables(key_id);
        CREATE TABLE namespace_variable_stamps (
            namespace TEXT PRIMARY KEY,
            stamp BIGINT NOT NULL
        );
        CREATE TABLE namespace_limits (
            kind TEXT NOT NULL CHECK (kind IN ('budget', 'egress', 'disk')),
            namespace TEXT NOT NULL,
            value JSONB NOT NULL,
            updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
            PRIMARY KEY (kind, namespace)
        );
        CREATE TABLE namespace_quarantines (
            namespace TEXT PRIMARY KEY,
            since TIMESTAMPTZ NOT NULL,
            until TIMESTAMPTZ NOT NULL CHECK (until >= since),
            reason TEXT NOT NULL
        );
        """,
    ),
    Migration(
        13,
        "lease epochs from a sequence: an epoch names one holding of a namespace and is never reused (fencing)",
        """
        CREATE SEQUENCE namespace_lease_epochs AS BIGINT;
        SELECT setval('namespace_lease_epochs', COALESCE((SELECT max(epoch) FROM namespace_leases), 0) + 1, false);
        ALTER TABLE namespace_leases ALTER COLUMN epoch SET DEFAULT nextval('namespace_lease_epochs');
        """,
    ),
    Migration(
        14,
        "what import-data-dir moved, so a later run never overwrites or re-adds it",
        """
        CREATE TABLE namespace_imports (
            kind TEXT NOT NULL CHECK (kind IN ('variable', 'budget', 'egress', 'disk')),
            namespace TEXT NOT NULL,
            name TEXT NOT NULL DEFAULT '',
            imported_at TIMESTAMPTZ NOT NULL DEFAULT now(),
            PRIMARY KEY (kind, namespace, name)
        );
        """,
    ),
)

LATEST = MIGRATIONS[-1].version

#: The advisory lock key migrations hold (any fixed number; ours is "CodeSDK\0" in ASCII).
MIGRATION_LOCK = 0x436F646553444B00

_HISTORY = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    applied_at TEXT NOT NULL
)
"""


def schema_version(db: PostgresDb) -> int | None:
    """The version applied, or None where there is no ``schema_migrations`` table."""
    # pg_tables, not to_regclass: a query sees what another migrator committed while we waited for its lock,
    # where the catalog cache behind to_regclass may not yet
    if not db.scalar("SELECT count(*) FROM pg_tables WHERE schemaname = current_schema() "
                     "AND tablename = 'schema_migrations'"):
        return None
    return int(db.scalar("SELECT COALESCE(MAX(version), 0) FROM schema_migrations"))


def migrate(db: PostgresDb, target: int = LATEST) -> int:
    """Bring the database up to ``target`` (connected, outside a transaction); return the version it was at."""
    found = schema_version(db)
    if found is not None and found > LATEST:
        raise SchemaTooNew(db.location, found, LATEST)
    if found is not None and found >= target:
        return found
    db.begin()
    try:
        db.execute("SELECT pg_advisory_xact_lock(?)", (MIGRATION_LOCK,))  # one migrator; re-read under it
        db.execute("SET LOCAL idle_in_transaction_session_timeout = 0")  # a backfill may think between statements
        found = schema_version(db)
        if found is None and db.scalar(
                "SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()"):
            raise StoreError(f"{db.location} has tables but is not a CodeSDK database; give CodeSDK a database "
                             "(or a schema, with ?options=-csearch_path%3D…) of its own")
        found = found or 0
        if found > LATEST:
            raise SchemaTooNew(db.location, found, LATEST)
        db.conn.execute(_HISTORY)  # no parameters: the simple protocol, which runs several statements
        for step in MIGRATIONS[found:target]:
            try:
                db.conn.execute(step.sql.encode())
                if step.backfill is not None:
                    step.backfill(db)
            except Exception as exc:
                raise MigrationFailed(
                    f"migrating {db.location} to schema version {step.version} ({step.name}) failed; the database "
                    f"was left at version {found}: {db.translate(exc, 'migration')}") from exc
            db.execute("INSERT INTO schema_migrations(version, name, applied_at) VALUES (?, ?, ?)",
                       (step.version, step.name, now_text()))
        db.commit()
    except BaseException:
        db.rollback()
        raise
    return found
