"""Namespace leases on PostgreSQL (``PostgresLeases``): one holder at a time, refusals that say where to go,
expiry and takeover, and a holder cut off from the database letting go before anyone else may take over."""

from __future__ import annotations

from typing import Any

import psycopg
import trio
import trio.testing

from codesdk.supervisor.store import Claim, PostgresLeases, Renewal, StoreError, open_postgres
from codesdk.supervisor.store._pg import redacted

#: Short enough that expiry comes within a test; the waits are for conditions, never for this long.
SHORT_LEASE_S = 0.5


async def leases_on(url: str, lease_s: float = 30.0) -> PostgresLeases:
    async with open_postgres(url):  # creates (migrates) the schema
        pass
    return await PostgresLeases.open(url, redacted(url), lease_s)


async def test_a_namespace_has_one_holder_and_the_others_are_told_where_it_is(postgres_url: str) -> None:
    with trio.fail_after(60):
        a, b = await leases_on(postgres_url), await leases_on(postgres_url)
        try:
            a.announce(["unix:/run/a.sock", "http://a.example:8080"])
            await a.renew()
            assert (await a.claim("user:alice")).taken_over
            assert (await a.claim("user:alice")) == (await a.claim("user:alice"))  # ours: nothing new
            refused = await b.claim("user:alice")
            assert refused.holder is not None and not refused.taken_over
            assert refused.holder.supervisor_id == a.supervisor_id
            assert refused.holder.api == ("unix:/run/a.sock", "http://a.example:8080")
            assert (await b.claim("user:bob")).holder is None
            renewal = await a.renew()
            assert renewal.held == {"user:alice"} and not renewal.lost
        finally:
            await a.aclose()
            await b.aclose()


async def test_a_lease_given_up_is_free_at_once(postgres_url: str) -> None:
    with trio.fail_after(60):
        a, b = await leases_on(postgres_url), await leases_on(postgres_url)
        try:
            await a.claim("user:alice")
            await a.aclose()
            claim = await b.claim("user:alice")
            assert claim.holder is None and claim.taken_over
        finally:
            await b.aclose()


async def test_an_expired_lease_is_taken_over_once_and_its_old_holder_learns_it_lost_it(postgres_url: str) -> None:
    with trio.fail_after(60):
        a = await leases_on(postgres_url, SHORT_LEASE_S)
        b, c = await leases_on(postgres_url), await leases_on(postgres_url)
        try:
            await a.claim("user:alice")  # a stops renewing, as if it had died
            while not await b.expired():
                await trio.sleep(0.02)
            assert await b.expired() == ["user:alice"]
            claims: dict[str, Claim] = {}

            async def take(leases: PostgresLeases) -> None:
                claims[leases.supervisor_id] = await leases.claim("user:alice")

            async with trio.open_nursery() as nursery:  # two supervisors race for it
                nursery.start_soon(take, b)
                nursery.start_soon(take, c)
            winners = [who for who, claim in claims.items() if claim.holder is None]
            assert len(winners) == 1 and claims[winners[0]].taken_over
            loser = next(claim for claim in claims.values() if claim.holder is not None)
            assert loser.holder is not None and loser.holder.supervisor_id == winners[0]
            renewal = await a.renew()
            assert renewal.lost == {"user:alice"} and not renewal.held
        finally:
            for leases in (a, b, c):
                await leases.aclose()


async def test_a_holder_cut_off_from_the_database_lets_go_once_its_lease_could_have_expired(
        postgres_url: str) -> None:
    """Its renewals fail (the database refuses it): it keeps its leases while they cannot have expired, and gives
    them all up once another supervisor could take them."""
    with trio.fail_after(60):
        async with open_postgres(postgres_url):
            pass
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            admin.execute("CREATE ROLE cut_off LOGIN")
            admin.execute("GRANT ALL ON ALL TABLES IN SCHEMA public TO cut_off")
            admin.execute("GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO cut_off")  # lease epochs
        url = postgres_url.replace("codesdk@", "cut_off@")
        a = await PostgresLeases.open(url, redacted(url), SHORT_LEASE_S)
        try:
            await a.claim("user:alice")
            assert (await a.renew()).held == {"user:alice"}
            with psycopg.connect(postgres_url, autocommit=True) as admin:
                admin.execute("ALTER ROLE cut_off NOLOGIN")
                admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = 'cut_off'")
            failures = 0
            while True:
                try:
                    renewal = await a.renew()
                    break
                except StoreError:
                    failures += 1
                    assert a.failure is not None  # what readiness reports meanwhile
                    await trio.sleep(0.02)
            assert failures >= 1
            assert renewal.lost == {"user:alice"} and not renewal.held
            with psycopg.connect(postgres_url, autocommit=True) as admin:
                admin.execute("ALTER ROLE cut_off LOGIN")
            assert (await a.renew()).held == frozenset()  # what it let go of is not silently kept
            assert a.failure is None
        finally:
            await a.aclose()


async def test_only_expired_leases_are_dropped(postgres_url: str) -> None:
    """A namespace whose supervisor died with nothing running there is dropped rather than taken over (the next
    request takes it); a live holder's lease is never dropped."""
    with trio.fail_after(60):
        gone = await leases_on(postgres_url, SHORT_LEASE_S)
        live, other = await leases_on(postgres_url), await leases_on(postgres_url)
        try:
            await gone.claim("user:idle")
            await live.claim("user:busy")
            while not await other.expired():
                await trio.sleep(0.02)
            await other.drop_expired(["user:idle", "user:busy"])
            assert await other.expired() == []
            assert (await other.claim("user:busy")).holder is not None
            claim = await other.claim("user:idle")
            assert claim.holder is None and claim.taken_over
        finally:
            for leases in (gone, live, other):
                await leases.aclose()


def _waiting_on_a_lock(url: str) -> bool:
    with psycopg.connect(url) as conn:
        return bool(conn.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                                 "AND datname = current_database()").fetchone()[0])  # type: ignore[index]


async def test_a_claim_that_lands_while_a_renewal_waits_is_not_taken_for_lost(postgres_url: str) -> None:
    """A renewal judges only the leases it asked about: one claimed while it waited for the connection is kept
    (else the engine would let the namespace's new worker go, and later fail its task as an orphan)."""
    with trio.fail_after(60):
        a = await leases_on(postgres_url)
        blocker: psycopg.Connection[Any] = await trio.to_thread.run_sync(lambda: psycopg.connect(postgres_url))
        try:
            await a.claim("user:early")
            await trio.to_thread.run_sync(blocker.execute, "LOCK TABLE namespace_leases IN ACCESS EXCLUSIVE MODE")
            outcome: dict[str, object] = {}

            async def claim() -> None:
                outcome["claim"] = await a.claim("user:late")  # waits on the lock, holding the connection

            async def renew() -> None:
                outcome["renewal"] = await a.renew()  # asks about user:early only, then waits for the connection

            async with trio.open_nursery() as nursery:
                nursery.start_soon(claim)
                while not await trio.to_thread.run_sync(_waiting_on_a_lock, postgres_url):
                    await trio.sleep(0.02)
                nursery.start_soon(renew)
                await trio.testing.wait_all_tasks_blocked()
                await trio.to_thread.run_sync(blocker.rollback)  # the claim goes through, then the renewal
            claimed = outcome["claim"]
            assert isinstance(claimed, Claim) and claimed.taken_over and claimed.holder is None
            renewal = outcome["renewal"]
            assert isinstance(renewal, Renewal) and not renewal.lost
            assert renewal.held == {"user:early", "user:late"}
            assert (await a.renew()).held == {"user:early", "user:late"}
        finally:
            await trio.to_thread.run_sync(blocker.close)
            await a.aclose()
