"""Weighted-fair turns across namespaces: deficit round robin over the supervisor's one trio thread and its writer.

Every namespace's events pass the same single thread (decoding, checks, the store's appends and their commits).
Without turns, whoever sends most takes most of it, and another tenant's small task waits behind a flood's backlog.
``FairTurns`` hands out *turns* — one unit of a namespace's work, costed by its events — so that:

- uncontended work never waits (one namespace alone, or light units side by side: no queue, no overhead);
- a heavy unit (more than ``light_cost`` events: a flood's batch) runs only while no other namespace's unit does;
- when units of several namespaces wait, they are granted in deficit-round-robin order (``DeficitRoundRobin``),
  each namespace's share of the cost proportional to its weight; a namespace's own units keep their order;
- a namespace that waits for its turn waits in its own pipe: the worker's reader stops taking its output, so the
  flood's backpressure reaches its own worker and runtime, never another tenant.

A light unit (another tenant's few events) therefore waits for at most one heavy unit of each flooding namespace
in front of it, whatever the floods' backlogs (``tests/test_fair.py`` counts the turns); the engine keeps heavy
units small while others are active (``cap``), so that one unit is short.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator, Callable, Hashable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import trio

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")

#: Events a namespace may be granted per round, times its weight.
QUANTUM = 64
#: Events a namespace's unit holds at most when it is alone (times its weight): the unit that is running when
#: another namespace's work arrives is what that work waits for.
ALONE_QUANTA = 8
#: A unit of at most this many events is light: it runs beside other light units (they share a commit).
LIGHT_COST = 16
#: A namespace counts as active this long after its last unit ended: meanwhile others' heavy units stay small.
ACTIVE_WINDOW_S = 0.1


class DeficitRoundRobin(Generic[K, T]):
    """Items queued per key, handed out in deficit-round-robin order (Shreedhar & Varghese): each round a key with
    items earns ``quantum * weight(key)`` of credit and is served while its next item's cost fits in its credit; a
    key whose queue empties loses its credit (no hoarding while idle). FIFO within a key. Pure: no I/O, no clock."""

    def __init__(self, quantum: int, weight: Callable[[K], int] = lambda key: 1) -> None:
        if quantum < 1:
            raise ValueError(f"the quantum must be at least 1, not {quantum}")
        self._quantum = quantum
        self._weight = weight
        self._queues: dict[K, deque[tuple[T, int]]] = {}
        self._round: deque[K] = deque()  # keys with items, in round order; the head is being served
        self._deficit: dict[K, int] = {}
        self._credited = False  # the head key got its quantum for this visit

    def __len__(self) -> int:
        return sum(len(queue) for queue in self._queues.values())

    def push(self, key: K, item: T, cost: int) -> None:
        queue = self._queues.get(key)
        if queue is None:
            queue = self._queues[key] = deque()
            self._round.append(key)
            self._deficit[key] = 0
        queue.append((item, max(1, cost)))

    def pop(self) -> tuple[K, T] | None:
        """The next item by DRR, or None when nothing is queued."""
        while self._round:
            key = self._round[0]
            queue = self._queues[key]
            if not self._credited:
                self._deficit[key] += self._quantum * max(1, self._weight(key))
                self._credited = True
            item, cost = queue[0]
            if cost <= self._deficit[key]:
                queue.popleft()
                self._deficit[key] -= cost
                if not queue:  # served out: it leaves the round and its credit
                    del self._queues[key], self._deficit[key]
                    self._round.popleft()
                    self._credited = False
                return key, item
            self._round.rotate(-1)  # its credit does not cover the next item: the next key's visit
            self._credited = False
        return None

    def waiting(self) -> Mapping[K, int]:
        """Items queued per key."""
        return {key: len(queue) for key, queue in self._queues.items()}


@dataclass
class FairStats:
    """Counters of ``FairTurns`` (for tests and diagnostics)."""

    turns: int = 0
    waited: int = 0  # turns that queued (someone else was running or waiting)
    #: per key, the most units of other keys granted between its queueing and its own grant
    most_overtaken: dict[str, int] = field(default_factory=dict)


class _Unit:
    __slots__ = ("cost", "granted", "key", "queued_at_turn")

    def __init__(self, key: str, cost: int, queued_at_turn: int) -> None:
        self.key = key
        self.cost = cost
        self.granted = trio.Event()
        self.queued_at_turn = queued_at_turn


class FairTurns:
    """Turns of work across namespaces, on one trio thread (see the module's docstring)."""

    def __init__(self, *, quantum: int = QUANTUM, light_cost: int = LIGHT_COST,
                 weights: Mapping[str, int] | None = None, active_window_s: float = ACTIVE_WINDOW_S) -> None:
        self._weights = dict(weights or {})
        self._queue: DeficitRoundRobin[str, _Unit] = DeficitRoundRobin(quantum, self.weight)
        self._quantum = quantum
        self._light_cost = light_cost
        self._window = active_window_s
        self._next: _Unit | None = None  # popped from the queue, waiting for the running units to allow it
        self._running: dict[str, int] = {}  # key -> units running
        self._heavy_running: dict[str, int] = {}
        self._last_active: dict[str, float] = {}  # key -> when its last unit ended (only within the window)
        self.stats = FairStats()

    def weight(self, key: str) -> int:
        return self._weights.get(key, 1)

    def set_weight(self, key: str, weight: int) -> None:
        if weight < 1:
            raise ValueError(f"a namespace's weight must be at least 1, not {weight}")
        self._weights[key] = weight

    def cap(self, key: str, *, others_active: bool | None = None) -> int:
        """How many events ``key``'s next unit may hold: its weighted quantum while another namespace is active
        (running, waiting, or done within the active window), else ``ALONE_QUANTA`` of them (a flood alone goes
        at nearly full speed, and whoever comes next waits for one such unit at most)."""
        others = self.others_active(key) if others_active is None else others_active  # the caller's, if just asked
        quanta = 1 if others else ALONE_QUANTA
        return quanta * self._quantum * self.weight(key)

    def others_waiting(self, key: str) -> bool:
        """Whether another namespace's unit waits for a turn now: a running unit of ``key`` that can end early (at
        a step boundary, its rest queued as a new unit) should, so the newcomer waits for a step, not a whole unit."""
        if self._next is not None and self._next.key != key:
            return True
        return any(other != key for other in self._queue.waiting())

    def others_active(self, key: str) -> bool:
        """Whether ``_active_others(key)`` is not empty, without building it (asked for every unit)."""
        if any(other != key for other in self._running) or any(other != key for other in self._queue.waiting()):
            return True
        if self._next is not None and self._next.key != key:
            return True
        now = trio.current_time()
        return any(other != key and now - at <= self._window for other, at in self._last_active.items())

    def pause_factor(self, key: str) -> float:
        """How long ``key`` should pause after a unit, per second the unit took, so that while others are active
        its share of the thread and the writer is its weight over the active namespaces' weights (0: alone)."""
        return sum(self.weight(other) for other in self._active_others(key)) / self.weight(key)

    def _active_others(self, key: str) -> set[str]:
        """Other namespaces running or waiting for a turn, or done with one within the active window."""
        active = {other for other in self._running if other != key}
        active.update(other for other in self._queue.waiting() if other != key)
        if self._next is not None and self._next.key != key:
            active.add(self._next.key)
        now = trio.current_time()
        for other, at in list(self._last_active.items()):
            if now - at > self._window:
                del self._last_active[other]  # bounded by the namespaces active within the window
            elif other != key:
                active.add(other)
        return active

    @asynccontextmanager
    async def turn(self, key: str, cost: int) -> AsyncIterator[None]:
        """Run the block as one unit of ``key``'s work costing ``cost`` events, when its turn comes."""
        unit = _Unit(key, cost, self.stats.turns)
        if self._next is None and not len(self._queue) and self._may_run(unit):
            self._start(unit)
        else:
            self.stats.waited += 1
            self._queue.push(key, unit, cost)
            self._dispatch()
            try:
                await unit.granted.wait()
            except BaseException:
                if unit.granted.is_set():  # granted as it was cancelled: give the turn back
                    self._end(unit)
                else:
                    self._forget(unit)
                raise
        try:
            yield
        finally:
            self._end(unit)

    def _heavy(self, unit: _Unit) -> bool:
        return unit.cost > self._light_cost

    def _may_run(self, unit: _Unit) -> bool:
        """Heavy units run only while no other namespace's unit does; light ones only while no other heavy does."""
        running = self._running if self._heavy(unit) else self._heavy_running
        return not any(key != unit.key for key in running)

    def _start(self, unit: _Unit) -> None:
        self.stats.turns += 1
        self._running[unit.key] = self._running.get(unit.key, 0) + 1
        if self._heavy(unit):
            self._heavy_running[unit.key] = self._heavy_running.get(unit.key, 0) + 1
        unit.granted.set()

    def _end(self, unit: _Unit) -> None:
        for running in (self._running, self._heavy_running) if self._heavy(unit) else (self._running,):
            running[unit.key] -= 1
            if not running[unit.key]:
                del running[unit.key]
        self._last_active[unit.key] = trio.current_time()
        self._dispatch()

    def _dispatch(self) -> None:
        while True:
            if self._next is None:
                popped = self._queue.pop()
                if popped is None:
                    return
                self._next = popped[1]
            unit = self._next
            if not self._may_run(unit):
                return
            self._next = None
            overtaken = self.stats.turns - unit.queued_at_turn
            self.stats.most_overtaken[unit.key] = max(self.stats.most_overtaken.get(unit.key, 0), overtaken)
            self._start(unit)

    def _forget(self, unit: _Unit) -> None:
        """A unit cancelled while it waited leaves the line (its namespace's worker is going away)."""
        if self._next is unit:
            self._next = None
        else:
            kept: list[tuple[str, _Unit]] = []
            while (popped := self._queue.pop()) is not None:
                if popped[1] is not unit:
                    kept.append(popped)
            for key, other in kept:
                self._queue.push(key, other, other.cost)
        self._dispatch()
