"""Subscriptions: stored past then live tail, no gaps or duplicates, bounded feeds, terminal, close.

Part of the recorder contract: every test runs against each backend (``backends.BACKENDS``)."""

from __future__ import annotations

import random

import pytest
import trio
import trio.lowlevel
import trio.testing

from codesdk.protocol import EventType, NormalizedEvent
from codesdk.supervisor.store import Recorder, StoreClosed, Subscription, TaskState, TaskUpdate, UnknownSession

from tests.store.backends import Backend
from tests.store.store_helpers import delta, terminal, texts


async def _take(subscription: Subscription, count: int) -> list[NormalizedEvent]:
    events = []
    async for event in subscription:
        events.append(event)
        if len(events) == count:
            break
    return events


async def test_past_then_live(recorder: Recorder) -> None:
    with trio.fail_after(10):
        await recorder.create_session("s1", runtime="scripted")
        await recorder.append("s1", [delta(str(i)) for i in range(1, 6)])
        async with recorder.subscribe("s1", after_seq=2) as events:
            assert texts(await _take(events, 3)) == ["3", "4", "5"]
            async with trio.open_nursery() as nursery:
                nursery.start_soon(recorder.append, "s1", [delta("6"), delta("7")])
                nursery.start_soon(recorder.append, "s1", [delta("8")])
                live = await _take(events, 3)
            assert [e.seq for e in live] == [6, 7, 8]
            assert live == (await recorder.read("s1"))[5:]


async def test_ready_counts_what_the_next_iterations_hand_out_without_waiting(recorder: Recorder) -> None:
    """What an SSE stream writes out together: the events the subscription already holds (a page of the past, or
    the live events pushed with one commit), never one it would have to wait for."""
    with trio.fail_after(10):
        await recorder.create_session("s1", runtime="scripted")
        await recorder.append("s1", [delta(str(i)) for i in range(1, 6)])
        async with recorder.subscribe("s1") as events:
            assert events.ready == 0
            first = await events.__anext__()
            assert (first.seq, events.ready) == (1, 4)
            assert [e.seq for e in await _take(events, 4)] == [2, 3, 4, 5]
            assert events.ready == 0
            await recorder.append("s1", [delta("6"), delta("7"), delta("8")])
            assert (await events.__anext__()).seq == 6
            assert events.ready == 2


async def test_after_seq_beyond_the_end_waits_for_that_seq(recorder: Recorder) -> None:
    with trio.fail_after(10):
        await recorder.create_session("s1", runtime="scripted")
        await recorder.append("s1", [delta("1")])
        async with recorder.subscribe("s1", after_seq=3) as events:
            await recorder.append("s1", [delta(str(i)) for i in range(2, 6)])
            assert [e.seq for e in await _take(events, 2)] == [4, 5]


async def test_unknown_session(backend: Backend, recorder: Recorder) -> None:
    with trio.fail_after(10):
        with pytest.raises(UnknownSession):
            async with recorder.subscribe("nope"):
                pass
        assert backend.subscriber_count(recorder, "nope") == 0


async def test_until_terminal_ends_after_the_terminal_event(backend: Backend, recorder: Recorder) -> None:
    with trio.fail_after(10):
        await recorder.create_session("s1", runtime="scripted")
        await recorder.create_task("s1", "t1", state=TaskState.RUNNING)
        seen: list[NormalizedEvent] = []

        async def follow() -> None:
            async with recorder.subscribe("s1", until_terminal=True) as events:
                seen.extend([event async for event in events])

        async with trio.open_nursery() as nursery:
            nursery.start_soon(follow)
            await recorder.append("s1", [delta("a")])
            await recorder.append(
                "s1", [delta("b"), terminal(EventType.TASK_FAILED, code="X", message="m"), delta("after")],
                task_update=TaskUpdate("t1", state=TaskState.FAILED),
            )
        assert [e.type for e in seen] == [EventType.MODEL_OUTPUT_DELTA] * 2 + [EventType.TASK_FAILED]
        assert backend.subscriber_count(recorder, "s1") == 0


async def test_slow_subscriber_does_not_block_appends_and_misses_nothing(backend: Backend) -> None:
    with trio.fail_after(20):
        async with backend.open(subscriber_buffer=4, page_size=3) as store:
            await store.create_session("s1", runtime="scripted")
            await store.append("s1", [delta("0")])
            async with store.subscribe("s1") as events:
                assert texts(await _take(events, 1)) == ["0"]
                for index in range(1, 51):  # the subscriber is not reading: its feed overflows
                    await store.append("s1", [delta(str(index))] * (index % 3 + 1))
                stored = await store.read("s1")
                assert await _take(events, len(stored) - 1) == stored[1:]
                assert events.overflows >= 1
                await store.append("s1", [delta("live")])
                assert texts(await _take(events, 1)) == ["live"]


async def test_subscriber_ends_with_store_closed(backend: Backend) -> None:
    with trio.fail_after(10):
        outcome: list[object] = []

        async def follow(store: Recorder, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            async with store.subscribe("s1") as events:
                task_status.started()
                try:
                    async for event in events:
                        outcome.append(event.seq)
                except StoreClosed as exc:
                    outcome.append(exc)

        async with trio.open_nursery() as nursery, backend.open() as store:
            await store.create_session("s1", runtime="scripted")
            await nursery.start(follow, store)
            await store.append("s1", [delta("a")])
            while not outcome:  # handed over (a read in a thread looks "blocked" to trio: wait for the event)
                await trio.sleep(0.01)
        assert outcome[0] == 1 and isinstance(outcome[1], StoreClosed)


async def test_many_appenders_and_subscribers(backend: Backend) -> None:
    """Concurrent appends across sessions; subscribers joining at random points see exactly the log."""
    rng = random.Random(1234)
    sessions = [f"s{i}" for i in range(6)]
    with trio.fail_after(40):
        async with backend.open(subscriber_buffer=8, page_size=7) as store:
            for sid in sessions:
                await store.create_session(sid, runtime="scripted")
                await store.create_task(sid, f"{sid}-task", state=TaskState.RUNNING)
            results: list[tuple[str, int, list[NormalizedEvent]]] = []

            async def appender(sid: str, worker: int) -> None:
                for index in range(15):
                    size = rng.randint(1, 4)
                    await store.append(sid, [delta(f"{worker}.{index}.{k}") for k in range(size)])
                    if rng.random() < 0.3:
                        await trio.lowlevel.checkpoint()

            async def subscriber(sid: str, delay: int) -> None:
                for _ in range(delay):
                    await trio.lowlevel.checkpoint()
                after = rng.randint(0, await store.last_seq(sid) + 2)
                seen: list[NormalizedEvent] = []
                async with store.subscribe(sid, after_seq=after, until_terminal=True) as events:
                    async for event in events:
                        # already durable and readable when it is delivered
                        assert await store.read(sid, after_seq=event.seq - 1, limit=1) == [event]
                        seen.append(event)
                results.append((sid, after, seen))

            async with trio.open_nursery() as nursery:
                for sid in sessions:
                    for _ in range(3):
                        nursery.start_soon(subscriber, sid, rng.randint(0, 40))
                async with trio.open_nursery() as appenders:
                    for sid in sessions:
                        for worker in range(4):
                            appenders.start_soon(appender, sid, worker)
                for sid in sessions:
                    await store.append(sid, [terminal()], task_update=TaskUpdate(f"{sid}-task", TaskState.COMPLETED))

            assert len(results) == 3 * len(sessions)
            for sid in sessions:
                stored = await store.read(sid, limit=10_000)
                assert [e.seq for e in stored] == list(range(1, len(stored) + 1))
                assert stored[-1].is_terminal
            for sid, after, seen in results:
                stored = await store.read(sid, limit=10_000)
                assert seen == stored[after:]
            assert store.writer_stats.transactions < store.writer_stats.requests
