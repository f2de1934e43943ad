"""The webhook service: registering endpoints, and the delivery loop that sends the outbox.

The loop runs in a nursery of its own (``WebhookService.run``, started by the service beside the API). It looks for
due deliveries (a read), claims a few (a write that marks them claimed for ``claim_s``), and sends each in a task of
its own: at most ``per_endpoint`` at once to one endpoint, each bounded by ``timeout_s``. A slow or dead endpoint
therefore holds only its own slots; every other endpoint's deliveries and the event path go on. An attempt that
fails is due again after the backoff (``protocol.retry_delay``); after ``max_attempts`` the delivery is dead.
A delivery claimed by a process that died is due again once its claim lapses (on SQLite at once: the sole
supervisor forgets every claim when it starts), so each is sent at least once, always with its own id.
"""

from __future__ import annotations

import logging
import random
import secrets
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import trio

from codesdk.protocol import (
    WEBHOOK_SECRET_BYTES as SECRET_BYTES,
    DeliveryState,
    WebhookKind,
    WebhookPayload,
    make_secret,
    retry_delay,
    signed_headers,
    utc_now,
)
from codesdk.protocol import MAX_WEBHOOK_ATTEMPTS, WEBHOOK_RETRY_BASE_S, WEBHOOK_RETRY_CAP_S

from ..egress import EgressPolicy
from ..ids import new_id
from ..store import (
    AttemptRecord,
    DeliveryRecord,
    EventStore,
    StoreError,
    UnknownSession,
    UnknownWebhook,
    WebhookRecord,
)
from ..tools import Connector, FetchPolicy, FetchTool, Resolver, ToolError, open_tcp, system_resolver
from ._registry import WebhookRegistry, url_refusal

log = logging.getLogger(__name__)

#: The most of an endpoint's answer kept (its first bytes say enough about a failure).
_ANSWER_BYTES = 2048
_USER_AGENT = "codesdk-webhooks/1"
#: Seconds between two prunings of old settled deliveries.
_PRUNE_EVERY_S = 3600.0


@dataclass(frozen=True)
class WebhookOptions:
    """The operator's webhook settings (``serve --webhook-allow`` …)."""

    #: Hosts an endpoint may be on, and non-public addresses it may reach (nothing by default).
    egress: EgressPolicy = field(default_factory=EgressPolicy)
    max_attempts: int = MAX_WEBHOOK_ATTEMPTS
    retry_base_s: float = WEBHOOK_RETRY_BASE_S
    retry_cap_s: float = WEBHOOK_RETRY_CAP_S
    #: Seconds one attempt may take, connecting included.
    timeout_s: float = 10.0
    #: Sends in flight to one endpoint at most.
    per_endpoint: int = 4
    #: Seconds between looks for due deliveries (a test-send or redelivery wakes the loop at once).
    poll_s: float = 0.5
    #: How long a rotated-out secret still signs deliveries beside the new one.
    rotation_overlap_s: float = 24 * 3600.0
    #: Days a delivered or dead delivery (with its attempts) is kept before it is pruned.
    keep_days: float = 30.0
    #: Webhooks one namespace may have (and the admin's of every namespace): each event is written once per
    #: endpoint, in the transaction every tenant's events share.
    max_per_namespace: int = 20
    resolver: Resolver = system_resolver
    connect: Connector = open_tcp

    @property
    def claim_s(self) -> float:
        """A claim outlives the longest attempt, so no live claimer's delivery is taken by another."""
        return self.timeout_s * 2 + 5


class WebhookRefused(ValueError):
    """A registration the operator's policy or the request itself rules out (422): ``field`` is to blame."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(message)
        self.field = field_name


class TooManyWebhooks(Exception):
    """The namespace has as many webhooks as it may (409)."""


class WebhookService:
    """Endpoints and their deliveries, over the store; ``run`` is the delivery loop."""

    def __init__(self, store: EventStore, options: WebhookOptions, *, supervisor_id: str | None = None) -> None:
        self.store = store
        self.options = options
        self.registry = WebhookRegistry()
        #: On PostgreSQL, this supervisor's id: it claims only deliveries of namespaces it leases (or nobody does).
        self._supervisor_id = supervisor_id
        self._sender = FetchTool(FetchPolicy(egress=options.egress, resolver=options.resolver,
                                             connect=options.connect))
        self._in_flight: dict[str, int] = {}
        self._wake = trio.Event()
        self._notices: deque[tuple[WebhookKind, str, dict[str, Any]]] = deque(maxlen=1000)

    # --- registering ---------------------------------------------------------------------------------

    async def load(self) -> None:
        self.registry.load(await self.store.list_webhooks())

    def accepts(self, namespace: str, kind: str) -> bool:
        """Whether an endpoint gets ``kind`` from ``namespace`` (cheap and synchronous: the in-memory view)."""
        return self.registry.accepts(namespace, kind)

    async def register(self, url: str, kinds: tuple[str, ...], namespace: str | None, description: str,
                       created_by: str, *, by_admin: bool) -> tuple[WebhookRecord, str]:
        """A new endpoint and its secret (shown once). ``WebhookRefused`` for a URL the policy forbids, saying what
        to do in words for the admin (the flag) or a tenant (ask the operator)."""
        refusal = url_refusal(self.options.egress, url, to_admin=by_admin)
        if refusal is not None:
            raise WebhookRefused("url", refusal)
        if await self.store.count_webhooks(namespace) >= self.options.max_per_namespace:
            raise TooManyWebhooks(f"{'every namespace' if namespace is None else f'namespace {namespace!r}'} has "
                                  f"{self.options.max_per_namespace} webhooks, the most it may; remove one first "
                                  "(each event is written once per endpoint)")
        secret = make_secret(secrets.token_bytes(SECRET_BYTES))
        record = await self.store.create_webhook(WebhookRecord(
            webhook_id=new_id("wh"), url=url, kinds=kinds, namespace=namespace, description=description,
            secret=secret, previous_secret=None, previous_valid_until=None, created_at=utc_now(),
            created_by=created_by, disabled=False))
        self.registry.add(record)
        return record, secret

    async def remove(self, webhook_id: str) -> None:
        await self.store.delete_webhook(webhook_id)
        self.registry.remove(webhook_id)

    async def rotate(self, webhook_id: str, *, end_overlap: bool = False) -> tuple[str, datetime]:
        """A new secret; the old one signs beside it for ``rotation_overlap_s``. ``RotationOverlaps`` while an
        earlier rotation's overlap runs, unless ``end_overlap``: at most two secrets sign (docs/webhooks.md)."""
        secret = make_secret(secrets.token_bytes(SECRET_BYTES))
        now = utc_now()
        until = now + timedelta(seconds=self.options.rotation_overlap_s)
        await self.store.rotate_webhook_secret(webhook_id, secret, until, now, end_overlap)
        return secret, until

    async def test(self, webhook: WebhookRecord) -> DeliveryRecord:
        [delivery] = await self.store.add_deliveries(
            WebhookKind.WEBHOOK_TEST, webhook.namespace, {"webhook_id": webhook.webhook_id, "message": "a test-send"},
            webhook_id=webhook.webhook_id)
        self._wake.set()
        return delivery

    async def redeliver(self, delivery_id: str) -> DeliveryRecord:
        delivery = await self.store.redeliver(delivery_id)
        self._wake.set()
        return delivery

    def quarantined(self, namespace: str, reason: str, until: float) -> None:
        """The worker pool quarantined ``namespace`` (``WorkerPool.on_quarantine``)."""
        self._notice(WebhookKind.WORKER_QUARANTINED, namespace, {
            "reason": reason, "until": datetime.fromtimestamp(until, UTC).isoformat()})

    def lease_moved(self, namespace: str, failed_tasks: int) -> None:
        """This supervisor took ``namespace`` over from one that is gone, failing the tasks it left running
        (``Leasing.on_moved``)."""
        self._notice(WebhookKind.LEASE_MOVED, namespace, {"supervisor_id": self._supervisor_id,
                                                          "failed_tasks": failed_tasks})

    def _notice(self, kind: WebhookKind, namespace: str, data: dict[str, Any]) -> None:
        """Something that is not a session's event, told synchronously where it happens: the loop records its
        deliveries next (those are in memory until then: see docs/webhooks.md)."""
        if self.accepts(namespace, kind):
            if len(self._notices) == self._notices.maxlen:
                log.error("webhooks: more than %d notices wait to be recorded; %s of %s dropped",
                          self._notices.maxlen, kind, namespace)
                return
            self._notices.append((kind, namespace, {"namespace": namespace, **data}))
            self._wake.set()

    # --- delivering ----------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The delivery loop, until cancelled."""
        if self._supervisor_id is None:
            await self.store.release_delivery_claims()  # the sole supervisor: the claims of a dead one lapse now
        await self.load()
        task_status.started()
        reloaded = trio.current_time()
        pruned = -_PRUNE_EVERY_S
        async with trio.open_nursery() as nursery:
            while True:
                try:
                    if trio.current_time() - reloaded > 30:  # endpoints another supervisor registered
                        await self.load()
                        reloaded = trio.current_time()
                    if trio.current_time() - pruned >= _PRUNE_EVERY_S:
                        await self.store.prune_deliveries(utc_now() - timedelta(days=self.options.keep_days))
                        pruned = trio.current_time()
                    while self._notices:
                        kind, namespace, data = self._notices[0]
                        await self.store.add_deliveries(kind, namespace, data)
                        self._notices.popleft()
                    for delivery in await self._claim():
                        self._in_flight[delivery.webhook_id] = self._in_flight.get(delivery.webhook_id, 0) + 1
                        nursery.start_soon(self._deliver, delivery)
                except StoreError as exc:
                    log.warning("webhooks: looking for due deliveries failed (tried again): %s", exc)
                with trio.move_on_after(self.options.poll_s):
                    await self._wake.wait()
                self._wake = trio.Event()

    async def _claim(self) -> list[DeliveryRecord]:
        now = utc_now()
        room = {webhook_id: self.options.per_endpoint - busy for webhook_id, busy in self._in_flight.items()}
        if not await self.store.deliveries_due(now, [webhook_id for webhook_id, left in room.items() if left <= 0]):
            return []  # nothing to claim (or only for endpoints without room): no write, which is an fsync on SQLite
        return await self.store.claim_deliveries(now, now + timedelta(seconds=self.options.claim_s), room,
                                                 self.options.per_endpoint, 64, self._supervisor_id)

    async def _deliver(self, delivery: DeliveryRecord) -> None:
        try:
            await self._attempt(delivery)
        except StoreError as exc:  # the claim lapses and the delivery is due again
            log.warning("webhooks: delivery %s: %s", delivery.delivery_id, exc)
        finally:
            left = self._in_flight[delivery.webhook_id] - 1
            if left:
                self._in_flight[delivery.webhook_id] = left
            else:
                del self._in_flight[delivery.webhook_id]
            self._wake.set()  # its endpoint has room again

    async def _attempt(self, delivery: DeliveryRecord) -> None:
        try:
            webhook = await self.store.get_webhook(delivery.webhook_id)
        except UnknownWebhook:
            return  # removed meanwhile, with its outbox
        body = (await self._payload(delivery)).body()
        headers = signed_headers(webhook.secrets(utc_now()), delivery.delivery_id, int(time.time()), body)
        headers["content-type"] = "application/json"
        started, began = utc_now(), time.monotonic()
        came: list[int] = []  # the status, as soon as it comes (before the body)
        status: int | None = None
        error: str | None = None
        with trio.move_on_after(self.options.timeout_s) as scope:
            try:
                status, answer = await self._sender.post_once(webhook.url, headers, body, _ANSWER_BYTES, _USER_AGENT,
                                                              "webhook", came.append)
                if not 200 <= status < 300:
                    error = f"HTTP {status}: {answer[:200].decode('utf-8', 'replace')}".strip()
            except ToolError as exc:
                error = exc.message
        if scope.cancelled_caught:
            if came:  # it answered, then did not finish its body: not delivered (the receiver may not have taken it)
                status = came[0]
                error = (f"HTTP {status}, but the body of the answer did not finish within "
                         f"{self.options.timeout_s:g} s")
            else:
                error = f"no answer within {self.options.timeout_s:g} s"
        attempt = AttemptRecord(started, status, error, round((time.monotonic() - began) * 1000))
        number = delivery.attempts + 1
        if error is None:
            state, next_at = DeliveryState.DELIVERED, None
        elif number >= self.options.max_attempts:
            state, next_at = DeliveryState.DEAD, None
            log.warning("webhooks: delivery %s to %s is dead after %d attempts: %s", delivery.delivery_id,
                        webhook.webhook_id, number, error)
        else:
            state = DeliveryState.PENDING
            next_at = utc_now() + timedelta(seconds=retry_delay(number, random.random(), self.options.retry_base_s,
                                                                self.options.retry_cap_s))
        with trio.CancelScope(shield=True):
            await self.store.record_attempt(delivery.delivery_id, attempt, state, next_at)

    async def _payload(self, delivery: DeliveryRecord) -> WebhookPayload:
        """What the delivery says: the session's event as stored, or the data recorded with it."""
        data: dict[str, Any] = dict(delivery.data or {})
        if delivery.session_id is not None and delivery.seq is not None:
            data.update(namespace=delivery.namespace, session_id=delivery.session_id, task_id=delivery.task_id,
                        seq=delivery.seq)
            try:
                events = await self.store.read(delivery.session_id, delivery.seq - 1, 1)
            except UnknownSession:
                events = []  # the session was deleted since
            data["event"] = events[0].model_dump(mode="json", exclude_none=True) if events else None
        return WebhookPayload(type=delivery.kind, timestamp=delivery.created_at, data=data)

