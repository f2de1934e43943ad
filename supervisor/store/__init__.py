"""The supervisor's event store and blob store: SQLite (apsw, WAL) plus content-addressed files, or PostgreSQL
(``open_postgres``: several supervisors sharing one database; see ``_postgres``).

Usage::

    async with EventStore.open(data_dir) as store:
        session = await store.create_session(runtime="scripted")
        [event] = await store.append(session.session_id, [EventDraft(type=..., runtime=..., payload=...)])
        async with store.subscribe(session.session_id, after_seq=0, until_terminal=True) as events:
            async for event in events: ...

Layout: ``<data_dir>/codesdk.sqlite3`` (+ ``-wal``/``-shm``) and ``<data_dir>/blobs/sha256/ab/cdef…``.

Ordering: the store assigns ``seq`` per session (1, 2, 3 … without gaps) inside the transaction that
inserts the event, and publishes to subscribers only after that transaction commits.

Durability (the promise): the database runs in WAL mode with ``synchronous=FULL`` by default, so once
``append`` (or any write) returns — and before any subscriber sees the event — it survives a crash of the
process *and* of the machine (power loss), provided the disk honours fsync. Group commit (one transaction
for everything queued, up to ``max_batch`` requests) keeps the cost at one fsync per batch rather than
per event. We chose FULL over NORMAL because with NORMAL a power loss can roll back the last commits
after clients already saw those events, and the next events would then reuse their seqs for different
content — breaking "seq identifies an event". ``synchronous="NORMAL"`` is available for tests and
benchmarks: it keeps atomicity and survives process crashes, but a power loss may lose the most recent
commits. A crash never leaves a half-written batch: each batch is all or nothing. Blobs are fsynced
(file and directory) before their ref is returned, under FULL.

Threads: one writer connection, used only by the writer task through one worker thread at a time; a
small pool of read-only connections for reads. The trio loop never runs SQLite or file I/O itself.

Interfaces: callers depend on the recorder protocols (``Recorder`` for the engine and the HTTP API,
``StoreReader`` for reading beside the writer, ``ApprovalRecords`` … see ``_recorder``), which ``EventStore``
implements; another backend implements the same ones and passes the same contract suite.
"""

from ._errors import (
    ApprovalDecided,
    BlobCorrupt,
    BlobNotFound,
    DatabaseError,
    InvalidBlobRef,
    InvalidEvent,
    InvalidTransition,
    MigrationFailed,
    SchemaTooNew,
    SessionBusy,
    SessionExists,
    StoreClosed,
    StoreError,
    StoreReadOnly,
    TaskExists,
    UnknownApproval,
    UnknownSession,
    UnknownTask,
)
from ._fencing import Fenced
from ._leases import LEASE_S, Claim, Holder, Leases, PostgresLeases, Renewal, SoleLeases
from ._lock import LOCK_FILENAME, DataDirBusy, DataDirLock, LockHolder, current_holder
from ._postgres import (
    check_store_url,
    connect_postgres,
    is_postgres_url,
    migrate_postgres,
    open_postgres,
    open_token_table,
    redact_store_url,
)
from ._quotas import QUOTA_FLAGS, QuotaExceeded, Quotas, Usage
from ._recorder import (
    ApprovalRecords,
    BudgetChange,
    BlobReader,
    BlobStore,
    EventLog,
    EventLogReader,
    Recorder,
    RequestRecords,
    SessionReader,
    SessionRecords,
    StoreHealth,
    StoreReader,
    TaskReader,
    TaskRecords,
    WriterLock,
)
from ._records import (
    ApprovalRecord,
    BlobInfo,
    EventDraft,
    PayloadJson,
    RequestClaim,
    SessionRecord,
    TaskRecord,
    TaskState,
    TaskUpdate,
)
from ._questions import QuestionRecord, QuestionSettled, UnknownQuestion
from ._recorder import QuestionRecords
from ._schema import LATEST as SCHEMA_VERSION
from ._sql import DroppedSession
from ._store import DB_FILENAME, IDEMPOTENCY_WINDOW_S, INLINE_BLOB_MAX, EventStore, Synchronous, new_id
from ._subscribe import Subscription
from ._writer import COMMIT_LINGER_S, MAX_COMMIT_LINGER_S, WriterStats

__all__ = [
    "Fenced",
    "COMMIT_LINGER_S",
    "DB_FILENAME",
    "IDEMPOTENCY_WINDOW_S",
    "INLINE_BLOB_MAX",
    "LEASE_S",
    "LOCK_FILENAME",
    "MAX_COMMIT_LINGER_S",
    "QUOTA_FLAGS",
    "SCHEMA_VERSION",
    "ApprovalDecided",
    "ApprovalRecord",
    "ApprovalRecords",
    "BudgetChange",
    "BlobCorrupt",
    "BlobInfo",
    "BlobNotFound",
    "BlobReader",
    "BlobStore",
    "Claim",
    "DataDirBusy",
    "DataDirLock",
    "DatabaseError",
    "DroppedSession",
    "EventDraft",
    "PayloadJson",
    "EventLog",
    "EventLogReader",
    "EventStore",
    "Holder",
    "InvalidBlobRef",
    "InvalidEvent",
    "InvalidTransition",
    "Leases",
    "LockHolder",
    "MigrationFailed",
    "PostgresLeases",
    "QuotaExceeded",
    "Quotas",
    "Recorder",
    "Renewal",
    "RequestClaim",
    "RequestRecords",
    "SchemaTooNew",
    "SessionBusy",
    "SessionExists",
    "SessionReader",
    "SessionRecord",
    "SessionRecords",
    "SoleLeases",
    "StoreClosed",
    "StoreError",
    "StoreHealth",
    "StoreReadOnly",
    "StoreReader",
    "Subscription",
    "Synchronous",
    "TaskExists",
    "TaskReader",
    "TaskRecord",
    "TaskRecords",
    "TaskState",
    "TaskUpdate",
    "UnknownApproval",
    "UnknownSession",
    "UnknownTask",
    "Usage",
    "WriterLock",
    "WriterStats",
    "check_store_url",
    "connect_postgres",
    "migrate_postgres",
    "redact_store_url",
    "current_holder",
    "is_postgres_url",
    "new_id",
    "open_postgres",
    "QuestionRecord",
    "QuestionRecords",
    "QuestionSettled",
    "UnknownQuestion",
]

from ._webhooks import (AttemptRecord, DeliveryRecord, RotationOverlaps, UnknownDelivery, UnknownWebhook,
                        WebhookRecord)

__all__ += ["AttemptRecord", "DeliveryRecord", "RotationOverlaps", "UnknownDelivery", "UnknownWebhook",
            "WebhookRecord"]

from ._tokens import TOKENS_CHANNEL, Listening, TokenRow, TokenTable

__all__ += ["TOKENS_CHANNEL", "Listening", "TokenRow", "TokenTable", "open_token_table"]
