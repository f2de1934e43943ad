"""Webhooks, sans-IO: the Standard Webhooks signature scheme, the payload, the kinds an endpoint subscribes to and
the retry schedule (https://www.standardwebhooks.com/).

A delivery is signed as ``v1,<base64 HMAC-SHA256(key, "{webhook-id}.{webhook-timestamp}.{body}")>`` in the
``webhook-signature`` header; the key is the endpoint's secret, ``whsec_<base64 key>``. While a rotated secret still
overlaps, the header carries one signature per secret, space-separated, so a receiver holding either verifies.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import Field

from ._base import Model

SECRET_PREFIX = "whsec_"
#: Bytes of key a new secret holds (Standard Webhooks asks for 24 to 64).
SECRET_BYTES = 32
SIGNATURE_VERSION = "v1"
#: Seconds a receiver accepts a timestamp off its clock (the spec's default).
TIMESTAMP_TOLERANCE_S = 5 * 60
#: A webhook id (``wh_…``) and a delivery id, which is also the ``webhook-id`` header (``msg_…``).
WEBHOOK_ID_PATTERN = r"^wh_[0-9a-z]{1,64}$"
DELIVERY_ID_PATTERN = r"^msg_[0-9a-z]{1,64}$"


class WebhookKind(StrEnum):
    """What an endpoint subscribes to; ``*`` (``ALL_KINDS``) is every one."""

    TASK_COMPLETED = "task.completed"
    TASK_FAILED = "task.failed"
    TASK_STOPPED = "task.stopped"
    APPROVAL_REQUESTED = "approval.requested"
    QUESTION_REQUESTED = "question.requested"
    APPROVAL_ESCALATED = "approval.escalated"
    QUESTION_ESCALATED = "question.escalated"
    BUDGET_REACHED = "budget.reached"
    WORKER_QUARANTINED = "worker.quarantined"
    LEASE_MOVED = "lease.moved"
    WEBHOOK_TEST = "webhook.test"


ALL_KINDS = "*"
#: The kinds a session's stored event of the same type causes (the outbox rows ``insert_events`` writes).
EVENT_KINDS = frozenset({
    WebhookKind.TASK_COMPLETED, WebhookKind.TASK_FAILED, WebhookKind.TASK_STOPPED, WebhookKind.APPROVAL_REQUESTED,
    WebhookKind.QUESTION_REQUESTED, WebhookKind.APPROVAL_ESCALATED, WebhookKind.QUESTION_ESCALATED,
    WebhookKind.BUDGET_REACHED})


class DeliveryState(StrEnum):
    PENDING = "pending"
    DELIVERED = "delivered"
    DEAD = "dead"


class WebhookSignatureError(ValueError):
    """A delivery whose headers do not verify (missing, stale, or signed with another secret)."""


def parse_kinds(kinds: Sequence[str]) -> tuple[str, ...]:
    """The kinds an endpoint asked for, checked, deduplicated and sorted (``ValueError`` names the unknown ones)."""
    known = {kind.value for kind in WebhookKind}
    unknown = [kind for kind in kinds if kind != ALL_KINDS and kind not in known]
    if unknown:
        raise ValueError(f"unknown kind(s) {', '.join(map(repr, unknown))}: use {ALL_KINDS!r} or any of "
                         f"{', '.join(sorted(known))}")
    if not kinds:
        raise ValueError(f"name at least one kind ({ALL_KINDS!r} for all)")
    return tuple(sorted(set(kinds)))


def wants(kinds: Sequence[str], kind: str) -> bool:
    """Whether an endpoint subscribed to ``kinds`` gets ``kind``: every endpoint gets its own test-sends."""
    return kind == WebhookKind.WEBHOOK_TEST or ALL_KINDS in kinds or kind in kinds


def secret_key(secret: str) -> bytes:
    """The key of a ``whsec_…`` secret (``ValueError`` for anything else)."""
    if not secret.startswith(SECRET_PREFIX):
        raise ValueError(f"a webhook secret starts with {SECRET_PREFIX!r}")
    try:
        key = base64.b64decode(secret.removeprefix(SECRET_PREFIX), validate=True)
    except binascii.Error:
        raise ValueError("a webhook secret is whsec_ followed by base64") from None
    if not key:
        raise ValueError("a webhook secret holds at least one byte of key")
    return key


def make_secret(key: bytes) -> str:
    """The ``whsec_…`` form of ``key`` (the caller draws it: ``secrets.token_bytes(SECRET_BYTES)``)."""
    return SECRET_PREFIX + base64.b64encode(key).decode()


def signature(secret: str, webhook_id: str, timestamp: int, body: bytes) -> str:
    """One ``v1,<base64>`` signature of ``body`` sent as ``webhook_id`` at ``timestamp`` (Unix seconds)."""
    signed = f"{webhook_id}.{timestamp}.".encode() + body
    digest = hmac.new(secret_key(secret), signed, hashlib.sha256).digest()
    return f"{SIGNATURE_VERSION},{base64.b64encode(digest).decode()}"


def signed_headers(secrets: Sequence[str], webhook_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The three Standard Webhooks headers, signed with each of ``secrets`` (the current one first)."""
    if not secrets:
        raise ValueError("a delivery is signed with at least one secret")
    return {"webhook-id": webhook_id, "webhook-timestamp": str(timestamp),
            "webhook-signature": " ".join(signature(s, webhook_id, timestamp, body) for s in secrets)}


def verify(secret: str, headers: Mapping[str, str], body: bytes, now: int,
           tolerance_s: int = TIMESTAMP_TOLERANCE_S) -> None:
    """Raise ``WebhookSignatureError`` unless one of the ``webhook-signature`` header's ``v1`` signatures is
    ``secret``'s over this id, timestamp and body, and the timestamp is within ``tolerance_s`` of ``now``."""
    lowered = {name.lower(): value for name, value in headers.items()}
    try:
        webhook_id, stamp, signatures = (lowered["webhook-id"], lowered["webhook-timestamp"],
                                         lowered["webhook-signature"])
    except KeyError as exc:
        raise WebhookSignatureError(f"missing header {exc.args[0]}") from None
    if not re.fullmatch(r"[0-9]{1,12}", stamp):
        raise WebhookSignatureError("webhook-timestamp is not a number of seconds")
    if abs(now - int(stamp)) > tolerance_s:
        raise WebhookSignatureError("webhook-timestamp is too far from now")
    expected = signature(secret, webhook_id, int(stamp), body).encode()
    for candidate in signatures.split(" "):
        if candidate.startswith(f"{SIGNATURE_VERSION},") and hmac.compare_digest(candidate.encode(), expected):
            return
    raise WebhookSignatureError("no signature matches the secret")


class WebhookPayload(Model):
    """The JSON body of a delivery: what happened (``type``: its kind), when, and its details."""

    type: str
    timestamp: datetime
    data: dict[str, Any] = Field(default_factory=dict)

    def body(self) -> bytes:
        return self.model_dump_json().encode()


#: The retry schedule: the first retry after ``RETRY_BASE_S``, each next one twice as late, at most ``RETRY_CAP_S``.
RETRY_BASE_S = 5.0
RETRY_CAP_S = 3600.0
#: Attempts before a delivery is dead (not tried again unless redelivered): about a day with the defaults.
MAX_ATTEMPTS = 12


def retry_delay(failed_attempts: int, draw: float, base_s: float = RETRY_BASE_S, cap_s: float = RETRY_CAP_S) -> float:
    """Seconds until the next attempt after ``failed_attempts`` failures (>= 1): exponential, capped, with jitter
    (``draw`` in [0, 1) takes it anywhere from half the step to the whole), so endpoints that fail together are not
    retried in step."""
    if failed_attempts < 1:
        raise ValueError("a retry follows at least one failed attempt")
    if not 0 <= draw < 1:
        raise ValueError("draw is in [0, 1)")
    step = min(cap_s, base_s * 2.0 ** min(failed_attempts - 1, 64))
    return step / 2 + step / 2 * draw
