"""API requests by idempotency key (part of the recorder contract: each test runs on every backend)."""

from __future__ import annotations

import trio

from codesdk.supervisor.store import RequestClaim

from tests.store.backends import Backend


async def test_a_key_is_claimed_once_answered_once_and_kept_per_principal(backend: Backend) -> None:
    async with backend.open() as store:
        first = await store.claim_request("alice", "k1", "fp-a")
        assert first.outcome == "claimed" and first.token
        assert (await store.claim_request("alice", "k1", "fp-a")).outcome == "running"
        assert (await store.claim_request("alice", "k1", "fp-b")).outcome == "mismatch"
        assert (await store.claim_request("bob", "k1", "fp-b")).outcome == "claimed"  # bob's keys are his own
        await store.finish_request("alice", "k1", "not-the-token", 201, '{"x":2}')  # only the claim's holder
        assert (await store.claim_request("alice", "k1", "fp-a")).outcome == "running"
        await store.finish_request("alice", "k1", first.token, 201, '{"x":1}')
    async with backend.open() as store:  # the answer is durable
        assert await store.claim_request("alice", "k1", "fp-a") == RequestClaim("answered", status=201,
                                                                                  answer='{"x":1}')


async def test_a_released_key_is_free_for_the_retry(backend: Backend) -> None:
    async with backend.open() as store:
        claim = await store.claim_request("alice", "k2", "fp-a")
        await store.finish_request("alice", "k2", claim.token, None)
        again = await store.claim_request("alice", "k2", "fp-b")
        assert again.outcome == "claimed" and again.token != claim.token


async def test_concurrent_claims_of_one_key_let_exactly_one_run(backend: Backend) -> None:
    outcomes: list[str] = []
    async with backend.open() as store:
        async def claim() -> None:
            outcomes.append((await store.claim_request("alice", "k3", "fp")).outcome)

        async with trio.open_nursery() as nursery:
            for _ in range(8):
                nursery.start_soon(claim)
    assert sorted(outcomes) == ["claimed"] + ["running"] * 7
