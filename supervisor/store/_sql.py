"""Synchronous SQL over one connection (``_db.Db``, SQLite or PostgreSQL): the store's core, run off the trio loop.

Nothing here is async or thread-aware; ``_writer`` and ``_readers`` decide which thread runs it. Write
functions expect to be called inside the writer's transaction (they never BEGIN/COMMIT themselves). The SQL runs
on both engines; where a concurrent writer could interleave (PostgreSQL, several supervisors), the rows a check
depends on are locked first (``lock_session``) or the change is one conditional statement.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from codesdk.protocol import (
    ApprovalState,
    BudgetSpent,
    ForkPoint,
    IsolationLevel,
    NormalizedEvent,
    SessionBudget,
    UpcasterRegistry,
    WEBHOOK_EVENT_KINDS,
    upcasters,
)
from codesdk.protocol.api import SessionFilter

from ._db import Db
from ._fencing import lock_fenced_session
from ._errors import (
    ApprovalDecided,
    InvalidEvent,
    InvalidTransition,
    SessionBusy,
    SessionExists,
    StoreError,
    TaskExists,
    UnknownApproval,
    UnknownSession,
    UnknownTask,
)
from ._quotas import Usage
from ._records import (
    TRANSITIONS,
    ApprovalRecord,
    BlobInfo,
    RequestClaim,
    SessionRecord,
    TaskRecord,
    TaskState,
    TaskUpdate,
)
from ._stored import StoredEvent, wire_body
from ._webhooks import outbox_for_events
from ._time import from_text, now_text, to_text


def dumps(value: Any) -> str:
    return json.dumps(value, allow_nan=False, separators=(",", ":"), ensure_ascii=False)


# --- rows -> records ------------------------------------------------------------------------------

_ACTIVE = "('pending', 'running')"
_SESSION_COLUMNS = (
    "s.session_id, s.runtime, s.namespace, s.workspace, s.created_at, s.metadata, s.runtime_session_id, s.last_seq, "
    "s.title, s.archived_at, s.forked_from, s.forked_at_seq, s.isolation, s.budget, "
    f"(SELECT t.task_id FROM tasks t WHERE t.session_id = s.session_id AND t.state IN {_ACTIVE}) AS active_task_id"
)
_TASK_COLUMNS = (
    "task_id, session_id, state, runtime, created_at, started_at, ended_at, worker_pid, terminal_type, "
    "error, metadata"
)


def _session(row: Sequence[Any]) -> SessionRecord:
    (sid, runtime, namespace, workspace, created_at, metadata, runtime_session_id, last_seq, title, archived_at,
     forked_from, forked_at_seq, isolation, budget, active_task_id) = row
    return SessionRecord(
        session_id=sid,
        runtime=runtime,
        namespace=namespace,
        workspace=workspace,
        created_at=from_text(created_at),
        metadata=json.loads(metadata),
        runtime_session_id=runtime_session_id,
        last_seq=last_seq,
        title=title,
        archived_at=from_text(archived_at) if archived_at is not None else None,
        forked_from=ForkPoint(session_id=forked_from, seq=forked_at_seq) if forked_from is not None else None,
        isolation=IsolationLevel(isolation),
        active_task_id=active_task_id,
        budget=None if budget is None else SessionBudget.model_validate_json(budget),
    )


def _task(row: Sequence[Any]) -> TaskRecord:
    (tid, sid, state, runtime, created_at, started_at, ended_at, pid, terminal_type, error, metadata) = row
    return TaskRecord(
        task_id=tid,
        session_id=sid,
        state=TaskState(state),
        runtime=runtime,
        created_at=from_text(created_at),
        started_at=from_text(started_at),
        ended_at=from_text(ended_at),
        worker_pid=pid,
        terminal_type=terminal_type,
        error=None if error is None else json.loads(error),
        metadata=json.loads(metadata),
    )


def _event(seq: int, body: str, registry: UpcasterRegistry = upcasters) -> NormalizedEvent:
    """A stored row as an event of this build's schema: ``registry`` upcasts a row of an older schema version and
    refuses one of a newer (the store's is ``protocol.upcasters``; tests give one of a fictional later build)."""
    raw = json.loads(body)
    raw["seq"] = seq  # the key column is the one source of seq
    return registry.load(raw)


# --- reads ----------------------------------------------------------------------------------------


def select_session(conn: Db, session_id: str) -> SessionRecord:
    for row in conn.execute(f"SELECT {_SESSION_COLUMNS} FROM sessions s WHERE s.session_id = ?", (session_id,)):
        return _session(row)
    raise UnknownSession(session_id)


#: A listing's state filter (``SessionFilter``) as SQL on ``sessions s``.
_STATE_CLAUSES = {
    SessionFilter.LIVE: "s.archived_at IS NULL",
    SessionFilter.ARCHIVED: "s.archived_at IS NOT NULL",
    SessionFilter.BUSY: f"s.archived_at IS NULL AND EXISTS (SELECT 1 FROM tasks t WHERE t.session_id = s.session_id "
                        f"AND t.state IN {_ACTIVE})",
    SessionFilter.IDLE: f"s.archived_at IS NULL AND NOT EXISTS (SELECT 1 FROM tasks t WHERE t.session_id = "
                        f"s.session_id AND t.state IN {_ACTIVE})",
    SessionFilter.ALL: "",
}


def select_sessions(conn: Db, namespace: str | None, limit: int, offset: int, namespaces: Sequence[str] | None = None,
                    runtime: str | None = None, after: str | None = None, state: SessionFilter = SessionFilter.ALL,
                    text: str | None = None) -> list[SessionRecord]:
    """Oldest first (insertion order): of ``namespace`` or of any of ``namespaces``, of ``runtime``, in ``state``,
    whose title or a task's prompt contains ``text`` (ASCII case ignored), and stored after session ``after`` (a
    cursor: ``UnknownSession`` if there is no such session)."""
    clauses: list[str] = []
    args: list[Any] = []
    if namespace is not None:
        clauses.append("s.namespace = ?")
        args.append(namespace)
    if namespaces is not None:
        if not namespaces:
            return []
        clauses.append(f"s.namespace IN ({','.join('?' * len(namespaces))})")
        args += namespaces
    if runtime is not None:
        clauses.append("s.runtime = ?")
        args.append(runtime)
    if _STATE_CLAUSES[state]:
        clauses.append(_STATE_CLAUSES[state])
    if text is not None:
        found = f"{conn.text_position}(lower(%s), lower(?)) > 0"  # one engine's lower() on both sides
        clauses.append(f"({found % 's.title'} OR EXISTS (SELECT 1 FROM tasks t WHERE t.session_id = s.session_id "
                       f"AND {found % 't.prompt'}))")
        args += [text, text]
    if after is not None:
        for (position,) in conn.execute("SELECT rowid FROM sessions WHERE session_id = ?", (after,)):
            clauses.append("s.rowid > ?")
            args.append(position)
            break
        else:
            raise UnknownSession(after)
    where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
    sql = f"SELECT {_SESSION_COLUMNS} FROM sessions s {where} ORDER BY s.rowid LIMIT ? OFFSET ?"
    return [_session(row) for row in conn.execute(sql, (*args, limit, offset))]


def lock_session(conn: Db, session_id: str) -> int:
    """Inside a write transaction: hold the session's row until it ends (so checks on the session's tasks and
    appends cannot interleave with another writer's), and return its last seq. A fenced write (``_fencing``)
    checks its namespace's lease in the same statement."""
    if conn.fence is not None and not conn.fence.checked:
        fenced = lock_fenced_session(conn, conn.fence, session_id)
        if fenced is None:
            raise UnknownSession(session_id)
        return fenced
    for (last_seq,) in conn.execute(f"SELECT last_seq FROM sessions WHERE session_id = ?{conn.for_update}",
                                    (session_id,)):
        return int(last_seq)
    raise UnknownSession(session_id)


def lock_session_usage(conn: Db, session_id: str) -> Usage:
    """``lock_session`` and ``select_usage`` in one statement (one round trip on PostgreSQL): the session's row held
    until the transaction ends, and what it and its namespace store (``Usage.session_events`` is its last seq). A
    fenced write checks its namespace's lease in the same statement, as ``lock_session`` does."""
    fence = conn.fence if conn.fence is not None and not conn.fence.checked else None
    usage = ("COALESCE((SELECT u.{0} FROM namespace_usage u WHERE u.namespace = s.namespace), 0)")
    columns = f"s.namespace, s.last_seq, s.stored_bytes, {usage.format('events')}, {usage.format('bytes')}"
    if fence is None:
        sql = f"SELECT {columns}, NULL FROM sessions s WHERE s.session_id = ?{conn.for_update}"
    else:
        sql = (f"SELECT {columns}, l.epoch FROM sessions s JOIN namespace_leases l ON l.namespace = s.namespace "
               "WHERE s.session_id = ? FOR UPDATE OF s FOR SHARE OF l")
    for namespace, events, stored, ns_events, ns_bytes, epoch in conn.execute(sql, (session_id,)):
        if fence is not None:
            fence.verify(str(namespace), int(epoch))
        return Usage(namespace, int(events), int(stored), int(ns_events), int(ns_bytes))
    if fence is not None:
        lock_fenced_session(conn, fence, session_id)  # Fenced when the session is there but its lease is not
    raise UnknownSession(session_id)


def select_last_seq(conn: Db, session_id: str) -> int:
    for (last_seq,) in conn.execute("SELECT last_seq FROM sessions WHERE session_id = ?", (session_id,)):
        return int(last_seq)
    raise UnknownSession(session_id)


def select_task(conn: Db, task_id: str, *, lock: bool = False) -> TaskRecord:
    """``lock``: inside a write transaction, hold the task's row until it ends (its state is about to change)."""
    for row in conn.execute(f"SELECT {_TASK_COLUMNS} FROM tasks WHERE task_id = ?{conn.for_update if lock else ''}",
                            (task_id,)):
        return _task(row)
    raise UnknownTask(task_id)


def select_tasks(conn: Db, session_id: str) -> list[TaskRecord]:
    """Oldest first. Raises ``UnknownSession`` rather than returning [] for a session that isn't there."""
    rows = conn.execute(
        f"SELECT {_TASK_COLUMNS} FROM tasks WHERE session_id = ? ORDER BY created_at, rowid", (session_id,)
    ).fetchall()
    if not rows:
        select_last_seq(conn, session_id)
    return [_task(row) for row in rows]


def select_active_tasks(conn: Db, namespace: str | None = None) -> list[TaskRecord]:
    """Tasks still pending or running (in the namespace's sessions), oldest first (after a restart or a takeover:
    tasks whose supervisor died)."""
    sql = f"SELECT {_TASK_COLUMNS} FROM tasks WHERE state IN ('pending', 'running')"
    args: list[Any] = []
    if namespace is not None:
        sql += " AND session_id IN (SELECT session_id FROM sessions WHERE namespace = ?)"
        args.append(namespace)
    return [_task(row) for row in conn.execute(sql + " ORDER BY created_at, rowid", args).fetchall()]


def select_events(conn: Db, session_id: str, after_seq: int, limit: int,
                  registry: UpcasterRegistry = upcasters) -> list[NormalizedEvent]:
    rows = cast(
        list[tuple[int, str]],
        conn.execute(
            "SELECT seq, body FROM events WHERE session_id = ? AND seq > ? ORDER BY seq LIMIT ?",
            (session_id, after_seq, limit),
        ).fetchall(),
    )
    if not rows:
        select_last_seq(conn, session_id)  # unknown session -> UnknownSession, not []
    return [_event(seq, body, registry) for seq, body in rows]


def select_stored_events(conn: Db, session_id: str, after_seq: int, limit: int,
                         registry: UpcasterRegistry = upcasters) -> list[StoredEvent]:
    """``select_events`` in the form a stream sends on."""
    return [StoredEvent.of(event) for event in select_events(conn, session_id, after_seq, limit, registry)]


def select_events_of_types(conn: Db, session_id: str, types: Sequence[str], after_seq: int,
                           limit: int, task_id: str | None = None,
                           registry: UpcasterRegistry = upcasters) -> list[NormalizedEvent]:
    """Like ``select_events``, only events of these types (and of one task): filtered in SQL, so a session's
    many deltas are never even decoded."""
    marks = ",".join("?" * len(types))
    task_clause = " AND task_id = ?" if task_id is not None else ""
    rows = cast(list[tuple[int, str]], conn.execute(
        f"SELECT seq, body FROM events WHERE session_id = ? AND seq > ? AND type IN ({marks}){task_clause} "
        "ORDER BY seq LIMIT ?",
        (session_id, after_seq, *types, *((task_id,) if task_id is not None else ()), limit)).fetchall())
    return [_event(seq, body, registry) for seq, body in rows]


def claim_request(conn: Db, principal: str, key: str, fingerprint: str, token: str, now: str, expired_before: str,
                  abandoned_before: str) -> RequestClaim:
    """Take ``key`` for this request, or say what holds it (``RequestClaim``). Keys older than ``expired_before``
    are forgotten; a claim never answered since ``abandoned_before`` (its supervisor died answering) is taken over."""
    conn.execute("DELETE FROM api_requests WHERE created_at < ?", (expired_before,))
    conn.execute("DELETE FROM api_requests WHERE principal = ? AND idempotency_key = ? AND status IS NULL AND "
                 "created_at < ?", (principal, key, abandoned_before))
    conn.execute("INSERT INTO api_requests(principal, idempotency_key, fingerprint, claim, created_at) "
                 "VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING", (principal, key, fingerprint, token, now))
    for held_by, status, answer, claim in conn.execute(
            f"SELECT fingerprint, status, answer, claim FROM api_requests WHERE principal = ? AND "
            f"idempotency_key = ?{conn.for_update}", (principal, key)):
        if claim == token:
            return RequestClaim("claimed", token=token)
        if held_by != fingerprint:
            return RequestClaim("mismatch")
        if status is None:
            return RequestClaim("running")
        return RequestClaim("answered", status=int(status), answer=str(answer))
    raise StoreError(f"the idempotency key of {principal} was neither stored nor found")


def finish_request(conn: Db, principal: str, key: str, token: str, status: int | None, answer: str | None) -> None:
    """Keep the answer of the request holding ``token`` (``status`` None: forget the claim, the key is free)."""
    if status is None:
        conn.execute("DELETE FROM api_requests WHERE principal = ? AND idempotency_key = ? AND claim = ?",
                     (principal, key, token))
    else:
        conn.execute("UPDATE api_requests SET status = ?, answer = ? WHERE principal = ? AND idempotency_key = ? "
                     "AND claim = ?", (status, answer, principal, key, token))


def select_events_containing(conn: Db, session_id: str, text: str, after_seq: int, limit: int,
                             registry: UpcasterRegistry = upcasters) -> list[NormalizedEvent]:
    """The session's events whose stored JSON contains ``text``, found by the database's own substring search (a
    session's rows are scanned, not each decoded); an unknown session is ``UnknownSession``."""
    rows = cast(list[tuple[int, str]], conn.execute(
        f"SELECT seq, body FROM events WHERE session_id = ? AND seq > ? AND {conn.text_position}(body, ?) > 0 "
        "ORDER BY seq LIMIT ?", (session_id, after_seq, text, limit)).fetchall())
    if not rows:
        select_last_seq(conn, session_id)
    return [_event(seq, body, registry) for seq, body in rows]


def select_last_event_of_type(conn: Db, session_id: str, event_type: str,
                              registry: UpcasterRegistry = upcasters) -> NormalizedEvent | None:
    """The session's last event of ``event_type`` (a scan from the end, in SQLite)."""
    for seq, body in conn.execute("SELECT seq, body FROM events WHERE session_id = ? AND type = ? "
                                  "ORDER BY seq DESC LIMIT 1", (session_id, event_type)):
        return _event(seq, body, registry)
    select_last_seq(conn, session_id)  # unknown session -> UnknownSession
    return None


def select_keyed_append(conn: Db, session_id: str, key: str,
                        registry: UpcasterRegistry = upcasters) -> list[NormalizedEvent] | None:
    """The events an earlier append with this idempotency key stored, or None if there was none."""
    for first_seq, last_seq in conn.execute(
        "SELECT first_seq, last_seq FROM appends WHERE session_id = ? AND idempotency_key = ?", (session_id, key)
    ):
        return select_events(conn, session_id, first_seq - 1, last_seq - first_seq + 1, registry)
    return None


def insert_keyed_append(conn: Db, session_id: str, key: str, stored: Sequence[StoredEvent]) -> None:
    conn.execute("INSERT INTO appends(session_id, idempotency_key, first_seq, last_seq) VALUES (?, ?, ?, ?)",
                 (session_id, key, stored[0].seq, stored[-1].seq))


def rewrite_probe_row(conn: Db) -> None:
    """Count one more probe in the probe row: the smallest write that must reach the disk to commit. (An empty
    transaction writes nothing, and neither does a row rewritten with the same bytes: they prove only that the
    writer answers, not that a full disk or a lost database is over.)"""
    conn.execute("INSERT INTO store_probe(id, probes) VALUES (1, 1) "
                 "ON CONFLICT(id) DO UPDATE SET probes = store_probe.probes + 1")


def insert_inline_blob(conn: Db, ref: str, data: bytes, media_type: str) -> None:
    """Keep a small blob in the database itself; a blob already known (inline or as a file) is left as it is."""
    conn.execute(
        "INSERT INTO blobs(ref, size, media_type, created_at, content) VALUES (?, ?, ?, ?, ?) "
        "ON CONFLICT(ref) DO NOTHING",
        (ref, len(data), media_type, now_text(), data),
    )


def blob_is_inline(conn: Db, ref: str) -> bool:
    """Whether the blob's bytes are kept in the database (a small one stored with its events): then it has no file,
    and must get none, or deleting its row would leave the file behind."""
    return bool(conn.scalar("SELECT content IS NOT NULL FROM blobs WHERE ref = ?", (ref,)))


def select_blob_content(conn: Db, ref: str) -> bytes | None:
    """The bytes of a blob kept in the database, or None (not known, or kept as a file)."""
    for (content,) in conn.execute("SELECT content FROM blobs WHERE ref = ?", (ref,)):
        return None if content is None else bytes(content)
    return None


def select_blob(conn: Db, ref: str) -> BlobInfo | None:
    for size, media_type, created_at in conn.execute(
        "SELECT size, media_type, created_at FROM blobs WHERE ref = ?", (ref,)
    ):
        return BlobInfo(ref=ref, size=size, media_type=media_type, created_at=from_text(created_at))
    return None


# --- writes (inside the writer's transaction) -----------------------------------------------------


def insert_session(conn: Db, record: SessionRecord) -> SessionRecord:
    fork = record.forked_from
    inserted = conn.execute(
        "INSERT INTO sessions(session_id, runtime, namespace, workspace, created_at, metadata, title, forked_from, "
        "forked_at_seq, isolation, budget) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(session_id) DO NOTHING "
        "RETURNING session_id",
        (
            record.session_id,
            record.runtime,
            record.namespace,
            record.workspace,
            to_text(record.created_at),
            dumps(record.metadata),
            record.title,
            fork.session_id if fork is not None else None,
            fork.seq if fork is not None else None,
            record.isolation.value,
            None if record.budget is None else record.budget.model_dump_json(),
        ),
    ).fetchall()
    if not inserted:
        raise SessionExists(record.session_id)
    return record


def update_session(
    conn: Db,
    session_id: str,
    runtime_session_id: str | None,
    metadata: Mapping[str, Any] | None,
    runtime: str | None = None,
    title: str | None = None,
    archived: bool | None = None,
) -> SessionRecord:
    select_last_seq(conn, session_id)
    if title is not None:  # "" removes it
        conn.execute("UPDATE sessions SET title = ? WHERE session_id = ?", (title or None, session_id))
    if archived is not None:  # archiving again keeps the first time
        conn.execute("UPDATE sessions SET archived_at = CASE WHEN ? THEN COALESCE(archived_at, ?) END "
                     "WHERE session_id = ?", (archived, now_text(), session_id))
    if runtime is not None:
        conn.execute(
            "UPDATE sessions SET runtime = ?, runtime_session_id = ? WHERE session_id = ?",
            (runtime, runtime_session_id, session_id),
        )
    elif runtime_session_id is not None:
        conn.execute(
            "UPDATE sessions SET runtime_session_id = ? WHERE session_id = ?", (runtime_session_id, session_id)
        )
    if metadata is not None:
        conn.execute("UPDATE sessions SET metadata = ? WHERE session_id = ?", (dumps(dict(metadata)), session_id))
    return select_session(conn, session_id)


def insert_task(
    conn: Db,
    *,
    task_id: str,
    session_id: str,
    state: TaskState,
    runtime: str | None,
    metadata: Mapping[str, Any],
    worker_pid: int | None,
) -> TaskRecord:
    """Insert a PENDING or RUNNING task; ``runtime`` defaults to the session's. Its metadata's ``prompt_preview``
    is kept apart too, where session listings search it."""
    lock_session(conn, session_id)
    session = select_session(conn, session_id)
    for _ in conn.execute("SELECT 1 FROM tasks WHERE task_id = ?", (task_id,)):
        raise TaskExists(task_id)
    for active_id, active_state in conn.execute(
        "SELECT task_id, state FROM tasks WHERE session_id = ? AND state IN ('pending', 'running')", (session_id,)
    ):
        raise SessionBusy(session_id, active_id, active_state)
    now = now_text()
    conn.execute(
        "INSERT INTO tasks(task_id, session_id, state, runtime, created_at, started_at, worker_pid, metadata, prompt) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            task_id,
            session_id,
            state.value,
            runtime or session.runtime,
            now,
            now if state is TaskState.RUNNING else None,
            worker_pid,
            dumps(dict(metadata)),
            # searched, not shown: without the NULs no PostgreSQL text can hold
            prompt.replace("\x00", "") if isinstance(prompt := metadata.get("prompt_preview"), str) else None,
        ),
    )
    return select_task(conn, task_id)


def apply_task_update(conn: Db, update: TaskUpdate, session_id: str | None = None) -> TaskRecord:
    """Apply ``update`` (checking the state transition); ``session_id`` insists the task belongs to it."""
    current = select_task(conn, update.task_id, lock=True)  # a task ends once, whoever else tries at the same time
    if session_id is not None and current.session_id != session_id:
        raise InvalidEvent(f"task {update.task_id!r} belongs to session {current.session_id!r}, not {session_id!r}")
    changes: dict[str, Any] = {}
    state = update.state
    if state is not None and state != current.state:
        if state not in TRANSITIONS[current.state]:
            raise InvalidTransition(update.task_id, current.state, state)
        changes["state"] = state.value
        if state is TaskState.RUNNING:
            changes["started_at"] = now_text()
        if state.is_terminal:
            changes["ended_at"] = to_text(update.ended_at) if update.ended_at else now_text()
            changes["terminal_type"] = update.terminal_type or str(state.terminal_event)
    elif state is not None and state.is_terminal:
        raise InvalidTransition(update.task_id, current.state, state)  # a task ends exactly once
    if update.worker_pid is not None:
        changes["worker_pid"] = update.worker_pid
    if update.terminal_type is not None:
        changes["terminal_type"] = update.terminal_type
    if update.error is not None:
        changes["error"] = dumps(dict(update.error))
    if update.ended_at is not None:
        changes["ended_at"] = to_text(update.ended_at)
    if update.metadata is not None:
        changes["metadata"] = dumps(dict(update.metadata))
    if changes:
        assignments = ", ".join(f"{column} = ?" for column in changes)
        conn.execute(f"UPDATE tasks SET {assignments} WHERE task_id = ?", (*changes.values(), update.task_id))
    return select_task(conn, update.task_id)


class PreparedEvent:
    """A validated, serialized draft: its ``body`` (JSON without ``seq``) and the columns of its row. The model is
    made only on demand (``model``), with the seq the store gave it."""

    __slots__ = ("_make", "body", "schema_version", "task_id", "time", "type")

    def __init__(self, *, task_id: str | None, type: str, time: str, body: str, schema_version: int,
                 make: Callable[[int], NormalizedEvent]) -> None:
        self.task_id = task_id
        self.type = type
        self.time = time
        self.body = body
        self.schema_version = schema_version
        self._make = make

    def model(self, seq: int) -> NormalizedEvent:
        return self._make(seq)


def insert_events(
    conn: Db, session_id: str, events: Sequence[PreparedEvent], cost: BatchCost | None = None,
    last_seq: int | None = None,
) -> list[StoredEvent]:
    """Give ``events`` the next seqs of the session and insert them; return them as stored. ``cost``
    (``batch_cost``): its bytes are added to the session's and its namespace's usage, with the number of events,
    and the session holds the blobs it names. ``last_seq``: the session's, read under ``lock_session`` in this
    transaction; then nothing here waits for an answer (a pipelined transaction sends it all at once)."""
    stored_bytes = cost.bytes if cost is not None else 0
    update = ("UPDATE sessions SET last_seq = last_seq + ?, stored_bytes = stored_bytes + ? WHERE session_id = ?",
              (len(events), stored_bytes, session_id))
    if last_seq is None:
        last = conn.scalar(update[0] + " RETURNING last_seq", update[1])
        if last is None:
            raise UnknownSession(session_id)
        last_seq = int(last) - len(events)
    else:
        conn.execute(*update)
    seq = last_seq  # the seqs are ours: the session's row is held until commit
    stored: list[StoredEvent] = []
    rows = []
    for prepared in events:
        seq += 1
        version = prepared.schema_version
        rows.append((session_id, seq, prepared.task_id, prepared.type, prepared.time, version, prepared.body))
        stored.append(StoredEvent(seq, prepared.type, wire_body(prepared.body, seq, version), make=prepared.model))
    conn.executemany(
        "INSERT INTO events(session_id, seq, task_id, type, time, schema_version, body) "
        "VALUES (?, ?, ?, ?, ?, ?, ?)",
        rows,
    )
    conn.execute(
        "INSERT INTO namespace_usage(namespace, events, bytes) SELECT namespace, ?, ? FROM sessions "
        "WHERE session_id = ? ON CONFLICT(namespace) DO UPDATE SET events = namespace_usage.events + excluded.events, "
        "bytes = namespace_usage.bytes + excluded.bytes",
        (len(events), stored_bytes, session_id),
    )
    if cost is not None:
        hold_blobs(conn, session_id, cost.blobs)
    # the deliveries these events cause commit with them (the kinds are few: most batches run no more SQL)
    outbox_for_events(conn, session_id, [row[1] for row in rows if row[3] in WEBHOOK_EVENT_KINDS])
    return stored


# --- accounting (quotas, and which sessions hold a blob) -------------------------------------------

_BLOB_REF = re.compile(r"sha256:[0-9a-f]{64}")


@dataclass(frozen=True, slots=True)
class BatchCost:
    """What storing a batch of events costs."""

    #: Their bodies (UTF-8), the small blobs committed with them and the stored blobs they name.
    bytes: int
    #: The stored blobs they name and the small blobs committed with them: their session holds these.
    blobs: tuple[str, ...]


def named_refs(body: str) -> set[str]:
    """Every blob ref an event's JSON contains, in any field: what keeps a blob stored (a superset of what the
    session may read back, ``protocol.named_blobs``)."""
    return set(_BLOB_REF.findall(body)) if "sha256:" in body else set()


def batch_cost(conn: Db, events: Sequence[PreparedEvent], inline: Mapping[str, bytes]) -> BatchCost:
    """What storing ``events`` costs: their bodies, the small blobs committed with them (``inline``: ref -> bytes),
    and the stored blobs they name (each once per batch, however it was stored — put on its own, or carried by an
    earlier batch; refs that name no blob, like input hashes, cost nothing)."""
    total = sum(len(e.body) if e.body.isascii() else len(e.body.encode()) for e in events)
    total += sum(len(data) for data in inline.values())
    refs: set[str] = set()
    for event in events:
        refs |= named_refs(event.body)
    refs.difference_update(inline)
    stored = stored_blob_sizes(conn, refs)
    return BatchCost(total + sum(stored.values()), (*inline, *sorted(stored)))


def stored_blob_sizes(conn: Db, refs: Collection[str]) -> dict[str, int]:
    """Of ``refs``, those of stored blobs (a row in ``blobs``), with their sizes."""
    ordered = sorted(refs)
    found: dict[str, int] = {}
    for start in range(0, len(ordered), 500):
        chunk = ordered[start:start + 500]
        found.update((ref, int(size)) for ref, size in conn.execute(
            f"SELECT ref, size FROM blobs WHERE ref IN ({','.join('?' * len(chunk))})", chunk))
    return found


def hold_named_blobs(conn: Db, page: int = 1000) -> None:
    """Each session holds the stored blobs its events name: the holders of a store from before they were kept
    (a migration's backfill), read a page of events at a time."""
    last: tuple[str, int] = ("", 0)
    while True:
        rows = conn.execute(
            "SELECT session_id, seq, body FROM events WHERE (session_id, seq) > (?, ?) "
            f"AND {conn.text_position}(body, 'sha256:') > 0 ORDER BY session_id, seq LIMIT ?", (*last, page)
        ).fetchall()
        if not rows:
            return
        named: dict[str, set[str]] = {}
        for session_id, _, body in rows:
            named.setdefault(session_id, set()).update(named_refs(body))
        stored = stored_blob_sizes(conn, set().union(*named.values()))
        for session_id, refs in named.items():
            hold_blobs(conn, session_id, sorted(refs & stored.keys()))
        last = (rows[-1][0], int(rows[-1][1]))


def hold_blobs(conn: Db, session_id: str, refs: Sequence[str]) -> None:
    """The session holds these blobs: they stay stored while it exists (``drop_session``)."""
    if refs:
        conn.executemany("INSERT INTO blob_holders(ref, session_id) VALUES (?, ?) ON CONFLICT DO NOTHING",
                         [(ref, session_id) for ref in refs])


def select_usage(conn: Db, session_id: str) -> Usage:
    for namespace, events, stored, ns_events, ns_bytes in conn.execute(
        "SELECT s.namespace, s.last_seq, s.stored_bytes, COALESCE(u.events, 0), COALESCE(u.bytes, 0) "
        "FROM sessions s LEFT JOIN namespace_usage u ON u.namespace = s.namespace WHERE s.session_id = ?",
        (session_id,),
    ):
        return Usage(namespace, events, stored, ns_events, ns_bytes)
    raise UnknownSession(session_id)


def namespace_totals(conn: Db, namespace: str) -> tuple[int, int, int]:
    """(sessions, events stored, bytes stored) of the namespace."""
    sessions = int(conn.scalar("SELECT count(*) FROM sessions WHERE namespace = ?", (namespace,)))
    for events, stored in conn.execute("SELECT events, bytes FROM namespace_usage WHERE namespace = ?", (namespace,)):
        return sessions, int(events), int(stored)
    return sessions, 0, 0


def count_active_tasks(conn: Db, namespace: str) -> int:
    """Tasks pending or running in the namespace's sessions."""
    return int(conn.scalar(
        "SELECT count(*) FROM tasks JOIN sessions USING (session_id) "
        "WHERE tasks.state IN ('pending', 'running') AND sessions.namespace = ?", (namespace,)))


@dataclass(frozen=True, slots=True)
class DroppedSession:
    """What ``drop_session`` removed."""

    session: SessionRecord
    events: int
    stored_bytes: int
    #: Blobs removed (no other session held them), and which of those are files to unlink once this commits.
    blobs: tuple[str, ...]
    blob_files: tuple[str, ...]
    #: Another session works in its workspace (a fork): the workspace must stay.
    workspace_shared: bool


def drop_session(conn: Db, session_id: str) -> DroppedSession:
    """Remove an idle session whole (``SessionBusy`` while a task of it is pending or running): its events, tasks,
    approvals and keyed appends, its usage from its namespace's, and the blobs no other session holds."""
    lock_session(conn, session_id)
    session = select_session(conn, session_id)
    for active_id, active_state in conn.execute(
        f"SELECT task_id, state FROM tasks WHERE session_id = ? AND state IN {_ACTIVE}", (session_id,)
    ):
        raise SessionBusy(session_id, active_id, active_state)
    stored_bytes = int(conn.scalar("SELECT stored_bytes FROM sessions WHERE session_id = ?", (session_id,)))
    held = sorted(ref for (ref,) in conn.execute("SELECT ref FROM blob_holders WHERE session_id = ?", (session_id,)))
    for table in ("events", "approvals", "questions", "tasks", "appends", "blob_holders"):  # these name tasks: first
        conn.execute(f"DELETE FROM {table} WHERE session_id = ?", (session_id,))
    conn.execute("DELETE FROM sessions WHERE session_id = ?", (session_id,))
    conn.execute("UPDATE namespace_usage SET events = CASE WHEN events > ? THEN events - ? ELSE 0 END, "
                 "bytes = CASE WHEN bytes > ? THEN bytes - ? ELSE 0 END WHERE namespace = ?",
                 (session.last_seq, session.last_seq, stored_bytes, stored_bytes, session.namespace))
    removed: list[str] = []
    files: list[str] = []
    for start in range(0, len(held), 500):
        chunk = held[start:start + 500]
        for ref, as_file in conn.execute(
            f"DELETE FROM blobs WHERE ref IN ({','.join('?' * len(chunk))}) AND NOT EXISTS "
            "(SELECT 1 FROM blob_holders h WHERE h.ref = blobs.ref) RETURNING ref, content IS NULL", chunk
        ):
            removed.append(ref)
            if as_file:
                files.append(ref)
    shared = session.workspace is not None and conn.scalar(
        "SELECT count(*) FROM sessions WHERE workspace = ?", (session.workspace,))
    return DroppedSession(session, session.last_seq, stored_bytes, tuple(removed), tuple(files), bool(shared))


def unheld_blob_files(conn: Db, refs: Sequence[str]) -> list[str]:
    """Of ``refs``, those with no row (no session holds them): their files may go. Inside the writer, so that no
    ``put_blob`` can record one of them meanwhile (it records the row before it writes the file)."""
    kept = stored_blob_sizes(conn, refs)
    return [ref for ref in refs if ref not in kept]


def insert_blob(conn: Db, info: BlobInfo) -> None:
    """Record a blob's metadata; the first writer's media type wins."""
    conn.execute(
        "INSERT INTO blobs(ref, size, media_type, created_at) VALUES (?, ?, ?, ?) ON CONFLICT(ref) DO NOTHING",
        (info.ref, info.size, info.media_type, now_text() if info.created_at is None else to_text(info.created_at)),
    )


_APPROVAL_COLUMNS = ("approval_id, session_id, task_id, namespace, tool_call_id, attempt, tool_name, tool_class, "
                     "input, reason, state, created_at, expires_at, decided_at, decided_by, decision_reason")


def _approval(row: Sequence[Any]) -> ApprovalRecord:
    (approval_id, session_id, task_id, namespace, tool_call_id, attempt, tool_name, tool_class, input_text, reason,
     state, created_at, expires_at, decided_at, decided_by, decision_reason) = row
    return ApprovalRecord(
        approval_id=approval_id, session_id=session_id, task_id=task_id, namespace=namespace,
        tool_call_id=tool_call_id, attempt=attempt, tool_name=tool_name, tool_class=tool_class,
        input=json.loads(input_text), reason=reason, state=ApprovalState(state), created_at=from_text(created_at),
        expires_at=from_text(expires_at), decided_at=from_text(decided_at) if decided_at else None,
        decided_by=decided_by, decision_reason=decision_reason)


def insert_approval(conn: Db, record: ApprovalRecord) -> ApprovalRecord:
    conn.execute(
        f"INSERT INTO approvals ({_APPROVAL_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, NULL, NULL)",
        (record.approval_id, record.session_id, record.task_id, record.namespace, record.tool_call_id,
         record.attempt, record.tool_name, record.tool_class, dumps(record.input), record.reason,
         ApprovalState.PENDING.value,
         to_text(record.created_at), to_text(record.expires_at)))
    return select_approval(conn, record.approval_id)


def select_approval(conn: Db, approval_id: str) -> ApprovalRecord:
    for row in conn.execute(f"SELECT {_APPROVAL_COLUMNS} FROM approvals WHERE approval_id = ?", (approval_id,)):
        return _approval(row)
    raise UnknownApproval(approval_id)


def select_approvals(conn: Db, state: ApprovalState | None,
                     namespaces: Sequence[str] | None) -> list[ApprovalRecord]:
    sql = f"SELECT {_APPROVAL_COLUMNS} FROM approvals"
    where, args = [], []
    if state is not None:
        where.append("state = ?")
        args.append(state.value)
    if namespaces is not None:
        where.append(f"namespace IN ({', '.join('?' for _ in namespaces) or 'NULL'})")
        args.extend(namespaces)
    if where:
        sql += " WHERE " + " AND ".join(where)
    return [_approval(row) for row in conn.execute(sql + " ORDER BY created_at, rowid", args)]


def decide_approval(conn: Db, approval_id: str, state: ApprovalState, decided_by: str,
                    reason: str) -> ApprovalRecord:
    """Pending -> approved/denied/expired, exactly once (a second decision raises ApprovalDecided): one conditional
    update, so two supervisors deciding at once cannot both win."""
    decided = conn.scalar("UPDATE approvals SET state = ?, decided_at = ?, decided_by = ?, decision_reason = ? "
                          "WHERE approval_id = ? AND state = ? RETURNING approval_id",
                          (state.value, now_text(), decided_by, reason, approval_id, ApprovalState.PENDING.value))
    if decided is None:
        raise ApprovalDecided(approval_id, select_approval(conn, approval_id).state)  # or UnknownApproval
    return select_approval(conn, approval_id)


def extend_approval(conn: Db, approval_id: str, expires_at: datetime) -> ApprovalRecord:
    """A pending approval's deadline moved (routing gave it its whole timeout once someone could answer it); a
    decided one is left as it is."""
    conn.execute("UPDATE approvals SET expires_at = ? WHERE approval_id = ? AND state = ?",
                 (to_text(expires_at), approval_id, ApprovalState.PENDING.value))
    return select_approval(conn, approval_id)

# --- budgets --------------------------------------------------------------------------------------


def change_budget(conn: Db, session_id: str,
                  change: Callable[[SessionBudget | None], SessionBudget | None]) -> SessionRecord:
    """Replace the session's budget with ``change(its budget)`` (None: leave it), read and written in one
    transaction so that spending and raising never lose each other's change."""
    lock_session(conn, session_id)
    before = select_session(conn, session_id).budget
    after = change(before)
    if after is not None and after != before:
        conn.execute("UPDATE sessions SET budget = ? WHERE session_id = ?", (after.model_dump_json(), session_id))
    return select_session(conn, session_id)


def add_namespace_spend(conn: Db, namespace: str, month: str, spent: BudgetSpent) -> None:
    """Add to the namespace's spend of ``month`` (``YYYY-MM``, UTC): one row per namespace and month."""
    conn.execute(
        "INSERT INTO namespace_spend(namespace, month, cost_usd, tokens, unpriced_reports) VALUES (?, ?, ?, ?, ?) "
        "ON CONFLICT(namespace, month) DO UPDATE SET cost_usd = namespace_spend.cost_usd + excluded.cost_usd, "
        "tokens = namespace_spend.tokens + excluded.tokens, "
        "unpriced_reports = namespace_spend.unpriced_reports + excluded.unpriced_reports",
        (namespace, month, spent.cost_usd, spent.tokens, spent.unpriced_reports))


def select_namespace_spend(conn: Db, namespace: str, month: str) -> BudgetSpent:
    for cost, tokens, unpriced in conn.execute(
            "SELECT cost_usd, tokens, unpriced_reports FROM namespace_spend WHERE namespace = ? AND month = ?",
            (namespace, month)):
        return BudgetSpent(cost_usd=float(cost), tokens=int(tokens), unpriced_reports=int(unpriced))
    return BudgetSpent()
