"""Weighted-fair turns across namespaces (``codesdk.supervisor.fair``): the deficit-round-robin queue's promises as
properties, and the trio turns counted, never timed."""

from __future__ import annotations

from collections import Counter

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from codesdk.supervisor.fair import DeficitRoundRobin, FairTurns

KEYS = ("a", "b", "c", "d")

items = st.lists(st.tuples(st.sampled_from(KEYS), st.integers(1, 200)), max_size=200)
weights = st.fixed_dictionaries({key: st.integers(1, 4) for key in KEYS})


def _fill(queue: DeficitRoundRobin[str, int], pushed: list[tuple[str, int]]) -> None:
    for index, (key, cost) in enumerate(pushed):
        queue.push(key, index, cost)


def _drain(queue: DeficitRoundRobin[str, int]) -> list[tuple[str, int]]:
    served = []
    while (popped := queue.pop()) is not None:
        served.append(popped)
    return served


@given(items, weights, st.integers(1, 128))
@settings(max_examples=200, deadline=None)
def test_every_item_is_served_once_in_its_keys_order(pushed: list[tuple[str, int]], weight: dict[str, int],
                                                     quantum: int) -> None:
    queue: DeficitRoundRobin[str, int] = DeficitRoundRobin(quantum, weight.__getitem__)
    _fill(queue, pushed)
    served = _drain(queue)
    assert sorted(index for _, index in served) == list(range(len(pushed)))
    for key in KEYS:
        mine = [index for served_key, index in served if served_key == key]
        assert mine == sorted(mine), f"{key}'s items out of their order: {mine}"
        assert all(pushed[index][0] == key for index in mine)
    assert len(queue) == 0


@given(items, weights, st.integers(1, 128))
@settings(max_examples=200, deadline=None)
def test_no_key_waits_more_than_a_round_of_the_others(pushed: list[tuple[str, int]], weight: dict[str, int],
                                                      quantum: int) -> None:
    """No starvation: between two services of a key that still has items, the others are served at most what one
    round grants them (their quantum times weight, plus one item that may have been granted on the credit they
    carried over), however the costs fall."""
    queue: DeficitRoundRobin[str, int] = DeficitRoundRobin(quantum, weight.__getitem__)
    _fill(queue, pushed)
    served = _drain(queue)
    max_cost = max((cost for _, cost in pushed), default=0)
    for key in {key for key, _ in pushed}:
        left = sum(1 for k, _ in pushed if k == key)
        others_cost = 0
        for served_key, index in served:
            if served_key == key:
                left -= 1
                others_cost = 0
                if not left:
                    break
                continue
            others_cost += pushed[index][1]
            # the others' credit in one wait: their quanta of the rounds the key needs to afford its next item
            rounds = max_cost // quantum + 2
            bound = rounds * sum(quantum * weight[k] + max_cost for k in KEYS if k != key)
            assert others_cost <= bound


@given(st.integers(1, 4), st.integers(1, 4), st.integers(1, 64), st.integers(1, 64), st.integers(8, 64))
@settings(max_examples=100, deadline=None)
def test_backlogged_keys_share_in_proportion_to_their_weights(weight_a: int, weight_b: int, cost_a: int, cost_b: int,
                                                              quantum: int) -> None:
    """While both keys have a backlog, what each was served stays within one round of its weight's share."""
    weight = {"a": weight_a, "b": weight_b}
    queue: DeficitRoundRobin[str, int] = DeficitRoundRobin(quantum, weight.__getitem__)
    for index in range(2_000):
        queue.push("a", index, cost_a)
        queue.push("b", index, cost_b)
    got: Counter[str] = Counter()
    for _ in range(1_000):  # far from either backlog's end
        popped = queue.pop()
        assert popped is not None
        got[popped[0]] += cost_a if popped[0] == "a" else cost_b
    rounds = max(got["a"] / (quantum * weight_a), got["b"] / (quantum * weight_b))
    slack = quantum * max(weight_a, weight_b) + max(cost_a, cost_b)
    assert abs(got["a"] - rounds * quantum * weight_a) <= slack + quantum * weight_a
    assert abs(got["b"] - rounds * quantum * weight_b) <= slack + quantum * weight_b


def test_a_quantum_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        DeficitRoundRobin(0)


async def test_a_light_unit_waits_for_at_most_one_heavy_unit_of_each_flood() -> None:
    """Two namespaces flood (each its worker's pump: one unit after another, the rest waiting in its pipe); a
    third namespace's light unit, queued while a flood's unit runs, runs after at most one heavy unit of each
    flood — counted in granted turns, not seconds — and each flood's units keep their order."""
    turns = FairTurns(quantum=64, light_cost=16)
    order: list[str] = []
    release = trio.Event()

    async def pump(key: str, units: int) -> None:
        for index in range(units):
            async with turns.turn(key, 64):
                order.append(f"{key}{index}")
                if index == 0 and key == "f":
                    await release.wait()  # the first is running while the others line up
                await trio.lowlevel.checkpoint()

    async def light() -> None:
        async with turns.turn("other", 2):
            order.append("other")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(pump, "f", 20)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(pump, "g", 20)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(light)
        await trio.testing.wait_all_tasks_blocked()
        assert order == ["f0"]
        release.set()
    assert order.index("other") <= 2, order  # f0 was running; at most g0, queued before it, then 'other'
    assert turns.stats.most_overtaken["other"] <= 1
    for key in "fg":
        assert [name for name in order if name.startswith(key)] == [f"{key}{i}" for i in range(20)]
    firsts = Counter(name[0] for name in order[:21])
    assert abs(firsts["f"] - firsts["g"]) <= 1, order  # the two floods take turns


async def test_alone_or_light_units_never_wait() -> None:
    turns = FairTurns(quantum=64, light_cost=16)
    for _ in range(10):
        async with turns.turn("alone", 500):
            assert turns.cap("alone") == 8 * 64  # nobody else active: a few quanta
    async with turns.turn("a", 3), turns.turn("b", 3):  # light units side by side (they share commits)
        pass
    assert turns.stats.waited == 0


async def test_while_another_namespace_is_active_a_flood_is_capped_at_its_weighted_quantum() -> None:
    turns = FairTurns(quantum=32, weights={"heavy": 3}, active_window_s=1.0)
    assert turns.cap("heavy") == 8 * 96
    async with turns.turn("other", 1):
        assert turns.cap("heavy") == 96
    assert turns.cap("heavy") == 96  # still within the active window of 'other'


async def test_a_heavy_unit_waits_while_another_namespace_runs_and_keeps_the_line_if_cancelled() -> None:
    turns = FairTurns(quantum=64, light_cost=16)
    started: list[str] = []
    hold = trio.Event()

    async def run(key: str, cost: int) -> None:
        async with turns.turn(key, cost):
            started.append(key)
            await hold.wait()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run, "b", 2)
        await trio.testing.wait_all_tasks_blocked()
        cancelled = trio.CancelScope()

        async def cancelled_heavy() -> None:
            with cancelled:
                await run("a", 100)

        nursery.start_soon(cancelled_heavy)
        nursery.start_soon(run, "c", 100)
        await trio.testing.wait_all_tasks_blocked()
        assert started == ["b"]
        cancelled.cancel()  # a worker going away while its unit waits: it leaves the line, 'c' keeps its place
        await trio.testing.wait_all_tasks_blocked()
        hold.set()
    assert started == ["b", "c"]


async def test_the_pause_after_a_unit_follows_the_weights_of_the_active_namespaces() -> None:
    turns = FairTurns(weights={"heavy": 2, "b": 1, "c": 3}, active_window_s=60.0)
    assert turns.pause_factor("heavy") == 0  # alone: never pauses
    async with turns.turn("b", 1):
        assert turns.pause_factor("heavy") == 0.5  # b's weight over heavy's
        async with turns.turn("c", 1):
            assert turns.pause_factor("heavy") == 2.0  # (1 + 3) / 2
    assert turns.pause_factor("heavy") == 2.0  # both still within the active window
    assert turns.pause_factor("b") == 3.0  # c only: heavy had no turn, it is not active


async def test_a_running_flood_is_told_when_another_namespace_waits_so_its_unit_can_end_at_the_next_step() -> None:
    """A flood alone holds units of a few quanta; whoever arrives meanwhile would wait for the whole unit. The
    intake asks ``others_waiting`` at each step and ends the unit there (the rest is queued as a unit of its own)."""
    turns = FairTurns(quantum=64, light_cost=16)
    seen: list[bool] = []
    step = trio.Event()
    go_on = trio.Event()

    async def flood() -> None:
        async with turns.turn("flood", 512):
            seen.append(turns.others_waiting("flood"))
            step.set()
            await go_on.wait()
            seen.append(turns.others_waiting("flood"))

    async def other() -> None:
        async with turns.turn("other", 1):
            seen.append(turns.others_waiting("other"))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(flood)
        await step.wait()
        nursery.start_soon(other)
        await trio.testing.wait_all_tasks_blocked()
        go_on.set()
    assert seen == [False, True, False]  # alone; 'other' waits; 'other' itself: nobody behind it
