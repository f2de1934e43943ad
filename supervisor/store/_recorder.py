"""The store as its callers see it: narrow recorder interfaces, one concern each (``typing.Protocol``).

The engine, the HTTP API and the CLI should depend on these rather than on ``EventStore``, so that a second
backend (PostgreSQL) only has to implement them and pass the contract suite (``tests/store/backends.py`` says which
tests). ``EventStore`` (SQLite) implements ``Recorder``, which mypy checks. The split follows who needs what: a
transcript or a CLI listing only reads (``StoreReader``), the approval broker only touches approvals
(``ApprovalRecords``), the engine records everything (``Recorder``).

Every method raises the store's own errors (``StoreError`` subclasses, see ``_errors``), never a driver's; the
semantics each method promises are stated once, on ``EventStore``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from typing import Any, Protocol

from codesdk.protocol import (
    AnsweredVia,
    Answers,
    ApprovalState,
    BudgetSpent,
    IsolationLevel,
    NormalizedEvent,
    QuestionState,
    SessionBudget,
)
from codesdk.protocol.api import SessionFilter

from ._fencing import Fenced
from ._questions import QuestionRecord
from ._quotas import Quotas
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
from ._sql import DroppedSession
from ._stored import StoredEvent
from ._subscribe import Subscription
from ._writer import WriterStats


#: A change of a session's stored budget: its new budget from its stored one (None: as it is). It runs in the store's
#: writer, inside the transaction: a pure function; an exception it raises aborts the transaction and reaches the
#: caller as it is.
BudgetChange = Callable[[SessionBudget | None], SessionBudget | None]


class EventLogReader(Protocol):
    """A session's events in seq order: pages, the types a projection needs, and the live tail."""

    async def read(self, session_id: str, after_seq: int = 0, limit: int = 1000) -> list[NormalizedEvent]: ...

    async def read_types(self, session_id: str, types: Sequence[str], after_seq: int = 0, limit: int = 1000, *,
                         task_id: str | None = None) -> list[NormalizedEvent]: ...

    async def read_stored(self, session_id: str, after_seq: int = 0, limit: int = 1000) -> list[StoredEvent]: ...

    async def last_event_of_type(self, session_id: str, event_type: str) -> NormalizedEvent | None: ...

    async def last_seq(self, session_id: str) -> int: ...

    async def names_blob(self, session_id: str, ref: str) -> bool: ...

    def subscribe(self, session_id: str, after_seq: int = 0, *,
                  until_terminal: bool = False) -> AbstractAsyncContextManager[Subscription]: ...


class EventLog(EventLogReader, Protocol):
    """Appending: gap-free seqs per session, each batch atomic with its task update, durable before it is seen."""

    async def append(
        self, session_id: str, drafts: Sequence[EventDraft], *, task_update: TaskUpdate | None = None,
        idempotency_key: str | None = None, blobs: Mapping[str, tuple[bytes, str]] | None = None,
        bulk: bool = False, quotas: Quotas | None = None, budget_change: BudgetChange | None = None,
    ) -> list[NormalizedEvent]: ...

    async def append_events(
        self, session_id: str, drafts: Sequence[EventDraft], *, task_update: TaskUpdate | None = None,
        idempotency_key: str | None = None, blobs: Mapping[str, tuple[bytes, str]] | None = None,
        bulk: bool = False, quotas: Quotas | None = None, linger: bool = False,
        budget_change: BudgetChange | None = None,
    ) -> list[StoredEvent]: ...


class SessionReader(Protocol):
    async def get_session(self, session_id: str) -> SessionRecord: ...

    async def list_sessions(self, *, namespace: str | None = None, limit: int = 100, offset: int = 0,
                            namespaces: Sequence[str] | None = None, runtime: str | None = None,
                            after: str | None = None, state: SessionFilter = SessionFilter.ALL,
                            text: str | None = None) -> list[SessionRecord]: ...


class SessionRecords(SessionReader, Protocol):
    async def create_session(
        self, session_id: str | None = None, *, runtime: str, namespace: str = "default",
        workspace: str | None = None, metadata: Mapping[str, Any] | None = None, created_at: datetime | None = None,
        quotas: Quotas | None = None, title: str | None = None, isolation: IsolationLevel = IsolationLevel.NAMESPACED,
        budget: SessionBudget | None = None,
    ) -> SessionRecord: ...

    async def change_budget(self, session_id: str, change: BudgetChange,
                            *, spend: tuple[str, str, BudgetSpent] | None = None) -> SessionRecord: ...

    async def namespace_spend(self, namespace: str, month: str) -> BudgetSpent: ...

    async def update_session(self, session_id: str, *, runtime_session_id: str | None = None,
                             metadata: Mapping[str, Any] | None = None, runtime: str | None = None,
                             title: str | None = None, archived: bool | None = None) -> SessionRecord: ...

    async def drop_session(self, session_id: str) -> DroppedSession: ...

    async def fork_session(self, session_id: str, created: EventDraft, events: Sequence[NormalizedEvent], *,
                           record: SessionRecord, quotas: Quotas | None = None) -> SessionRecord: ...


class TaskReader(Protocol):
    async def get_task(self, task_id: str) -> TaskRecord: ...

    async def list_tasks(self, session_id: str) -> list[TaskRecord]: ...

    async def list_active_tasks(self, namespace: str | None = None) -> list[TaskRecord]: ...


class TaskRecords(TaskReader, Protocol):
    """Task rows: at most one active task per session, checked state changes, quotas admitted atomically."""

    async def create_task(
        self, session_id: str, task_id: str | None = None, *, runtime: str | None = None,
        state: TaskState = TaskState.PENDING, metadata: Mapping[str, Any] | None = None,
        worker_pid: int | None = None, quotas: Quotas | None = None,
    ) -> TaskRecord: ...

    async def update_task(
        self, task_id: str, *, state: TaskState | None = None, worker_pid: int | None = None,
        terminal_type: str | None = None, error: Mapping[str, Any] | None = None, ended_at: datetime | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> TaskRecord: ...


class ApprovalRecords(Protocol):
    """Tool calls waiting for a human: pending ones outlive the process; each is decided exactly once."""

    async def create_approval(self, record: ApprovalRecord) -> ApprovalRecord: ...

    async def decide_approval(self, approval_id: str, state: ApprovalState, decided_by: str,
                              reason: str) -> ApprovalRecord: ...

    async def extend_approval(self, approval_id: str, expires_at: datetime) -> ApprovalRecord: ...

    async def get_approval(self, approval_id: str) -> ApprovalRecord: ...

    async def list_approvals(self, *, state: ApprovalState | None = ApprovalState.PENDING,
                             namespaces: Sequence[str] | None = None) -> list[ApprovalRecord]: ...


class QuestionRecords(Protocol):
    """Runtimes' questions waiting for their user: pending ones outlive the process; each is settled once."""

    async def create_question(self, record: QuestionRecord) -> QuestionRecord: ...

    async def settle_question(self, question_id: str, state: QuestionState, via: AnsweredVia, by: str,
                              answers: Answers, reason: str) -> QuestionRecord: ...

    async def extend_question(self, question_id: str, expires_at: datetime) -> QuestionRecord: ...

    async def get_question(self, question_id: str) -> QuestionRecord: ...

    async def list_questions(self, *, state: QuestionState | None = QuestionState.PENDING,
                             namespaces: Sequence[str] | None = None,
                             task_id: str | None = None) -> list[QuestionRecord]: ...


class RequestRecords(Protocol):
    """API requests by idempotency key: a retried request gets the first one's answer (``EventStore``)."""

    async def claim_request(self, principal: str, key: str, fingerprint: str) -> RequestClaim: ...

    async def finish_request(self, principal: str, key: str, token: str, status: int | None,
                             answer: str | None = None) -> None: ...


class BlobReader(Protocol):
    async def get_blob(self, ref: str) -> bytes: ...

    async def blob_exists(self, ref: str) -> bool: ...

    async def blob_info(self, ref: str) -> BlobInfo: ...


class BlobStore(BlobReader, Protocol):
    """Content-addressed bytes (``sha256:<hex>`` refs) that events name instead of carrying them."""

    async def put_blob(self, data: bytes, media_type: str = "application/octet-stream", *,
                       session_id: str | None = None) -> str: ...

    async def put_json_blob(self, value: Any, *, session_id: str | None = None) -> str: ...


class StoreHealth(Protocol):
    """What readiness, metrics, the watchdog and the engine's flood fairness read about the writer."""

    @property
    def closed(self) -> bool: ...

    @property
    def write_failure(self) -> str | None:
        """The last write's failure if the disk (or database) caused it, until a write succeeds again."""

    @property
    def writer_stats(self) -> WriterStats: ...

    @property
    def commit_linger_s(self) -> float:
        """The longest a lingering append waits for other sessions' to share its commit (0: never)."""

    @commit_linger_s.setter
    def commit_linger_s(self, seconds: float) -> None: ...

    async def ping(self) -> None:
        """Return once the writer has committed a probe write (a count in a row): proof that writes still
        get through."""


class WriterLock(Protocol):
    """This process's claim to be the one writer (the data dir's flock); it tells others where our API is."""

    def announce(self, api: Sequence[str]) -> None: ...


class StoreReader(EventLogReader, SessionReader, TaskReader, BlobReader, Protocol):
    """Reading a store beside its writer: the CLI's listings and event dumps, transcripts."""


class Recorder(EventLog, SessionRecords, TaskRecords, ApprovalRecords, QuestionRecords, RequestRecords, BlobStore, StoreHealth,
               StoreReader, Protocol):
    """Everything the engine records and the HTTP API serves."""

    def fence_with(self, epochs: Callable[[], Mapping[str, int] | None], on_fenced: Callable[[Fenced], None]) -> None:
        """Fence the writes for namespaces with the lease epochs held (``_fencing``)."""

    @property
    def lock(self) -> WriterLock | None:
        """The writer's claim on the data dir (None when opened read-only, and on PostgreSQL, which several
        supervisors share: see ``Leases``)."""

    @property
    def location(self) -> str:
        """Where the store is, as messages name it (a file; a URL without its password)."""
