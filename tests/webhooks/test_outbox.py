"""The outbox in the store, on both backends: deliveries written with the events that cause them (and only those),
claimed once, and on PostgreSQL only under the namespace's lease."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest

from codesdk.protocol import DeliveryState, EventType
from codesdk.supervisor.store import AttemptRecord, EventStore, WebhookRecord, open_postgres

from tests.store.store_helpers import delta, session_created, terminal


def _webhook(webhook_id: str, namespace: str | None, kinds: tuple[str, ...]) -> WebhookRecord:
    return WebhookRecord(webhook_id, "http://127.0.0.1:9/", kinds, namespace, "", "whsec_AAAA", None, None,
                         datetime.now(UTC), "test", False)


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return str(tmp_path / "data") if request.param == "sqlite" else str(request.getfixturevalue("postgres_url"))


def _open(url: str) -> AbstractAsyncContextManager[EventStore]:
    return open_postgres(url) if url.startswith("postgresql") else EventStore.open(url, synchronous="NORMAL")


async def test_deliveries_commit_with_their_events_once_per_endpoint(store_url: str) -> None:
    async with _open(store_url) as store:
        await store.create_webhook(_webhook("wh_a", "user:a", ("task.completed",)))
        await store.create_webhook(_webhook("wh_all", None, ("*",)))
        await store.create_webhook(_webhook("wh_b", "user:b", ("*",)))
        await store.create_webhook(_webhook("wh_quiet", "user:a", ("budget.reached",)))
        session = await store.create_session(runtime="scripted", namespace="user:a")
        await store.append(session.session_id, [session_created(), *(delta(str(n)) for n in range(5))])
        for webhook_id in ("wh_a", "wh_all", "wh_b", "wh_quiet"):
            assert await store.list_deliveries(webhook_id) == []  # deltas cause nothing
        [end] = await store.append(session.session_id, [terminal(EventType.TASK_COMPLETED)])
        [mine] = await store.list_deliveries("wh_a")
        [everyone] = await store.list_deliveries("wh_all")
        assert await store.list_deliveries("wh_b") == [] and await store.list_deliveries("wh_quiet") == []
        for delivery in (mine, everyone):
            assert (delivery.kind, delivery.namespace, delivery.session_id, delivery.seq) == (
                "task.completed", "user:a", session.session_id, end.seq)
            assert delivery.state == DeliveryState.PENDING and delivery.attempts == 0
        assert mine.delivery_id != everyone.delivery_id

        now = datetime.now(UTC)
        claimed = await store.claim_deliveries(now, now + timedelta(seconds=60), {}, 4, 10, None)
        assert {d.delivery_id for d in claimed} == {mine.delivery_id, everyone.delivery_id}
        assert await store.claim_deliveries(now, now + timedelta(seconds=60), {}, 4, 10, None) == []  # held
        later = now + timedelta(seconds=61)  # a claimer that died: its claims lapse
        assert len(await store.claim_deliveries(later, later + timedelta(seconds=60), {}, 4, 10, None)) == 2
        attempt = AttemptRecord(datetime.now(UTC), 200, None, 3)
        done = await store.record_attempt(mine.delivery_id, attempt, DeliveryState.DELIVERED, None)
        assert done is not None and done.state == DeliveryState.DELIVERED and done.attempts == 1
        assert [(a.status, a.duration_ms) for a in await store.delivery_attempts(mine.delivery_id)] == [(200, 3)]
        assert await store.prune_deliveries(now - timedelta(days=1)) == 0  # made after it
        assert await store.prune_deliveries(now + timedelta(days=1)) == 1  # the delivered one; the pending stays
        assert await store.delivery_attempts(mine.delivery_id) == []
        assert [d.delivery_id for d in await store.list_deliveries("wh_all")] == [everyone.delivery_id]
        await store.delete_webhook("wh_all")
        assert await store.record_attempt(everyone.delivery_id, attempt, DeliveryState.DELIVERED, None) is None


async def test_a_claim_leaves_room_per_endpoint(store_url: str) -> None:
    async with _open(store_url) as store:
        await store.create_webhook(_webhook("wh_a", None, ("*",)))
        await store.create_webhook(_webhook("wh_b", None, ("*",)))
        for _ in range(3):
            await store.add_deliveries("webhook.test", None, {}, webhook_id="wh_a")
            await store.add_deliveries("webhook.test", None, {}, webhook_id="wh_b")
        now = datetime.now(UTC)
        assert await store.deliveries_due(now, ["wh_a"])
        assert not await store.deliveries_due(now, ["wh_a", "wh_b"])  # due, but only for endpoints without room
        claimed = await store.claim_deliveries(now, now + timedelta(seconds=60), {"wh_a": 0}, 2, 10, None)
        assert [d.webhook_id for d in claimed] == ["wh_b", "wh_b"]


async def test_on_postgresql_only_what_this_supervisor_leases_or_nobody_does(postgres_url: str) -> None:
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        async with open_postgres(postgres_url) as store:
            await store.create_webhook(_webhook("wh_all", None, ("*",)))
            for supervisor in ("me", "other", "gone"):
                conn.execute("INSERT INTO supervisors(supervisor_id, host, pid, started_at, heartbeat_at) "
                             "VALUES (%s, 'h', 1, 'x', now())", (supervisor,))
            for namespace, holder, seconds in (("user:mine", "me", 60), ("user:theirs", "other", 60),
                                               ("user:lapsed", "gone", -60)):
                conn.execute("INSERT INTO namespace_leases(namespace, supervisor_id, expires_at, taken_at) "
                             "VALUES (%s, %s, now() + make_interval(secs => %s), now())", (namespace, holder, seconds))
            for namespace in ("user:mine", "user:theirs", "user:lapsed", "user:nobody's"):
                await store.add_deliveries("lease.moved", namespace, {})
            now = datetime.now(UTC)
            claimed = await store.claim_deliveries(now, now + timedelta(seconds=60), {}, 10, 10, "me")
    assert {d.namespace for d in claimed} == {"user:mine", "user:lapsed", "user:nobody's"}
