"""Fenced writes (PostgreSQL): a supervisor's write for a namespace commits only while it still holds the lease.

Every lease claim takes a new epoch from a sequence (``namespace_lease_epochs``), so an epoch names one holding of
one namespace and is never reused. A write is queued with the epochs its supervisor held at that moment (``Fence``);
inside the write's own transaction the namespace's lease row is read and locked ``FOR SHARE`` — a takeover updates
that row, so it waits for our commit, and a takeover that committed first shows a new epoch — and the write is
refused (``Fenced``, nothing of it kept) unless the row's epoch is the one held when the write was queued. A write
queued before its supervisor hung therefore cannot land after another supervisor took the namespace over.
(``FOR KEY SHARE`` would not do: the takeover's ``ON CONFLICT DO UPDATE`` leaves the key alone and takes a lock
that does not conflict with it.)

The writes fenced, and what names their namespace (``Scope``):

- by session: appends (the check is folded into ``lock_session``, the statement every append runs first: no extra
  round trip; the outbox rows of webhook deliveries for the events go with them), ``create_task``,
  ``update_session``, ``drop_session``, ``fork_session``, ``change_budget`` (with the namespace's monthly spend);
- by namespace: ``create_session``, ``create_approval``, ``create_question``;
- by task: ``update_task``; by approval: ``decide_approval``, ``extend_approval``; by question:
  ``settle_question``, ``extend_question``.

Not fenced: writes that belong to no namespace's running (blobs, which are content-addressed and named only by
fenced appends; idempotency keys; the store probe; webhook registrations, and the cluster-wide delivery loop's
claims, attempts and pruning, and its own notices such as a test-send). SQLite has one supervisor: nothing is fenced
there.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from ._errors import StoreError

#: The ``application_name`` of every connection a supervisor makes (``_pg.connect``): whose stalled transactions a
#: blocked claim or write may end (``_leases``, ``_pg.end_stalled_blockers``).
SUPERVISOR_APPLICATION = "codesdk-supervisor"

#: What names the namespace of a write.
ScopeKind = Literal["namespace", "session", "task", "approval", "question"]

_ROW_OF: dict[str, tuple[str, str]] = {  # (the table naming the namespace, its key column)
    "session": ("sessions", "session_id"),
    "approval": ("approvals", "approval_id"),
    "question": ("questions", "question_id"),
}


class Db(Protocol):
    """What the checks run on: the write's connection (``_db.Db``, which names ``Fence``: hence not imported)."""

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Iterable[Any]: ...

    def scalar(self, sql: str, params: Sequence[Any] = ()) -> Any: ...


class Fenced(StoreError):
    """The namespace's lease is no longer the one this supervisor held when it queued the write (another supervisor
    took the namespace over, or this one let it go): nothing of the write was stored."""

    def __init__(self, namespace: str, epoch: int | None, what: str = "a write") -> None:
        self.namespace = namespace
        #: the lease epoch the write carried (None: the namespace was not held here when it was queued)
        self.epoch = epoch
        held = "not held here" if epoch is None else f"held here as epoch {epoch}"
        super().__init__(f"{what} for namespace {namespace!r} was refused: its lease ({held}) is no longer this "
                         "supervisor's, so another supervisor runs the namespace; send the request again (it is "
                         "sent where the namespace runs now)")


@dataclass(frozen=True)
class Scope:
    """What names a write's namespace: the namespace itself, or a session, task, approval or question of it."""

    kind: ScopeKind
    key: str


class Fence:
    """One write's fence: the epochs its supervisor held when it was queued, checked once in its transaction."""

    __slots__ = ("checked", "epochs", "scope")

    def __init__(self, epochs: Mapping[str, int], scope: Scope) -> None:
        self.epochs = epochs
        self.scope = scope
        self.checked = False

    def verify(self, namespace: str, epoch: int | None) -> None:
        """The lease row (locked FOR SHARE by the caller) has ``epoch`` (None: there is none)."""
        held = self.epochs.get(namespace)
        if held is None or held != epoch:
            raise Fenced(namespace, held)
        self.checked = True

    def check(self, conn: Db) -> None:
        """Lock the namespace's lease row FOR SHARE and verify its epoch (once per transaction). A session, task,
        approval or question that does not exist is not this check's to report: the write says so itself."""
        if self.checked:
            return
        namespace = self._namespace(conn)
        if namespace is None:
            return
        self.verify(namespace, conn.scalar("SELECT epoch FROM namespace_leases WHERE namespace = ? FOR SHARE",
                                           (namespace,)))

    def _namespace(self, conn: Db) -> str | None:
        kind, key = self.scope.kind, self.scope.key
        if kind == "namespace":
            return key
        if kind == "task":
            found = conn.scalar("SELECT s.namespace FROM tasks t JOIN sessions s ON s.session_id = t.session_id "
                                "WHERE t.task_id = ?", (key,))
        else:
            table, column = _ROW_OF[kind]
            found = conn.scalar(f"SELECT namespace FROM {table} WHERE {column} = ?", (key,))
        return None if found is None else str(found)


def lock_fenced_session(conn: Db, fence: Fence, session_id: str) -> int | None:
    """``lock_session`` with the fence folded in (one statement): the session's row FOR UPDATE, its namespace's
    lease row FOR SHARE, the epoch verified; its last seq (None: no such session)."""
    for last_seq, namespace, epoch in conn.execute(
            "SELECT s.last_seq, s.namespace, l.epoch FROM sessions s JOIN namespace_leases l "
            "ON l.namespace = s.namespace WHERE s.session_id = ? FOR UPDATE OF s FOR SHARE OF l", (session_id,)):
        fence.verify(str(namespace), int(epoch))
        return int(last_seq)
    namespace = conn.scalar("SELECT namespace FROM sessions WHERE session_id = ?", (session_id,))
    if namespace is not None:
        raise Fenced(str(namespace), fence.epochs.get(str(namespace)))  # no lease: nobody holds the namespace
    return None
