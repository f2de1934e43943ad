"""Who can answer: clients attached per namespace (released however their stream ends), the webhook source, and
the route a request gets from the operator's policy."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import trio
import trio.testing

from codesdk.supervisor.engine import APPROVAL_KIND, QUESTION_KIND, Audience, RoutingPolicy, Unattended
from codesdk.supervisor.engine._audience import Route, await_answer, expiry_reason, route

_NOW = datetime(2026, 11, 29, 12, tzinfo=UTC)


def test_attach_and_detach_count_per_namespace() -> None:
    audience = Audience()
    assert not audience.reachable("ns", APPROVAL_KIND)
    with audience.attached("ns"):
        with audience.attached("ns"):
            assert audience.streams("ns") == 2
        assert audience.streams("ns") == 1 and audience.reachable("ns", QUESTION_KIND)
        assert audience.streams("other") == 0 and not audience.reachable("other", APPROVAL_KIND)
    assert audience.streams("ns") == 0 and not audience.reachable("ns", APPROVAL_KIND)


async def test_a_cancelled_stream_releases_its_count() -> None:
    audience = Audience()
    with trio.CancelScope() as scope:
        with audience.attached("ns"):
            assert audience.streams("ns") == 1
            scope.cancel()
            await trio.sleep_forever()
    assert audience.streams("ns") == 0


def test_a_stream_ended_by_an_error_releases_its_count() -> None:
    audience = Audience()
    with pytest.raises(ConnectionResetError), audience.attached("ns"):
        raise ConnectionResetError("the client went")
    assert audience.streams("ns") == 0


def test_the_webhook_source_counts_by_namespace_and_kind() -> None:
    audience = Audience(lambda namespace, kind: (namespace, kind) == ("ns", APPROVAL_KIND))
    assert audience.reachable("ns", APPROVAL_KIND)
    assert not audience.reachable("ns", QUESTION_KIND) and not audience.reachable("other", APPROVAL_KIND)


def test_a_failing_webhook_source_counts_as_nobody() -> None:
    def broken(namespace: str, kind: str) -> bool:
        raise RuntimeError("the registry is gone")

    assert not Audience(broken).reachable("ns", APPROVAL_KIND)


async def test_waiting_for_someone_wakes_when_a_client_attaches(autojump_clock: trio.testing.MockClock) -> None:
    audience = Audience()
    found: list[bool] = []
    async with trio.open_nursery() as nursery:
        async def wait() -> None:
            found.append(await audience.wait_reachable("ns", APPROVAL_KIND, 60))
        nursery.start_soon(wait)
        await trio.sleep(1)
        with audience.attached("elsewhere"):
            await trio.sleep(1)
            assert not found
            with audience.attached("ns"):
                await trio.sleep(1)
    assert found == [True]
    assert not await audience.wait_reachable("ns", APPROVAL_KIND, 5)  # nobody came: False at the limit


def test_without_a_policy_a_request_waits_its_timeout_and_never_escalates() -> None:
    routed = route(None, False, 900, _NOW)
    assert (routed.fallback, routed.timeout_s, routed.escalates_at) == (None, 900, None)


def test_nobody_to_answer_gets_the_fallback() -> None:
    deny = route(RoutingPolicy(Unattended.DENY, escalate_after_s=10), False, 900, _NOW)
    assert (deny.fallback, deny.escalates_at) == (Unattended.DENY, None)  # denied at once: nothing to escalate
    wait = route(RoutingPolicy(Unattended.WAIT, 60, escalate_after_s=10), False, 900, _NOW)
    assert (wait.fallback, wait.timeout_s, wait.escalates_at) == (Unattended.WAIT, 60, _NOW + timedelta(seconds=10))
    assert route(RoutingPolicy(Unattended.WAIT, 60, escalate_after_s=90), False, 900, _NOW).escalates_at is None


def test_someone_to_answer_waits_the_whole_timeout() -> None:
    routed = route(RoutingPolicy(Unattended.DENY, escalate_after_s=30), True, 900, _NOW)
    assert (routed.fallback, routed.timeout_s, routed.escalates_at) == (None, 900, _NOW + timedelta(seconds=30))
    own = route(RoutingPolicy(escalate_after_s=30), True, 900, _NOW, own=True)
    assert own.escalates_at is None  # the task's own approver is asked in one call: not escalated


@pytest.mark.parametrize("field", ["unattended_wait_s", "escalate_after_s"])
@pytest.mark.parametrize("value", [0.0, -1.0, float("inf"), float("nan")])
def test_a_policy_refuses_seconds_that_are_not_seconds(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        RoutingPolicy(**{field: value})  # type: ignore[arg-type]


def test_the_console_source_counts_and_a_failing_one_is_nobody() -> None:
    audience = Audience(console_source=lambda namespace: 2 if namespace == "ns" else 0)
    assert audience.consoles("ns") == 2 and audience.reachable("ns", QUESTION_KIND)
    assert audience.consoles("other") == 0 and not audience.reachable("other", APPROVAL_KIND)

    def broken(namespace: str) -> int:
        raise RuntimeError("the console sessions are gone")

    assert not Audience(console_source=broken).reachable("ns", APPROVAL_KIND)


async def test_a_console_seen_wakes_a_wait_and_a_decision_ends_it(autojump_clock: trio.testing.MockClock) -> None:
    seen: set[str] = set()
    audience = Audience(console_source=lambda namespace: int(namespace in seen))
    decided = trio.Event()
    found: list[bool] = []
    async with trio.open_nursery() as nursery:
        async def wait() -> None:
            found.append(await audience.reachable_before("ns", APPROVAL_KIND, decided))
        nursery.start_soon(wait)
        await trio.sleep(5)
        assert not found
        seen.add("ns")
        audience.noticed()
    assert found == [True]
    seen.clear()
    decided.set()
    assert not await audience.reachable_before("ns", APPROVAL_KIND, decided)


async def test_a_wait_nobody_could_answer_gets_the_whole_timeout_once_someone_can(
        autojump_clock: trio.testing.MockClock) -> None:
    policy = RoutingPolicy(Unattended.WAIT, unattended_wait_s=10, escalate_after_s=5)
    audience = Audience()
    short = route(policy, False, 100, _NOW)
    assert short.fallback is Unattended.WAIT and short.timeout_s == 10
    escalated: list[float] = []
    rerouted: list[float] = []

    async def answerable() -> Route:
        rerouted.append(trio.current_time())
        return route(policy, True, 100, _NOW)

    async def escalate() -> None:
        escalated.append(trio.current_time())

    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        async def attach_later() -> None:
            await trio.sleep(7)
            with audience.attached("ns"):
                await trio.sleep_forever()
        nursery.start_soon(attach_later)
        final = await await_answer(audience, "ns", APPROVAL_KIND, short, trio.Event(), answerable=answerable,
                                   escalate=escalate)
        nursery.cancel_scope.cancel()
    assert final.fallback is None and final.timeout_s == 100
    assert [t - start for t in rerouted] == [7]
    assert len(escalated) == 1  # once, however the route changed
    assert trio.current_time() - start == 100  # the whole timeout, from when it opened


async def test_a_wait_nobody_came_to_keeps_the_shorter_deadline(autojump_clock: trio.testing.MockClock) -> None:
    policy = RoutingPolicy(Unattended.WAIT, unattended_wait_s=10)
    audience = Audience()

    async def never() -> Route:
        raise AssertionError("nobody came")

    async def no_escalation() -> None:
        raise AssertionError("no escalation was asked for")

    start = trio.current_time()
    final = await await_answer(audience, "ns", APPROVAL_KIND, route(policy, False, 100, _NOW), trio.Event(),
                               answerable=never, escalate=no_escalation)
    assert final.fallback is Unattended.WAIT and trio.current_time() - start == 10
    assert expiry_reason("no decision within 10 s", final, audience, "ns", APPROVAL_KIND, policy).startswith(
        "no decision within 10 s (nobody could answer")
    with audience.attached("ns"):  # someone there when it is written: not said to be nobody
        assert expiry_reason("no decision within 10 s", final, audience, "ns", APPROVAL_KIND, policy) == \
            "no decision within 10 s"
