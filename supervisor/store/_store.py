"""``EventStore``: the trio-facing API over the SQL core, the single writer, the readers and the blob files."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
import secrets
from datetime import datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any, Literal, NoReturn, Protocol, TypeVar

import apsw
import trio

from codesdk.protocol import AnsweredVia, Answers, DeliveryState, QuestionState
from codesdk.protocol import (
    ApprovalState,
    BudgetSpent,
    SessionBudget,
    IsolationLevel,
    NormalizedEvent,
    UpcasterRegistry,
    canonical_json,
    named_blobs,
    sha256_hex,
    utc_now,
)
from codesdk.protocol import upcasters as this_builds_upcasters

from codesdk.protocol.api import SessionFilter

from ..ids import new_id
from . import _questions
from . import _webhooks
from ._webhooks import AttemptRecord, DeliveryRecord, WebhookRecord
from . import _sql
from ._blobs import BlobFiles, check_ref
from ._db import Db, SQLiteDb, open_connection
from ._fencing import Fence, Fenced, Scope
from ._errors import (
    BlobCorrupt,
    BlobNotFound,
    DatabaseError,
    StoreClosed,
    StoreError,
    StoreReadOnly,
    translate,
)
from ._lock import DataDirLock
from ._prepare import prepare
from ._quotas import Quotas
from ._readers import ReaderPool, close_all
from ._recorder import BudgetChange, Recorder
from ._records import (
    ApprovalRecord,
    BlobInfo,
    EventDraft,
    RequestClaim,
    SessionRecord,
    TaskRecord,
    TaskState,
    TaskUpdate,
)
from ._questions import QuestionRecord
from ._schema import check_version, migrate
from ._sql import DroppedSession
from ._stored import StoredEvent
from ._time import to_text
from ._subscribe import Hub, Subscription
from ._writer import MAX_COMMIT_LINGER_S, Writer, WriteRequest, WriterStats

T = TypeVar("T")

__all__ = ["DB_FILENAME", "INLINE_BLOB_MAX", "EventStore", "Synchronous", "new_id"]

DB_FILENAME = "codesdk.sqlite3"
#: Seconds an idle subscriber waits before it looks in the store itself, for events no one told it of (another
#: process's appends to a shared data dir; on PostgreSQL, notices lost while the listener reconnected).
POLL_INTERVAL_S = 0.5
Synchronous = Literal["FULL", "NORMAL"]
#: What a pending approval may become, once.
_DECISIONS = frozenset({ApprovalState.APPROVED, ApprovalState.DENIED, ApprovalState.EXPIRED})


class EventStore(Recorder):
    """Sessions, tasks, events and blobs: of one data dir, in SQLite (``EventStore.open``), or in a PostgreSQL
    database several supervisors share (``open_postgres``). Both run the same SQL core (``_sql``) through the same
    single writer and reader pool; what differs is the connection (``_db``) and where large blobs go."""

    def __init__(
        self,
        location: str,
        writer: Writer | None,
        readers: ReaderPool,
        hub: Hub,
        blobs: BlobFiles | None,
        *,
        subscriber_buffer: int,
        page_size: int,
        lock: DataDirLock | None = None,
        upcasters: UpcasterRegistry = this_builds_upcasters,
        poll_interval_s: float = POLL_INTERVAL_S,
    ) -> None:
        self._location = location
        self._upcasters = upcasters
        self._lock = lock
        self._writer = writer
        self._readers = readers
        self._hub = hub
        self._blobs = blobs
        self._subscriber_buffer = subscriber_buffer
        self._page_size = page_size
        self._poll_interval_s = poll_interval_s
        self._closed = False
        self._write_failure: str | None = None
        #: the lease epochs held when a write is queued, and who hears of a refused one (``fence_with``)
        self._epochs: Callable[[], Mapping[str, int] | None] = lambda: None
        self._on_fenced: Callable[[Fenced], None] = lambda refused: None

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        data_dir: str | os.PathLike[str],
        *,
        synchronous: Synchronous = "FULL",
        readers: int = 2,
        max_batch: int = 256,
        subscriber_buffer: int = 1024,
        page_size: int = 500,
        vfs: str | None = None,
        read_only: bool = False,
        holder: str = "a CodeSDK event store writer",
        upcasters: UpcasterRegistry = this_builds_upcasters,
    ) -> AsyncIterator[EventStore]:
        """Open (creating or migrating) the store under ``data_dir``; closing flushes queued writes.

        A writable store holds the data dir's lock (``DataDirBusy`` if another process has it; ``holder``
        says who we are to whoever finds it taken). ``read_only`` opens an existing store beside its writer:
        no lock, no migration, every write refused (``StoreReadOnly``); subscriptions poll the database.
        ``max_batch`` bounds how many queued write requests share one transaction; ``subscriber_buffer``
        bounds each subscriber's in-memory feed (events); ``page_size`` is a subscriber's read page;
        ``vfs`` names a registered SQLite VFS (the fault-injection tests use one). ``upcasters`` reads stored
        events of older schema versions (and refuses newer ones): this build's ``protocol.upcasters``; the tests
        of stored schema versions give the registry of a fictional later build.
        """
        if synchronous not in ("FULL", "NORMAL"):
            raise ValueError(f"synchronous must be 'FULL' or 'NORMAL', not {synchronous!r}")
        if min(readers, max_batch, subscriber_buffer, page_size) < 1:
            raise ValueError("readers, max_batch, subscriber_buffer and page_size must be >= 1")
        root = Path(data_dir)
        if read_only:
            reader_conns = await trio.to_thread.run_sync(_open_read_only, root, readers, vfs)
            async with _read_only_store(cls, root, reader_conns, subscriber_buffer, page_size,
                                        upcasters) as store:
                yield store
            return
        lock = await trio.to_thread.run_sync(lock_data_dir, root, holder)
        try:
            writer_conn, reader_conns = await trio.to_thread.run_sync(_open_sync, root, synchronous, readers, vfs)
        except BaseException:
            lock.release()
            raise
        hub = Hub()
        writer_db = SQLiteDb(writer_conn)
        writer = Writer(writer_db, hub.publish, max_batch=max_batch)
        pool = ReaderPool([SQLiteDb(conn) for conn in reader_conns])
        store = cls(
            str(root / DB_FILENAME),
            writer,
            pool,
            hub,
            BlobFiles(root / "blobs", fsync=synchronous == "FULL"),
            subscriber_buffer=subscriber_buffer,
            page_size=page_size,
            lock=lock,
            upcasters=upcasters,
        )
        async with running(store, writer, writer_db, pool, hub, release=lock.release):
            yield store

    def fence_with(self, epochs: Callable[[], Mapping[str, int] | None], on_fenced: Callable[[Fenced], None]) -> None:
        """Fence this supervisor's writes for namespaces (``_fencing``): each carries ``epochs()`` as they are when
        it is queued (None: nothing is fenced); a refused one raises ``Fenced`` after ``on_fenced`` heard of it."""
        self._epochs, self._on_fenced = epochs, on_fenced

    @property
    def location(self) -> str:
        """Where the store is, as messages name it: the SQLite file, or the PostgreSQL URL without its password."""
        return self._location

    @property
    def read_only(self) -> bool:
        return self._writer is None

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def lock(self) -> DataDirLock | None:
        """The data dir's writer lock (None when opened read-only): ``lock.announce`` tells others our API."""
        return self._lock

    @property
    def write_failure(self) -> str | None:
        """The last write's failure if it was the disk's (full, I/O error), else None: what /readyz reports."""
        return self._write_failure

    @property
    def writer_stats(self) -> WriterStats:
        """Transactions and requests so far (group commit shows as requests > transactions)."""
        return self._writer.stats if self._writer is not None else WriterStats()

    @property
    def commit_linger_s(self) -> float:
        """The longest a lingering append waits for other sessions' to share its commit (0: never)."""
        return self._writer.linger_s if self._writer is not None else 0.0

    @commit_linger_s.setter
    def commit_linger_s(self, seconds: float) -> None:
        if not 0 <= seconds <= MAX_COMMIT_LINGER_S:
            raise ValueError(f"the commit linger must be between 0 and {MAX_COMMIT_LINGER_S * 1000:g} ms, "
                             f"not {seconds * 1000:g} ms")
        if self._writer is not None:
            self._writer.linger_s = seconds

    # --- sessions ---------------------------------------------------------------------------------

    async def create_session(
        self,
        session_id: str | None = None,
        *,
        runtime: str,
        namespace: str = "default",
        workspace: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        created_at: datetime | None = None,
        quotas: Quotas | None = None,
        title: str | None = None,
        isolation: IsolationLevel = IsolationLevel.NAMESPACED,
        budget: SessionBudget | None = None,
    ) -> SessionRecord:
        """Record a new session (no events: the engine appends ``session.created`` itself). With ``quotas``, a
        namespace at its sessions or stored-bytes limit gets none (``QuotaExceeded``, checked in the transaction
        that inserts it)."""
        record = SessionRecord(
            session_id=session_id or new_id("ses"),
            runtime=runtime,
            namespace=namespace,
            workspace=workspace,
            created_at=created_at or utc_now(),
            metadata=dict(metadata or {}),
            title=title,
            isolation=isolation,
            budget=budget,
        )
        def op(conn: Db) -> SessionRecord:
            if quotas is not None:
                quotas.check_new_session(namespace, *_sql.namespace_totals(conn, namespace))
            return _sql.insert_session(conn, record)

        return await self._write(f"creating session {record.session_id!r}", op, scope=Scope("namespace", namespace))

    async def update_session(
        self,
        session_id: str,
        *,
        runtime_session_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        runtime: str | None = None,
        title: str | None = None,
        archived: bool | None = None,
    ) -> SessionRecord:
        """Set the runtime's own session id (for resuming), the title (``""``: none), whether it is archived, and/or
        replace the metadata (None: as it is). ``runtime``: the session moves to that runtime, and its runtime session id becomes
        ``runtime_session_id`` (None: none yet)."""
        return await self._write(
            f"updating session {session_id!r}",
            partial(
                _sql.update_session,
                session_id=session_id,
                runtime_session_id=runtime_session_id,
                metadata=metadata,
                runtime=runtime,
                title=title,
                archived=archived,
            ),
            scope=Scope("session", session_id),
        )

    async def drop_session(self, session_id: str) -> DroppedSession:
        """Delete an idle session whole (``SessionBusy`` while a task of it is pending or running): its events,
        tasks and approvals, what it counted against its namespace's quotas, and the blobs no other session holds.
        Its followers' subscriptions end. Its workspace is the caller's (``DroppedSession.workspace_shared``)."""
        dropped = await self._write(f"deleting session {session_id!r}", partial(
            _sql.drop_session, session_id=session_id), scope=Scope("session", session_id))
        self._hub.end(session_id)
        await self._drop_blob_files(dropped.blob_files)
        return dropped

    async def fork_session(self, session_id: str, created: EventDraft, events: Sequence[NormalizedEvent], *,
                           record: SessionRecord, quotas: Quotas | None = None) -> SessionRecord:
        """Record ``record``, a fork of ``session_id``, with ``created`` (its ``session.created``) and copies of
        ``events`` (that session's, in order) as its first events, in one transaction. The copies keep their times,
        types, payloads and task ids; only their ``trace.session_id`` is the fork's. With ``quotas``, refused like a
        new session, and like an append of all those events (``QuotaExceeded``)."""
        fork_id = record.session_id
        drafts = [created, *(EventDraft(type=e.type, runtime=e.runtime, payload=e.payload, time=e.time,
                                        trace=e.trace.model_copy(update={"session_id": fork_id})) for e in events)]
        prepared = await trio.to_thread.run_sync(prepare, fork_id, drafts)  # a long session: off the loop

        def op(conn: Db) -> SessionRecord:
            # The session forked from is still stored, and stays so until this commits: a deletion of it either
            # came first (``UnknownSession``: no fork) or comes after and sees the fork holding its blobs and its
            # workspace.
            _sql.lock_session(conn, session_id)
            if quotas is not None:
                quotas.check_new_session(record.namespace, *_sql.namespace_totals(conn, record.namespace))
            _sql.insert_session(conn, record)
            cost = _sql.batch_cost(conn, prepared, {})
            if quotas is not None:
                quotas.check_append(_sql.select_usage(conn, fork_id), fork_id, len(prepared), cost.bytes)
            _sql.insert_events(conn, fork_id, prepared, cost)
            return _sql.select_session(conn, fork_id)

        # nothing to publish: no one follows a session that does not exist yet
        return await self._write(f"forking session {session_id!r} into {fork_id!r}", op,
                                 bulk=len(prepared) > _FORK_BULK, scope=Scope("session", session_id))

    async def get_session(self, session_id: str) -> SessionRecord:
        return await self._read(
            f"reading session {session_id!r}", partial(_sql.select_session, session_id=session_id)
        )

    async def list_sessions(
        self, *, namespace: str | None = None, limit: int = 100, offset: int = 0,
        namespaces: Sequence[str] | None = None, runtime: str | None = None, after: str | None = None,
        state: SessionFilter = SessionFilter.ALL, text: str | None = None,
    ) -> list[SessionRecord]:
        """Sessions oldest first, optionally of one namespace (or of any of ``namespaces``), one runtime and one
        ``state``, with ``text`` in their title or a prompt, and only those stored after session ``after`` (a
        cursor; ``UnknownSession`` if no such session)."""
        _check_page(limit, offset)
        return await self._read("listing sessions", partial(
            _sql.select_sessions, namespace=namespace, limit=limit, offset=offset, namespaces=namespaces,
            runtime=runtime, after=after, state=state, text=text))

    async def change_budget(self, session_id: str, change: BudgetChange,
                            *, spend: tuple[str, str, BudgetSpent] | None = None) -> SessionRecord:
        """Replace the session's budget by ``change(its stored budget)`` (None: as it is), in one transaction with
        ``spend`` — (namespace, ``YYYY-MM``, what was spent) added to the namespace's month. ``change`` runs in the
        writer's thread: a pure function. ``UnknownSession``."""
        def op(conn: Db) -> SessionRecord:
            record = _sql.change_budget(conn, session_id, change)
            if spend is not None:
                _sql.add_namespace_spend(conn, *spend)
            return record

        return await self._write(f"changing the budget of session {session_id!r}", op,
                                 scope=Scope("session", session_id))

    async def namespace_spend(self, namespace: str, month: str) -> BudgetSpent:
        """What the namespace's sessions spent in ``month`` (``YYYY-MM``, UTC), as their usage was counted."""
        return await self._read(f"reading namespace {namespace!r}'s spend",
                                partial(_sql.select_namespace_spend, namespace=namespace, month=month))

    async def last_seq(self, session_id: str) -> int:
        """The seq of the session's last stored event (0 when it has none)."""
        return await self._read(
            f"reading last seq of session {session_id!r}", partial(_sql.select_last_seq, session_id=session_id)
        )

    # --- tasks ------------------------------------------------------------------------------------

    async def create_task(
        self,
        session_id: str,
        task_id: str | None = None,
        *,
        runtime: str | None = None,
        state: TaskState = TaskState.PENDING,
        metadata: Mapping[str, Any] | None = None,
        worker_pid: int | None = None,
        quotas: Quotas | None = None,
    ) -> TaskRecord:
        """Record a task (PENDING or RUNNING). A session has at most one pending/running task (``SessionBusy``).

        With ``quotas``, the task is admitted only while its session and namespace are under their stored-data
        limits and the namespace runs fewer tasks than its limit (``QuotaExceeded``; checked in the transaction
        that inserts the task, so concurrent starts cannot both slip in)."""
        state = TaskState(state)
        if state.is_terminal:
            raise ValueError(f"a task starts pending or running, not {state}")
        task_id = task_id or new_id("task")
        insert = partial(_sql.insert_task, task_id=task_id, session_id=session_id, state=state, runtime=runtime,
                         metadata=dict(metadata or {}), worker_pid=worker_pid)

        def op(conn: Db) -> TaskRecord:
            if quotas is not None:
                quotas.check_admission(_sql.select_usage(conn, session_id), session_id,
                                       partial(_sql.count_active_tasks, conn))
            return insert(conn)

        return await self._write(f"creating task {task_id!r}", op, scope=Scope("session", session_id))

    async def update_task(
        self,
        task_id: str,
        *,
        state: TaskState | None = None,
        worker_pid: int | None = None,
        terminal_type: str | None = None,
        error: Mapping[str, Any] | None = None,
        ended_at: datetime | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> TaskRecord:
        """Change a task; state changes are checked (``InvalidTransition``). See ``TaskUpdate``."""
        update = TaskUpdate(
            task_id=task_id,
            state=None if state is None else TaskState(state),
            worker_pid=worker_pid,
            terminal_type=terminal_type,
            error=error,
            ended_at=ended_at,
            metadata=metadata,
        )
        return await self._write(f"updating task {task_id!r}", partial(_sql.apply_task_update, update=update),
                                 scope=Scope("task", task_id))

    async def get_task(self, task_id: str) -> TaskRecord:
        return await self._read(f"reading task {task_id!r}", partial(_sql.select_task, task_id=task_id))

    async def create_approval(self, record: ApprovalRecord) -> ApprovalRecord:
        return await self._write(f"recording approval {record.approval_id!r}",
                                 partial(_sql.insert_approval, record=record), scope=Scope("namespace", record.namespace))

    async def decide_approval(self, approval_id: str, state: ApprovalState, decided_by: str,
                              reason: str) -> ApprovalRecord:
        """Record the one decision of a pending approval (``ApprovalDecided`` if it already has one)."""
        if state not in _DECISIONS:
            raise ValueError(f"an approval is decided as approved, denied or expired, not {state!r}")
        return await self._write(f"deciding approval {approval_id!r}", partial(
            _sql.decide_approval, approval_id=approval_id, state=state, decided_by=decided_by, reason=reason),
            scope=Scope("approval", approval_id))

    async def extend_approval(self, approval_id: str, expires_at: datetime) -> ApprovalRecord:
        """Move a pending approval's ``expires_at`` (a decided one is returned as it is)."""
        return await self._write(f"extending approval {approval_id!r}", partial(
            _sql.extend_approval, approval_id=approval_id, expires_at=expires_at), scope=Scope("approval", approval_id))

    async def get_approval(self, approval_id: str) -> ApprovalRecord:
        return await self._read(f"reading approval {approval_id!r}", partial(_sql.select_approval,
                                                                             approval_id=approval_id))

    async def list_approvals(self, *, state: ApprovalState | None = ApprovalState.PENDING,
                             namespaces: Sequence[str] | None = None) -> list[ApprovalRecord]:
        return await self._read("listing approvals", partial(_sql.select_approvals, state=state,
                                                             namespaces=namespaces))

    async def create_question(self, record: QuestionRecord) -> QuestionRecord:
        return await self._write(f"recording question {record.question_id!r}",
                                 partial(_questions.insert_question, record=record),
                                 scope=Scope("namespace", record.namespace))

    async def settle_question(self, question_id: str, state: QuestionState, via: AnsweredVia, by: str,
                              answers: Answers, reason: str) -> QuestionRecord:
        """Record the one answer (or decline) of a pending question (``QuestionSettled`` if it has one)."""
        return await self._write(f"answering question {question_id!r}", partial(
            _questions.settle_question, question_id=question_id, state=state, via=via, by=by, answers=answers,
            reason=reason), scope=Scope("question", question_id))

    async def extend_question(self, question_id: str, expires_at: datetime) -> QuestionRecord:
        """Move a pending question's ``expires_at`` (a settled one is returned as it is)."""
        return await self._write(f"extending question {question_id!r}", partial(
            _questions.extend_question, question_id=question_id, expires_at=expires_at),
            scope=Scope("question", question_id))

    async def get_question(self, question_id: str) -> QuestionRecord:
        return await self._read(f"reading question {question_id!r}",
                                partial(_questions.select_question, question_id=question_id))

    async def list_questions(self, *, state: QuestionState | None = QuestionState.PENDING,
                             namespaces: Sequence[str] | None = None,
                             task_id: str | None = None) -> list[QuestionRecord]:
        return await self._read("listing questions", partial(_questions.select_questions, state=state,
                                                             namespaces=namespaces, task_id=task_id))

    # --- webhooks (``_webhooks``) ---------------------------------------------------------------------

    async def create_webhook(self, record: WebhookRecord) -> WebhookRecord:
        return await self._write(f"registering webhook {record.webhook_id!r}",
                                 partial(_webhooks.insert_webhook, record=record))

    async def get_webhook(self, webhook_id: str) -> WebhookRecord:
        return await self._read(f"reading webhook {webhook_id!r}",
                                partial(_webhooks.select_webhook, webhook_id=webhook_id))

    async def list_webhooks(self, namespaces: Sequence[str] | None = None) -> list[WebhookRecord]:
        return await self._read("listing webhooks", partial(_webhooks.select_webhooks, namespaces=namespaces))

    async def delete_webhook(self, webhook_id: str) -> None:
        await self._write(f"removing webhook {webhook_id!r}", partial(_webhooks.delete_webhook,
                                                                      webhook_id=webhook_id))

    async def rotate_webhook_secret(self, webhook_id: str, secret: str, previous_valid_until: datetime,
                                    now: datetime, end_overlap: bool = False) -> WebhookRecord:
        return await self._write(f"rotating the secret of webhook {webhook_id!r}", partial(
            _webhooks.rotate_secret, webhook_id=webhook_id, secret=secret,
            previous_valid_until=previous_valid_until, now=now, end_overlap=end_overlap))

    async def add_deliveries(self, kind: str, namespace: str | None, data: Mapping[str, Any], *,
                             webhook_id: str | None = None) -> list[DeliveryRecord]:
        """Deliveries of something that is not a session's event (``_webhooks.outbox_for``)."""
        return await self._write(f"recording {kind} deliveries", partial(
            _webhooks.outbox_for, kind=kind, namespace=namespace, data=data, webhook_id=webhook_id))

    async def get_delivery(self, delivery_id: str) -> DeliveryRecord:
        return await self._read(f"reading delivery {delivery_id!r}",
                                partial(_webhooks.select_delivery, delivery_id=delivery_id))

    async def list_deliveries(self, webhook_id: str, state: DeliveryState | None = None,
                              limit: int = 100, before: str | None = None) -> list[DeliveryRecord]:
        return await self._read("listing deliveries", partial(_webhooks.select_deliveries, webhook_id=webhook_id,
                                                              state=state, limit=limit, before=before))

    async def delivery_attempts(self, delivery_id: str) -> list[AttemptRecord]:
        return await self._read("reading delivery attempts",
                                partial(_webhooks.select_attempts, delivery_id=delivery_id))

    async def redeliver(self, delivery_id: str) -> DeliveryRecord:
        return await self._write(f"redelivering {delivery_id!r}", partial(_webhooks.redeliver,
                                                                          delivery_id=delivery_id))

    async def deliveries_due(self, now: datetime, busy: Sequence[str] = ()) -> bool:
        return await self._read("looking for due webhook deliveries",
                                partial(_webhooks.any_due, now=to_text(now), busy=busy))

    async def count_webhooks(self, namespace: str | None) -> int:
        return await self._read("counting webhooks", partial(_webhooks.count_webhooks, namespace=namespace))

    async def claim_deliveries(self, now: datetime, until: datetime, room: Mapping[str, int], default_room: int,
                               limit: int, supervisor_id: str | None) -> list[DeliveryRecord]:
        return await self._write("claiming due webhook deliveries", partial(
            _webhooks.claim_deliveries, now=to_text(now), until=to_text(until), room=room,
            default_room=default_room, limit=limit, supervisor_id=supervisor_id))

    async def record_attempt(self, delivery_id: str, attempt: AttemptRecord, state: DeliveryState,
                             next_attempt_at: datetime | None) -> DeliveryRecord | None:
        return await self._write(f"recording an attempt of {delivery_id!r}", partial(
            _webhooks.record_attempt, delivery_id=delivery_id, attempt=attempt, state=state,
            next_attempt_at=next_attempt_at))

    async def prune_deliveries(self, before: datetime) -> int:
        return await self._write("pruning settled webhook deliveries",
                                 partial(_webhooks.prune_deliveries, before=to_text(before)))

    async def release_delivery_claims(self) -> None:
        await self._write("releasing webhook delivery claims", _webhooks.release_claims)

    async def ping(self) -> None:
        """A probe write through the writer: returns once the writer has committed one more count in a row.
        The service feeds systemd's watchdog only while this keeps answering; /readyz asks it whether a failed
        write's cause is over."""
        await self._write("probing the store with a write", _sql.rewrite_probe_row)

    async def list_active_tasks(self, namespace: str | None = None) -> list[TaskRecord]:
        """Every task still pending or running, in any session (or in the namespace's)."""
        return await self._read("listing active tasks", partial(_sql.select_active_tasks, namespace=namespace))

    async def list_tasks(self, session_id: str) -> list[TaskRecord]:
        """The session's tasks, oldest first."""
        return await self._read(
            f"listing tasks of session {session_id!r}", partial(_sql.select_tasks, session_id=session_id)
        )

    # --- events -----------------------------------------------------------------------------------

    async def append(
        self, session_id: str, drafts: Sequence[EventDraft], *, task_update: TaskUpdate | None = None,
        idempotency_key: str | None = None, blobs: Mapping[str, tuple[bytes, str]] | None = None,
        bulk: bool = False, quotas: Quotas | None = None, budget_change: BudgetChange | None = None,
    ) -> list[NormalizedEvent]:
        """Store ``drafts`` atomically as the session's next events; return them with their seqs (``append_events``
        returns them as stored, without building their models: the engine's streams need none).

        Every draft is validated first (``InvalidEvent``); the batch and the optional ``task_update``
        (e.g. the terminal state with the terminal event) commit together or not at all. Subscribers
        see the events only after the commit. If the caller is cancelled after the batch was queued,
        the batch is still stored — so a caller that retries after an ambiguous failure passes the same
        ``idempotency_key``: an append whose key the session has already seen stores nothing and returns
        the events stored the first time.

        ``blobs`` maps refs to ``(bytes, media type)`` of small blobs (up to ``INLINE_BLOB_MAX`` bytes) the events
        name: they are kept in the database and committed with the events — no extra fsyncs, and never an event
        naming a blob that is not there. Each ref is checked against its bytes first.

        Every append adds its events and bytes (``_sql.batch_cost``) to the session's and namespace's usage; with
        ``quotas``, an append that would take either past its limit stores nothing and raises ``QuotaExceeded``.

        ``bulk`` marks part of a long stream (the engine sets it for a task that has streamed many events, in
        appends of bounded size): the writer commits bulk appends in transactions of their own that take turns
        with all other writes, so a flood delays others by at most one such transaction (see ``_writer``).
        """
        stored = await self.append_events(session_id, drafts, task_update=task_update, idempotency_key=idempotency_key,
                                          blobs=blobs, bulk=bulk, quotas=quotas, budget_change=budget_change)
        return [event.model() for event in stored]

    async def append_events(
        self, session_id: str, drafts: Sequence[EventDraft], *, task_update: TaskUpdate | None = None,
        idempotency_key: str | None = None, blobs: Mapping[str, tuple[bytes, str]] | None = None,
        bulk: bool = False, quotas: Quotas | None = None, linger: bool = False,
        budget_change: BudgetChange | None = None,
    ) -> list[StoredEvent]:
        """``append``, returning the events as stored (their models are built only if someone asks). ``linger``:
        nothing waits behind these events but their own publication, so their commit may wait a little for other
        sessions' to share it (``commit_linger_s``; the writer's "Linger"). ``budget_change``: the session's budget
        changed in the same transaction (a budget reached and the pause it makes, stored together)."""
        inline = _check_inline_blobs(blobs or {})
        prepared = prepare(session_id, drafts)
        if not prepared and task_update is None:
            return []
        if idempotency_key is not None and not prepared:
            raise ValueError("an idempotency key needs at least one event")

        def op(conn: Db) -> list[StoredEvent]:
            # the checks below hold until this commits
            usage = _sql.lock_session_usage(conn, session_id) if quotas is not None else None
            last_seq = usage.session_events if usage is not None else _sql.lock_session(conn, session_id)
            if idempotency_key is not None:
                earlier = _sql.select_keyed_append(conn, session_id, idempotency_key, self._upcasters)
                if earlier is not None:
                    return AlreadyStored(StoredEvent.of(event) for event in earlier)
            cost = _sql.batch_cost(conn, prepared, {ref: data for ref, (data, _) in inline.items()})
            if quotas is not None and usage is not None:
                quotas.check_append(usage, session_id, len(prepared), cost.bytes)
            for ref, (data, media_type) in inline.items():
                _sql.insert_inline_blob(conn, ref, data, media_type)
            stored = _sql.insert_events(conn, session_id, prepared, cost, last_seq)
            if idempotency_key is not None:
                _sql.insert_keyed_append(conn, session_id, idempotency_key, stored)
            if task_update is not None:
                _sql.apply_task_update(conn, task_update, session_id=session_id)
            if budget_change is not None:
                _sql.change_budget(conn, session_id, budget_change)
            return stored

        where = f"appending {len(prepared)} event(s) to session {session_id!r}"
        return await self._write(where, op, publish_to=session_id, bulk=bulk, linger=linger,
                                 scope=Scope("session", session_id))

    async def read(self, session_id: str, after_seq: int = 0, limit: int = 1000) -> list[NormalizedEvent]:
        """Up to ``limit`` events with seq > ``after_seq``, in seq order. Page with the last seq you got."""
        _check_page(limit, after_seq)
        return await self._read(
            f"reading events of session {session_id!r}",
            partial(_sql.select_events, session_id=session_id, after_seq=after_seq, limit=limit,
                    registry=self._upcasters),
        )

    async def read_stored(self, session_id: str, after_seq: int = 0, limit: int = 1000) -> list[StoredEvent]:
        """``read``, as stored: what a stream sends on (bodies of this build's schema are not decoded)."""
        _check_page(limit, after_seq)
        return await self._read(
            f"reading events of session {session_id!r}",
            partial(_sql.select_stored_events, session_id=session_id, after_seq=after_seq, limit=limit,
                    registry=self._upcasters),
        )

    async def read_types(self, session_id: str, types: Sequence[str], after_seq: int = 0, limit: int = 1000, *,
                         task_id: str | None = None) -> list[NormalizedEvent]:
        """Up to ``limit`` events of these types (of ``task_id`` when given) after ``after_seq``, in seq order:
        what a projection needs, without reading every delta of a long session."""
        _check_page(limit, after_seq)
        if not types:
            return []
        return await self._read(f"reading events of session {session_id!r}", partial(
            _sql.select_events_of_types, session_id=session_id, types=[str(t) for t in types], after_seq=after_seq,
            limit=limit, task_id=task_id, registry=self._upcasters))

    async def last_event_of_type(self, session_id: str, event_type: str) -> NormalizedEvent | None:
        """The session's last event of ``event_type``, or None."""
        return await self._read(f"reading events of session {session_id!r}", partial(
            _sql.select_last_event_of_type, session_id=session_id, event_type=str(event_type),
            registry=self._upcasters))

    async def names_blob(self, session_id: str, ref: str) -> bool:
        """Whether one of the session's events names blob ``ref`` in its contract's ref fields
        (``protocol.named_blobs``): what the session's readers may download. Text that merely contains the ref (a
        model's output, a tool's input) does not count. ``UnknownSession`` for an unknown session."""
        check_ref(ref)
        after = 0
        while True:
            page = await self._read(f"reading events of session {session_id!r}", partial(
                _sql.select_events_containing, session_id=session_id, text=ref, after_seq=after,
                limit=_NAMING_PAGE, registry=self._upcasters))
            if any(ref in named_blobs(event) for event in page):
                return True
            if len(page) < _NAMING_PAGE:
                return False
            after = page[-1].seq

    @asynccontextmanager
    async def subscribe(
        self, session_id: str, after_seq: int = 0, *, until_terminal: bool = False
    ) -> AsyncIterator[Subscription]:
        """Iterate the session's events with seq > ``after_seq``: the stored past, then live ones.

        No gaps, no duplicates, in seq order, each event only after it is durable. A slow subscriber
        never holds up appends (its feed is bounded; on overflow it re-reads from the store). With
        ``until_terminal`` the iteration ends after the next terminal (``task.*``) event. Iteration
        raises ``StoreClosed`` when the store closes while it waits.
        """
        _check_page(1, after_seq)
        feed = self._hub.add(session_id, self._subscriber_buffer)  # before the first read: see _subscribe
        try:
            await self.last_seq(session_id)  # UnknownSession here rather than on first iteration
            read_page = partial(self.read_stored, session_id)
            yield Subscription(
                read_page, feed, after_seq, until_terminal=until_terminal, page_size=self._page_size,
                poll_interval_s=self._poll_interval_s)
        finally:
            self._hub.remove(session_id, feed)

    def subscriber_count(self, session_id: str) -> int:
        return self._hub.count(session_id)

    # --- API requests by idempotency key --------------------------------------------------------

    async def claim_request(self, principal: str, key: str, fingerprint: str) -> RequestClaim:
        """Take an API request's idempotency key for it, or say what holds the key (``RequestClaim``): the answer of
        the key's first request with this ``fingerprint`` (kept ``IDEMPOTENCY_WINDOW_S``), another request's use of
        it, or a first request still being answered (one unanswered for ``ABANDONED_CLAIM_S`` is taken over: its
        supervisor died answering it). Keys are the principal's own."""
        now = utc_now()
        return await self._write(f"claiming an idempotency key of {principal!r}", partial(
            _sql.claim_request, principal=principal, key=key, fingerprint=fingerprint, token=secrets.token_hex(16),
            now=to_text(now), expired_before=to_text(now - timedelta(seconds=IDEMPOTENCY_WINDOW_S)),
            abandoned_before=to_text(now - timedelta(seconds=ABANDONED_CLAIM_S))))

    async def finish_request(self, principal: str, key: str, token: str, status: int | None,
                             answer: str | None = None) -> None:
        """Keep the answer of the request that claimed ``key`` with ``token``; ``status`` None frees the key (the
        request changed nothing: a retry may run it again)."""
        await self._write(f"recording the answer to an idempotency key of {principal!r}", partial(
            _sql.finish_request, principal=principal, key=key, token=token, status=status, answer=answer))

    # --- blobs ------------------------------------------------------------------------------------

    async def put_blob(self, data: bytes, media_type: str = "application/octet-stream", *,
                       session_id: str | None = None) -> str:
        """Store ``data`` content-addressed; return ``sha256:<hex>``. Idempotent (first media type wins).

        ``session_id``: the session whose event will name it, which holds the blob from now on — so deleting
        another session that held it too cannot remove it before that event is stored. Without it, the blob is held
        by the sessions whose events name it once they are stored."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"blob data must be bytes, not {type(data).__name__}")
        return await self._put(bytes(data), media_type, session_id)

    async def put_json_blob(self, value: Any, *, session_id: str | None = None) -> str:
        """Store the RFC 8785 canonical JSON of ``value``; the ref equals ``protocol.canonical_hash(value)``."""
        data = await trio.to_thread.run_sync(canonical_json, value)
        return await self._put(data, "application/json", session_id)

    async def get_blob(self, ref: str) -> bytes:
        """The blob's bytes, re-hashed on read (``BlobCorrupt`` if they no longer match the ref)."""
        check_ref(ref)
        content = await self._read(f"reading blob {ref}", partial(_sql.select_blob_content, ref=ref))
        if content is not None:
            if sha256_hex(content) != ref:
                raise BlobCorrupt(ref, f"{self.location} (table blobs)", sha256_hex(content))
            return content
        if self._blobs is None:
            raise BlobNotFound(ref)
        return await self._blob_io(f"reading blob {ref}", self._blobs.get, ref)

    async def blob_exists(self, ref: str) -> bool:
        check_ref(ref)
        if await self._read(f"checking blob {ref}", partial(_sql.select_blob_content, ref=ref)) is not None:
            return True
        return self._blobs is not None and await self._blob_io(f"checking blob {ref}", self._blobs.exists, ref)

    async def blob_info(self, ref: str) -> BlobInfo:
        check_ref(ref)
        info = await self._read(f"reading blob {ref}", partial(_sql.select_blob, ref=ref))
        if info is not None:
            return info
        if self._blobs is None:
            raise BlobNotFound(ref)
        size = await self._blob_io(f"reading blob {ref}", self._blobs.size, ref)  # file without row
        return BlobInfo(ref=ref, size=size, media_type="application/octet-stream")

    async def _put(self, data: bytes, media_type: str, session_id: str | None) -> str:
        if self._writer is None:
            raise StoreReadOnly(self.location, "writing a blob")
        ref = await trio.to_thread.run_sync(sha256_hex, data)
        holders = (session_id,) if session_id is not None else ()

        def record(conn: Db) -> bool:
            """Record the row and its holder; whether the blob is (already) kept inline, so needs no file."""
            if files is None:
                _sql.insert_inline_blob(conn, ref, data, media_type)
            else:
                _sql.insert_blob(conn, BlobInfo(ref=ref, size=len(data), media_type=media_type))
            for holder in holders:
                _sql.hold_blobs(conn, holder, (ref,))
            return files is not None and _sql.blob_is_inline(conn, ref)

        # The row (and its holder) before the file: a session's deletion removes the file of a blob only while no
        # row is recorded (``_drop_blob_files``), so once recorded, the file written next stays.
        files = self._blobs
        inline = await self._write(f"recording blob {ref}", record)
        if files is not None and not inline:
            await self._blob_io("writing a blob", partial(files.put, ref=ref), data)
        return ref

    async def _drop_blob_files(self, refs: Sequence[str]) -> None:
        """Unlink the files of blobs whose rows a deletion removed, unless a ``put_blob`` recorded one again."""
        files = self._blobs
        if files is None or not refs:
            return

        def unlink(conn: Db) -> None:  # in the writer: no put records a row between the check and the unlink
            for ref in _sql.unheld_blob_files(conn, refs):
                with contextlib.suppress(OSError):  # left behind: a file without a row is never served
                    files.remove(ref)

        await self._write(f"removing {len(refs)} blob file(s)", unlink)

    # --- plumbing ---------------------------------------------------------------------------------

    async def _write(
        self, where: str, op: Callable[[Db], T], *, publish_to: str | None = None, bulk: bool = False,
        linger: bool = False, scope: Scope | None = None,
    ) -> T:
        """Queue ``op`` for the writer. ``scope``: what names the namespace the write is for: it is fenced
        (``_fencing``) with the epochs held now, when it is queued."""
        if self._closed:
            raise StoreClosed(where)
        if self._writer is None:
            raise StoreReadOnly(self.location, where)
        epochs = None if scope is None else self._epochs()
        if epochs is not None and scope is not None:
            op = partial(_fenced, Fence(epochs, scope), op)
        try:
            result = await self._writer.submit(WriteRequest(op, where, publish_to, bulk=bulk, linger=linger))
        except DatabaseError as exc:
            if exc.storage_fault:
                self._write_failure = str(exc)  # reported by /readyz until a write succeeds again
            raise
        except Fenced as exc:
            self._on_fenced(exc)
            raise
        self._write_failure = None
        return result

    async def _read(self, where: str, function: Callable[[Db], T]) -> T:
        return await self._readers.run(where, function)

    async def _blob_io(self, where: str, function: Callable[[Any], T], arg: Any) -> T:
        if self._closed:
            raise StoreClosed(where)
        try:
            return await trio.to_thread.run_sync(function, arg)
        except OSError as exc:
            raise translate(exc, where) from exc


#: How long an idempotency key's answer is kept: a retry within it gets the first request's answer.
IDEMPOTENCY_WINDOW_S = 24 * 3600
#: A claimed key whose request got no answer in this long is taken over by the next request with it.
ABANDONED_CLAIM_S = 600

#: A fork copying more events than this commits as a bulk write (taking turns with the others, see ``_writer``).
_FORK_BULK = 1000

#: Events a blob's lookup decodes at a time (only those whose JSON contains the ref are read at all).
_NAMING_PAGE = 200

#: Largest blob kept in the database (committed with its events) rather than as a file.
INLINE_BLOB_MAX = 64 * 1024


def _fenced(fence: Fence, op: Callable[[Db], T], conn: Db) -> T:
    """``op`` under ``fence``: a session's lock checks it on the way (``lock_session``), or it is checked after the
    op's statements, in the same transaction (which a refusal rolls back)."""
    conn.fence = fence
    try:
        result = op(conn)
        fence.check(conn)
        return result
    finally:
        conn.fence = None


def _check_inline_blobs(blobs: Mapping[str, tuple[bytes, str]]) -> dict[str, tuple[bytes, str]]:
    checked: dict[str, tuple[bytes, str]] = {}
    for ref, (data, media_type) in blobs.items():
        check_ref(ref)
        if len(data) > INLINE_BLOB_MAX:
            raise ValueError(f"blob {ref} has {len(data)} bytes; blobs over {INLINE_BLOB_MAX} go through put_blob")
        if sha256_hex(data) != ref:
            raise ValueError(f"blob ref {ref} does not match its bytes ({sha256_hex(data)})")
        checked[ref] = (bytes(data), media_type)
    return checked


class AlreadyStored(list[StoredEvent]):
    """Events an earlier append with the same idempotency key stored. Falsy, so the writer (which publishes
    a truthy result) does not hand them to subscribers a second time."""

    def __bool__(self) -> bool:
        return False


def _check_page(limit: int, offset: int) -> None:
    if limit < 1:
        raise ValueError(f"limit must be >= 1, not {limit}")
    if offset < 0:
        raise ValueError(f"after_seq/offset must be >= 0, not {offset}")


def _open_sync(root: Path, synchronous: str, readers: int,
               vfs: str | None = None) -> tuple[apsw.Connection, list[apsw.Connection]]:
    """Create the data dir, open and migrate the database, open the readers (worker thread)."""
    path = str(root / DB_FILENAME)
    opened: list[apsw.Connection] = []
    try:
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        writer = open_connection(path, readonly=False, synchronous=synchronous, vfs=vfs)
        opened.append(writer)
        for suffix in ("", "-wal", "-shm"):  # whatever the umask was: the store is the supervisor's alone
            with contextlib.suppress(FileNotFoundError):
                os.chmod(path + suffix, 0o600)
        migrate(writer, path)
        for _ in range(readers):
            opened.append(open_connection(path, readonly=True, synchronous=synchronous, vfs=vfs))
    except BaseException as exc:  # noqa: BLE001 - re-raised, translated
        _closed_and_translated(opened, exc, f"opening the event store at {path}")
    return opened[0], opened[1:]


def _closed_and_translated(opened: list[apsw.Connection], exc: BaseException, where: str) -> NoReturn:
    """A failed open: close what was opened, raise what callers understand (a ``StoreError`` saying where)."""
    close_all(opened)
    translated = translate(exc, where)
    if translated is exc:
        raise exc
    raise translated from exc


def lock_data_dir(root: Path, holder: str) -> DataDirLock:
    try:
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        return DataDirLock.acquire(root, holder)
    except OSError as exc:
        raise translate(exc, f"opening the event store in {root} (taking its lock)") from exc


def _open_read_only(root: Path, readers: int, vfs: str | None = None) -> list[apsw.Connection]:
    """Reader connections on an existing store, which must be at the schema version this code reads."""
    path = root / DB_FILENAME
    if not path.is_file():
        raise StoreError(f"no event store in {root} yet (no {DB_FILENAME}); run a task first, or pass --data-dir")
    opened: list[apsw.Connection] = []
    try:
        for _ in range(readers):
            opened.append(open_connection(str(path), readonly=True, synchronous="FULL", vfs=vfs))
        check_version(opened[0], str(path))
    except BaseException as exc:  # noqa: BLE001 - re-raised, translated
        _closed_and_translated(opened, exc, f"opening the event store at {path} read-only")
    return opened


@asynccontextmanager
async def _read_only_store(cls: type[EventStore], root: Path, connections: list[apsw.Connection],
                           subscriber_buffer: int, page_size: int,
                           upcasters: UpcasterRegistry) -> AsyncIterator[EventStore]:
    hub = Hub()
    pool = ReaderPool([SQLiteDb(conn) for conn in connections])
    store = cls(str(root / DB_FILENAME), None, pool, hub, BlobFiles(root / "blobs", fsync=False),
                subscriber_buffer=subscriber_buffer,
                page_size=page_size, upcasters=upcasters)
    try:
        yield store
    finally:
        store._closed = True
        with trio.CancelScope(shield=True):
            hub.close()
            await pool.aclose()


class Background(Protocol):
    """Work a store runs beside its writer (PostgreSQL's listener): ``run`` returns soon after ``stop``."""

    async def run(self) -> None: ...

    def stop(self) -> None: ...


@asynccontextmanager
async def running(store: EventStore, writer: Writer, writer_db: Db, pool: ReaderPool, hub: Hub, *,
                  background: Sequence[Background] = (), release: Callable[[], None] = lambda: None,
                  ) -> AsyncIterator[None]:
    """Run the store's writer (and ``background``) while the body runs; on the way out, commit what is queued,
    close the connections and only then ``release`` (the data dir's lock). An error of the body is raised as
    itself, not inside a group."""
    body_error: BaseException | None = None
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer.run)
            for work in background:
                nursery.start_soon(work.run)
            try:
                yield
            except BaseException as exc:  # noqa: BLE001 - re-raised below
                body_error = exc  # raised below, outside the nursery, so callers don't get a group
            finally:
                store._closed = True
                writer.close()  # the writer commits what is queued, then returns
                for work in background:
                    work.stop()
    finally:
        with trio.CancelScope(shield=True):
            hub.close()
            await pool.aclose()
            await trio.to_thread.run_sync(close_all, [writer_db])
            release()  # only once every write is committed and the connection closed
    if body_error is not None:
        raise body_error
