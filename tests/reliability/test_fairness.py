"""Fairness: one tenant's flood slows only itself.

A task that has streamed many events is a stream: its events are stored as bulk appends, which the writer commits
in transactions of their own, taking turns with everyone else's writes; while others are writing, a stream's events
go in small parts, each followed by a pause as long as it took (``PendingBatch._share``). Nothing here is timed or
counted against the clock: the tests look at the order in which the writer commits (how much of the flood any other
write waited behind). How much the flood slows the other tenant is a ratio, measured by ``scripts/bench --case
fairness``.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import apsw
import trio
import trio.testing

from protocol import TERMINAL_EVENT_TYPES
from supervisor.engine import Engine
from supervisor.engine._transcript import session_events
from supervisor.store import TaskState
from supervisor.store._writer import Writer, WriteRequest

from ..conftest import MakeEngine
from ..e2e.invariants import check_session

FLOOD = 1_000_000  # never reached: the flood is stopped at the end
WARM = 3_000  # the flood is a stream with a backlog before the other tenant starts
OTHER_TASKS = 10


def _flood(n: int) -> dict[str, object]:
    return {"scenario_inline": {"name": "flood", "steps": [{"flood": n, "delta": "f" * 16}, {"complete": {}}]}}


async def _echo(engine: Engine, session_id: str) -> None:
    task = await engine.start_task(session_id, "hello", runtime_config={"scenario": "echo"})
    record = await engine.wait_task(task.task_id)
    assert record.state == TaskState.COMPLETED, record


async def test_another_tenants_tasks_finish_while_a_flood_is_far_from_done(make_engine: MakeEngine) -> None:
    with trio.fail_after(240):
        async with make_engine() as engine:
            flooder = await engine.create_session(namespace="user:flooder")
            other = await engine.create_session(namespace="user:other")
            for session in (flooder, other):  # both workers running
                await _echo(engine, session.session_id)
            after_warm_up = await engine.store.last_seq(flooder.session_id)
            async with engine.store.subscribe(flooder.session_id, after_seq=after_warm_up) as flood_events:
                flood = await engine.start_task(flooder.session_id, "flood", runtime_config=_flood(FLOOD))
                async for event in flood_events:  # the flood is streaming, far past the stream threshold
                    if event.seq >= after_warm_up + WARM:
                        break
            for _ in range(OTHER_TASKS):
                await _echo(engine, other.session_id)
            assert engine.active_task(flooder.session_id) == flood.task_id, "the flood ended first"
            # Before the fix each of the other tenant's writes queued behind the flood's backlog of 512-event
            # transactions (the flood stored 6,000-21,000 events during the ten tasks); now no write ever waits
            # for more than one of the flood's (bounded) transactions.
            stats = engine.store.writer_stats
            assert stats.most_bulk_waited <= 1, f"an ordinary write waited for {stats.most_bulk_waited} bulk commits"
            await engine.stop_task(flood.task_id)
            assert (await engine.wait_task(flood.task_id)).state == TaskState.STOPPED
            assert engine.store.writer_stats.bulk_transactions > 0
            for session in (flooder, other):  # gap-free seqs, one terminal event each, nothing after it
                events = await session_events(engine.store, session.session_id)
                check_session(events)
            terminals = [e for e in events if e.type in TERMINAL_EVENT_TYPES]
            assert len(terminals) == OTHER_TASKS + 1


async def test_the_writer_lets_ordinary_writes_pass_a_stream_and_keeps_each_sessions_order(tmp_path: Path) -> None:
    """Bulk and ordinary requests never share a transaction and take turns when both wait: an ordinary write
    waits for at most one bulk transaction. A session's requests commit in the order they were queued, so its
    ordinary request queued behind its own bulk one goes with that bulk turn. Each bulk turn takes one bulk
    request per session (round robin across streams)."""
    conn = apsw.Connection(str(tmp_path / "writer.sqlite3"))
    writer = Writer(conn, lambda session, events: None, max_batch=256)
    ran: list[tuple[str, int]] = []  # (request, the transaction it ran in)
    blocking, release = threading.Event(), threading.Event()

    def block(_: apsw.Connection) -> None:
        blocking.set()
        release.wait()

    def record(name: str) -> Any:
        return lambda _: ran.append((name, writer.stats.transactions))

    queued = [  # name, session, bulk — in the order they are queued while the writer is busy
        ("bulk-1 of s1", "s1", True), ("bulk-1 of s2", "s2", True), ("ordinary of s3", "s3", False),
        ("bulk-2 of s1", "s1", True), ("ordinary of s1", "s1", False), ("ordinary of s4", "s4", False),
        ("bulk-2 of s2", "s2", True),
    ]
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer.run)
            nursery.start_soon(writer.submit, WriteRequest(block, "the writer is busy"))
            await trio.to_thread.run_sync(blocking.wait)
            async with trio.open_nursery() as submitters:
                for name, session, bulk in queued:
                    submitters.start_soon(writer.submit, WriteRequest(record(name), name, session, bulk=bulk))
                    await trio.testing.wait_all_tasks_blocked()  # queued before the next one
                release.set()
            writer.close()
    assert ran == [
        ("bulk-1 of s1", 1), ("bulk-1 of s2", 1),  # one bulk request per session
        ("ordinary of s3", 2), ("ordinary of s4", 2),  # ordinary work after at most one bulk transaction
        ("bulk-2 of s1", 3), ("ordinary of s1", 3), ("bulk-2 of s2", 3),  # s1's order kept
    ]
    assert writer.stats.bulk_transactions == 2 and writer.stats.bulk_requests == 4
    assert writer.stats.most_bulk_waited == 1
