"""Webhook endpoints and their outbox, as stored: plain SQL both engines run (``_schema`` and ``_pg_schema`` create
the tables from ``WEBHOOK_TABLES``).

A delivery row is written in the transaction that records what causes it: ``outbox_for_events`` runs inside
``insert_events`` (an INSERT … SELECT from the endpoints subscribed to the event's kind in the session's namespace),
so no event commits without its deliveries and none commits twice. The delivery loop claims due rows for a while
(``claim_deliveries``: a crashed claimer's rows are due again once its claim lapses), and records each attempt.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from codesdk.protocol import WEBHOOK_ALL_KINDS, WEBHOOK_EVENT_KINDS, DeliveryState

from ._db import Db
from ._errors import StoreError
from ._time import from_text, now_text, to_text

#: The tables, for SQLite and PostgreSQL (``{rowid}``: PostgreSQL's identity column; SQLite has its own rowid).
WEBHOOK_TABLES = """
        CREATE TABLE webhooks (
            {rowid}webhook_id TEXT PRIMARY KEY,
            url TEXT NOT NULL,
            namespace TEXT,
            description TEXT NOT NULL DEFAULT '',
            secret TEXT NOT NULL,
            previous_secret TEXT,
            previous_valid_until TEXT,
            created_at TEXT NOT NULL,
            created_by TEXT NOT NULL,
            disabled INTEGER NOT NULL DEFAULT 0 CHECK (disabled IN (0, 1))
        );
        CREATE INDEX webhooks_by_namespace ON webhooks(namespace);
        CREATE TABLE webhook_kinds (
            webhook_id TEXT NOT NULL REFERENCES webhooks(webhook_id),
            kind TEXT NOT NULL,
            PRIMARY KEY (webhook_id, kind)
        );
        CREATE INDEX webhook_kinds_by_kind ON webhook_kinds(kind);
        CREATE TABLE webhook_deliveries (
            {rowid}delivery_id TEXT PRIMARY KEY,
            webhook_id TEXT NOT NULL,
            kind TEXT NOT NULL,
            namespace TEXT,
            session_id TEXT,
            seq BIGINT,
            task_id TEXT,
            data TEXT,
            state TEXT NOT NULL CHECK (state IN ('pending', 'delivered', 'dead')),
            attempts INTEGER NOT NULL DEFAULT 0,
            next_attempt_at TEXT,
            claimed_until TEXT,
            last_error TEXT,
            created_at TEXT NOT NULL,
            delivered_at TEXT
        );
        CREATE INDEX webhook_deliveries_due ON webhook_deliveries(next_attempt_at) WHERE state = 'pending';
        CREATE INDEX webhook_deliveries_by_webhook ON webhook_deliveries(webhook_id, created_at);
        CREATE TABLE webhook_attempts (
            delivery_id TEXT NOT NULL,
            attempt INTEGER NOT NULL,
            at TEXT NOT NULL,
            status INTEGER,
            error TEXT,
            duration_ms INTEGER NOT NULL,
            PRIMARY KEY (delivery_id, attempt)
        );
"""


class UnknownWebhook(StoreError, LookupError):
    def __init__(self, webhook_id: str) -> None:
        self.webhook_id = webhook_id
        super().__init__(f"no webhook {webhook_id!r}")


class RotationOverlaps(Exception):
    """A rotation asked while the previous one's overlap runs (409): rotating again would drop a secret that still
    signs, which receivers may still be verifying with."""

    def __init__(self, webhook_id: str, until: datetime) -> None:
        self.webhook_id = webhook_id
        self.until = until
        super().__init__(f"webhook {webhook_id}'s previous secret still signs beside the current one until "
                         f"{until.isoformat()}")


class UnknownDelivery(StoreError, LookupError):
    def __init__(self, delivery_id: str) -> None:
        self.delivery_id = delivery_id
        super().__init__(f"no delivery {delivery_id!r}")


@dataclass(frozen=True, slots=True)
class WebhookRecord:
    webhook_id: str
    url: str
    kinds: tuple[str, ...]
    namespace: str | None
    description: str
    secret: str
    previous_secret: str | None
    previous_valid_until: datetime | None
    created_at: datetime
    created_by: str
    disabled: bool

    def secrets(self, now: datetime) -> tuple[str, ...]:
        """The secrets a delivery is signed with now: the current one, and the previous while it overlaps."""
        if self.previous_secret and self.previous_valid_until is not None and now < self.previous_valid_until:
            return (self.secret, self.previous_secret)
        return (self.secret,)


@dataclass(frozen=True, slots=True)
class AttemptRecord:
    at: datetime
    status: int | None
    error: str | None
    duration_ms: int


@dataclass(frozen=True, slots=True)
class DeliveryRecord:
    delivery_id: str
    webhook_id: str
    kind: str
    namespace: str | None
    session_id: str | None
    seq: int | None
    task_id: str | None
    data: dict[str, Any] | None
    state: DeliveryState
    attempts: int
    next_attempt_at: datetime | None
    last_error: str | None
    created_at: datetime
    delivered_at: datetime | None


_WEBHOOK_COLUMNS = ("w.webhook_id, w.url, w.namespace, w.description, w.secret, w.previous_secret, "
                    "w.previous_valid_until, w.created_at, w.created_by, w.disabled")
_DELIVERY_COLUMNS = ("delivery_id, webhook_id, kind, namespace, session_id, seq, task_id, data, state, attempts, "
                     "next_attempt_at, last_error, created_at, delivered_at")


def _kinds(conn: Db, webhook_id: str) -> tuple[str, ...]:
    return tuple(sorted(kind for (kind,) in conn.execute("SELECT kind FROM webhook_kinds WHERE webhook_id = ?",
                                                         (webhook_id,))))


def _webhook(conn: Db, row: Sequence[Any]) -> WebhookRecord:
    (webhook_id, url, namespace, description, secret, previous, previous_until, created_at, created_by,
     disabled) = row
    return WebhookRecord(webhook_id, url, _kinds(conn, webhook_id), namespace, description, secret, previous,
                         from_text(previous_until), datetime.fromisoformat(created_at), created_by, bool(disabled))


def _delivery(row: Sequence[Any]) -> DeliveryRecord:
    (delivery_id, webhook_id, kind, namespace, session_id, seq, task_id, data, state, attempts, next_at,
     last_error, created_at, delivered_at) = row
    return DeliveryRecord(delivery_id, webhook_id, kind, namespace, session_id, None if seq is None else int(seq),
                          task_id, None if data is None else json.loads(data), DeliveryState(state), int(attempts),
                          from_text(next_at), last_error, datetime.fromisoformat(created_at), from_text(delivered_at))


def insert_webhook(conn: Db, record: WebhookRecord) -> WebhookRecord:
    conn.execute(
        "INSERT INTO webhooks(webhook_id, url, namespace, description, secret, created_at, created_by, disabled) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, 0)",
        (record.webhook_id, record.url, record.namespace, record.description, record.secret,
         to_text(record.created_at), record.created_by))
    # '*' stands alone: one row per endpoint and event, whatever else it names
    kinds = (WEBHOOK_ALL_KINDS,) if WEBHOOK_ALL_KINDS in record.kinds else record.kinds
    conn.executemany("INSERT INTO webhook_kinds(webhook_id, kind) VALUES (?, ?)",
                     [(record.webhook_id, kind) for kind in kinds])
    return select_webhook(conn, record.webhook_id)


def select_webhook(conn: Db, webhook_id: str) -> WebhookRecord:
    for row in conn.execute(f"SELECT {_WEBHOOK_COLUMNS} FROM webhooks w WHERE w.webhook_id = ?", (webhook_id,)):
        return _webhook(conn, row)
    raise UnknownWebhook(webhook_id)


def select_webhooks(conn: Db, namespaces: Sequence[str] | None) -> list[WebhookRecord]:
    """Oldest first: every webhook (``namespaces`` None), or those of these namespaces."""
    sql, args = f"SELECT {_WEBHOOK_COLUMNS} FROM webhooks w", list(namespaces or ())
    if namespaces is not None:
        sql += f" WHERE w.namespace IN ({', '.join('?' for _ in namespaces) or 'NULL'})"
    return [_webhook(conn, row) for row in conn.execute(sql + " ORDER BY w.created_at, w.rowid", args).fetchall()]


def delete_webhook(conn: Db, webhook_id: str) -> None:
    """Remove a webhook with its outbox: what it had not been sent is never sent."""
    select_webhook(conn, webhook_id)
    conn.execute("DELETE FROM webhook_attempts WHERE delivery_id IN "
                 "(SELECT delivery_id FROM webhook_deliveries WHERE webhook_id = ?)", (webhook_id,))
    for table in ("webhook_deliveries", "webhook_kinds", "webhooks"):
        conn.execute(f"DELETE FROM {table} WHERE webhook_id = ?", (webhook_id,))


def rotate_secret(conn: Db, webhook_id: str, secret: str, previous_valid_until: datetime, now: datetime,
                  end_overlap: bool) -> WebhookRecord:
    """The current secret becomes the previous one, valid until ``previous_valid_until``; ``secret`` is current.
    While an earlier rotation's previous secret still overlaps, ``RotationOverlaps`` unless ``end_overlap`` (that
    secret then stops signing now). One conditional UPDATE: two rotations at once cannot both pass the check."""
    updated = conn.scalar("UPDATE webhooks SET previous_secret = secret, previous_valid_until = ?, secret = ? "
                          "WHERE webhook_id = ? AND (? = 1 OR previous_secret IS NULL OR previous_valid_until IS NULL "
                          "OR previous_valid_until <= ?) RETURNING webhook_id",
                          (to_text(previous_valid_until), secret, webhook_id, int(end_overlap), to_text(now)))
    if updated is None:
        record = select_webhook(conn, webhook_id)  # UnknownWebhook
        raise RotationOverlaps(webhook_id, record.previous_valid_until or now)
    return select_webhook(conn, webhook_id)


def new_delivery_batch() -> str:
    """The random part of the ids one transaction's deliveries get (each adds what makes it unique there)."""
    return uuid.uuid4().hex[:20]


def outbox_for_events(conn: Db, session_id: str, seqs: Sequence[int]) -> None:
    """Inside ``insert_events``: a delivery for each of these just-inserted events (of a kind some endpoint may
    want) and each endpoint subscribed to its kind in the session's namespace."""
    if not seqs:
        return
    now = now_text()
    kinds = sorted(WEBHOOK_EVENT_KINDS)
    conn.execute(
        "INSERT INTO webhook_deliveries(delivery_id, webhook_id, kind, namespace, session_id, seq, task_id, state, "
        "attempts, next_attempt_at, created_at) "
        "SELECT 'msg_' || ? || 's' || CAST(e.seq AS TEXT) || 'w' || CAST(w.rowid AS TEXT), w.webhook_id, e.type, "
        "s.namespace, e.session_id, e.seq, e.task_id, 'pending', 0, ?, ? "
        "FROM events e JOIN sessions s ON s.session_id = e.session_id "
        "JOIN webhook_kinds k ON k.kind = e.type OR k.kind = ? "
        "JOIN webhooks w ON w.webhook_id = k.webhook_id AND w.disabled = 0 "
        "AND (w.namespace IS NULL OR w.namespace = s.namespace) "
        f"WHERE e.session_id = ? AND e.seq IN ({', '.join('?' for _ in seqs)}) "
        f"AND e.type IN ({', '.join('?' for _ in kinds)})",
        (new_delivery_batch(), now, now, WEBHOOK_ALL_KINDS, session_id, *seqs, *kinds))


def outbox_for(conn: Db, kind: str, namespace: str | None, data: Mapping[str, Any],
               webhook_id: str | None = None) -> list[DeliveryRecord]:
    """A delivery of ``kind`` (not a session's event: a test-send, a quarantine, a lease moved) to each endpoint
    that wants it in ``namespace`` (None: endpoints of every namespace only), or to ``webhook_id`` alone."""
    now = now_text()
    batch = new_delivery_batch()
    where = "w.webhook_id = ?" if webhook_id is not None else (
        "w.disabled = 0 AND (w.namespace IS NULL OR w.namespace = ?) AND EXISTS (SELECT 1 FROM webhook_kinds k "
        "WHERE k.webhook_id = w.webhook_id AND (k.kind = ? OR k.kind = ?))")
    args: tuple[Any, ...] = (webhook_id,) if webhook_id is not None else (namespace, kind, WEBHOOK_ALL_KINDS)
    ids = [str(delivery_id) for (delivery_id,) in conn.execute(
        "INSERT INTO webhook_deliveries(delivery_id, webhook_id, kind, namespace, data, state, attempts, "
        "next_attempt_at, created_at) "
        "SELECT 'msg_' || ? || 'w' || CAST(w.rowid AS TEXT), w.webhook_id, ?, ?, ?, 'pending', 0, ?, ? "
        f"FROM webhooks w WHERE {where} RETURNING delivery_id",
        (batch, kind, namespace, json.dumps(dict(data), separators=(",", ":")), now, now, *args)).fetchall()]
    return [select_delivery(conn, delivery_id) for delivery_id in ids]


def select_delivery(conn: Db, delivery_id: str) -> DeliveryRecord:
    for row in conn.execute(f"SELECT {_DELIVERY_COLUMNS} FROM webhook_deliveries WHERE delivery_id = ?",
                            (delivery_id,)):
        return _delivery(row)
    raise UnknownDelivery(delivery_id)


def select_deliveries(conn: Db, webhook_id: str, state: DeliveryState | None, limit: int,
                      before: str | None = None) -> list[DeliveryRecord]:
    """The webhook's deliveries, newest first: at most ``limit``, those made before delivery ``before`` if given
    (``UnknownDelivery`` unless it is one of this webhook's)."""
    sql = f"SELECT {_DELIVERY_COLUMNS} FROM webhook_deliveries WHERE webhook_id = ?"
    args: list[Any] = [webhook_id]
    if state is not None:
        sql += " AND state = ?"
        args.append(state.value)
    if before is not None:
        found = conn.execute("SELECT created_at, rowid FROM webhook_deliveries WHERE delivery_id = ? AND "
                             "webhook_id = ?", (before, webhook_id)).fetchall()
        if not found:
            raise UnknownDelivery(before)
        [cursor] = found
        sql += " AND (created_at < ? OR (created_at = ? AND rowid < ?))"
        args += [cursor[0], cursor[0], cursor[1]]
    return [_delivery(row) for row in conn.execute(sql + " ORDER BY created_at DESC, rowid DESC LIMIT ?",
                                                   (*args, limit)).fetchall()]


def select_attempts(conn: Db, delivery_id: str) -> list[AttemptRecord]:
    return [AttemptRecord(datetime.fromisoformat(at), None if status is None else int(status), error, int(ms))
            for at, status, error, ms in conn.execute(
                "SELECT at, status, error, duration_ms FROM webhook_attempts WHERE delivery_id = ? ORDER BY attempt",
                (delivery_id,)).fetchall()]


def redeliver(conn: Db, delivery_id: str) -> DeliveryRecord:
    """Due again now, with the same id (a receiver that has it already may drop it); its attempts are kept."""
    now = now_text()
    if conn.scalar("UPDATE webhook_deliveries SET state = 'pending', next_attempt_at = ?, claimed_until = NULL, "
                   "delivered_at = NULL WHERE delivery_id = ? RETURNING delivery_id", (now, delivery_id)) is None:
        raise UnknownDelivery(delivery_id)
    return select_delivery(conn, delivery_id)


def any_due(conn: Db, now: str, busy: Sequence[str] = ()) -> bool:
    """Whether some pending delivery is due and unclaimed, of a webhook not ``busy`` (a read: the loop claims, a
    write, only when so)."""
    others = f" AND webhook_id NOT IN ({', '.join('?' for _ in busy)})" if busy else ""
    return conn.execute("SELECT 1 FROM webhook_deliveries WHERE state = 'pending' AND next_attempt_at <= ? AND "
                        f"(claimed_until IS NULL OR claimed_until < ?){others} LIMIT 1",
                        (now, now, *busy)).fetchall() != []


def count_webhooks(conn: Db, namespace: str | None) -> int:
    """Webhooks of ``namespace`` (None: of every namespace)."""
    if namespace is None:
        return int(conn.scalar("SELECT count(*) FROM webhooks WHERE namespace IS NULL"))
    return int(conn.scalar("SELECT count(*) FROM webhooks WHERE namespace = ?", (namespace,)))


def claim_deliveries(conn: Db, now: str, until: str, room: Mapping[str, int], default_room: int, limit: int,
                     supervisor_id: str | None) -> list[DeliveryRecord]:
    """Due pending deliveries no live claim holds, claimed until ``until``: at most ``room`` per webhook (the
    sends it may still start; ``default_room`` for one not named) and ``limit`` in all. ``supervisor_id`` (on
    PostgreSQL): only of namespaces whose lease it holds or that nobody's live lease holds."""
    lease = ""
    args: list[Any] = [now, now]
    if supervisor_id is not None:
        lease = (" AND (namespace IS NULL OR NOT EXISTS (SELECT 1 FROM namespace_leases l WHERE "
                 "l.namespace = webhook_deliveries.namespace AND l.expires_at > now() AND l.supervisor_id <> ?))")
        args.append(supervisor_id)
    full = [webhook_id for webhook_id, left in room.items() if left <= 0]
    if full:
        lease += f" AND webhook_id NOT IN ({', '.join('?' for _ in full)})"
        args += full
    locking = f"{conn.for_update} SKIP LOCKED" if conn.for_update else ""
    rows = conn.execute(
        "SELECT delivery_id, webhook_id FROM webhook_deliveries WHERE state = 'pending' AND next_attempt_at <= ? "
        f"AND (claimed_until IS NULL OR claimed_until < ?){lease} ORDER BY next_attempt_at LIMIT ?{locking}",
        (*args, limit * 4)).fetchall()
    left = dict(room)
    chosen: list[str] = []
    for delivery_id, webhook_id in rows:
        if left.setdefault(webhook_id, default_room) > 0 and len(chosen) < limit:
            left[webhook_id] -= 1
            chosen.append(delivery_id)
    if not chosen:
        return []
    conn.execute(f"UPDATE webhook_deliveries SET claimed_until = ? WHERE delivery_id IN "
                 f"({', '.join('?' for _ in chosen)})", (until, *chosen))
    return [select_delivery(conn, delivery_id) for delivery_id in chosen]


def record_attempt(conn: Db, delivery_id: str, attempt: AttemptRecord, state: DeliveryState,
                   next_attempt_at: datetime | None) -> DeliveryRecord | None:
    """One attempt's outcome: delivered, due again at ``next_attempt_at``, or dead. None where the delivery went
    meanwhile (its webhook was removed)."""
    number = conn.scalar("UPDATE webhook_deliveries SET attempts = attempts + 1, state = ?, next_attempt_at = ?, "
                         "claimed_until = NULL, last_error = ?, delivered_at = ? WHERE delivery_id = ? "
                         "RETURNING attempts",
                         (state.value, None if next_attempt_at is None else to_text(next_attempt_at),
                          attempt.error if state != DeliveryState.DELIVERED else None,
                          to_text(attempt.at) if state == DeliveryState.DELIVERED else None, delivery_id))
    if number is None:
        return None
    conn.execute("INSERT INTO webhook_attempts(delivery_id, attempt, at, status, error, duration_ms) "
                 "VALUES (?, ?, ?, ?, ?, ?)",
                 (delivery_id, int(number), to_text(attempt.at), attempt.status, attempt.error, attempt.duration_ms))
    return select_delivery(conn, delivery_id)


def prune_deliveries(conn: Db, before: str) -> int:
    """Forget deliveries settled (delivered or dead) and made before ``before``, with their attempts; how many."""
    old = "SELECT delivery_id FROM webhook_deliveries WHERE state <> 'pending' AND created_at < ?"
    conn.execute(f"DELETE FROM webhook_attempts WHERE delivery_id IN ({old})", (before,))
    return len(conn.execute(f"DELETE FROM webhook_deliveries WHERE delivery_id IN ({old}) RETURNING delivery_id",
                            (before,)).fetchall())


def release_claims(conn: Db) -> None:
    """Forget every claim (a sole supervisor starting: whatever claimed them before is gone)."""
    conn.execute("UPDATE webhook_deliveries SET claimed_until = NULL WHERE claimed_until IS NOT NULL")
