"""Fairness: one tenant's flood slows only itself.

A task that has streamed many events is a stream: its events are stored as bulk appends, which the writer commits
in transactions of their own, taking turns with everyone else's writes; while others are writing, a stream's events
go in small parts, each followed by a pause as long as it took (``PendingBatch._share``). Nothing here is timed or
counted against the clock: the tests look at the order in which the writer commits (how much of the flood any other
write waited behind) and at how a stream's events were split into appends (trio time standing still where "lately"
matters). How much the flood slows the other tenant is a ratio, measured by ``scripts/bench --case
fairness``.
"""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import apsw
import trio
import trio.testing

from codesdk.protocol import TERMINAL_EVENT_TYPES, EventType, ModelOutputDelta, RuntimeEventParams
from codesdk.supervisor.engine import Engine, session_events
from codesdk.supervisor.engine._batch import SHARE_QUANTUM, STREAM_AFTER_EVENTS, PendingBatch
from codesdk.supervisor.engine._recorder import RunRecorder
from codesdk.supervisor.engine._runs import PendingEvent, TaskRun
from codesdk.supervisor.store import TaskState
from codesdk.supervisor.store._db import Db, SQLiteDb
from codesdk.supervisor.store._writer import Writer, WriteRequest, WriterStats
from codesdk.testing.invariants import check_session
from tests.conftest import MakeEngine
from tests.engine.doubles import FakeWorker, engine_with_doubles, running_task
from tests.waits import real_time_limit

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
    conn = SQLiteDb(apsw.Connection(str(tmp_path / "writer.sqlite3")))
    writer = Writer(conn, lambda session, events: None, max_batch=256)
    ran: list[tuple[str, int]] = []  # (request, the transaction it ran in)
    blocking, release = threading.Event(), threading.Event()

    def block(_: Db) -> None:
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


def _deltas(worker: FakeWorker, task_id: str, count: int) -> list[RuntimeEventParams]:
    return [worker.event(task_id, EventType.MODEL_OUTPUT_DELTA, ModelOutputDelta(block_id="b1", delta="f"))
            for _ in range(count)]


async def test_a_stream_alone_is_never_paced_by_its_own_writes(tmp_path: Path,
                                                              still_clock: trio.testing.MockClock) -> None:
    """A stream goes in small parts, pausing after each, only while another session writes. Its own first events
    (ordinary appends, before it is a stream) are not someone else writing: before the fix, a stream alone split
    its events into parts of SHARE_QUANTUM and paused after each, for its first SHARE_WINDOW_S as a stream. Seen
    here as the number of bulk appends each batch was stored in: one means it never paused."""
    with real_time_limit("a stream alone"):
        async with engine_with_doubles(tmp_path) as (engine, workers):
            _, task_id, worker = await running_task(engine, workers)
            stats = engine.store.writer_stats
            await worker.emit_batch(_deltas(worker, task_id, STREAM_AFTER_EVENTS - 1))  # ordinary, just committed
            assert stats.bulk_requests == 0
            for _ in range(3):  # a stream now, alone
                before = stats.bulk_requests
                await worker.emit_batch(_deltas(worker, task_id, 4 * SHARE_QUANTUM))
                assert stats.bulk_requests - before == 1, "the stream paced itself while nobody else wrote"


async def test_a_stream_goes_in_parts_while_another_session_writes(tmp_path: Path,
                                                                  still_clock: trio.testing.MockClock) -> None:
    """The other side of the fix: another session's appends still make a stream go in parts of SHARE_QUANTUM."""
    with real_time_limit("a stream beside another session"):
        async with engine_with_doubles(tmp_path) as (engine, workers):
            _, task_id, worker = await running_task(engine, workers)
            stats = engine.store.writer_stats
            await worker.emit_batch(_deltas(worker, task_id, STREAM_AFTER_EVENTS - 1))
            await running_task(engine, workers)  # another session's task starts: its events are appended
            before = stats.bulk_requests
            await worker.emit_batch(_deltas(worker, task_id, 4 * SHARE_QUANTUM))
            assert stats.bulk_requests - before == 4


class _SlowRecorder:
    """A recorder whose every append takes one second of trio time (the clock is moved, nothing waits)."""

    def __init__(self, clock: trio.testing.MockClock) -> None:
        self.clock = clock
        self.parts: list[int] = []
        self.store = SimpleNamespace(writer_stats=WriterStats())  # nobody else has written

    async def append(self, run: TaskRun, events: list[PendingEvent], blobs: object = None, *,
                     bulk: bool = False, linger: bool = False) -> bool:
        self.parts.append(len(events))
        self.clock.jump(1.0)
        return True


async def test_a_stream_that_keeps_up_owes_no_pause_and_one_with_a_backlog_does(
        still_clock: trio.testing.MockClock) -> None:
    """While other namespaces are active (a pause factor above 0), a stream whose batch holds a backlog (a flood:
    SHARE_QUANTUM events or more) owes a pause after each part; one whose events come one at a time (a paced model
    stream, however many of them run) owes none. Before, every paced stream paused after each event for as long as
    its commit took times the other namespaces' weights: with 20 paced streams in 20 namespaces the p99 from emit
    to subscriber went from ~12 ms to ~100 ms (scripts/bench --case streams)."""
    recorder = _SlowRecorder(still_clock)
    run = cast(TaskRun, SimpleNamespace(task_id="t1", session_id="s1", next_n=STREAM_AFTER_EVENTS + 1))
    delta = PendingEvent(EventType.MODEL_OUTPUT_DELTA, ModelOutputDelta(block_id="b", delta="x"))

    async def owed(events: int) -> float:
        batch = PendingBatch(cast(RunRecorder, recorder), _never_lost, pause_factor=19.0)
        for _ in range(events):
            batch.add(run, delta)
        await batch.flush()
        return batch.owed_pause_s

    assert await owed(1) == 0.0
    assert await owed(2) == 0.0
    assert await owed(SHARE_QUANTUM) > 0.0
    assert await owed(4 * SHARE_QUANTUM) > 0.0
    assert recorder.parts == [1, 2, SHARE_QUANTUM, *[SHARE_QUANTUM] * 4]


async def _never_lost(run: TaskRun, exc: Exception) -> None:
    raise AssertionError(f"no append fails here: {exc}")


def test_only_other_sessions_appends_count_as_others_writing() -> None:
    """What the stream's pacing asks: when a session other than this one last committed an ordinary append. The
    writer notes each ordinary transaction with the sessions whose appends it held (none for a task row or a
    blob); a session's own appends never count for it."""
    stats = WriterStats()
    never = float("-inf")

    def others() -> tuple[float, float, float]:
        of = stats.last_ordinary_of_others
        return of("s1"), of("s2"), of("s3")

    assert others() == (never, never, never)
    stats.note_ordinary(1.0, {"s1"})
    stats.note_ordinary(2.0, {"s1"})
    assert others() == (never, 2.0, 2.0)
    stats.note_ordinary(3.0, set())  # no session's appends in it
    assert others() == (never, 2.0, 2.0)
    stats.note_ordinary(4.0, {"s2"})
    assert others() == (4.0, 2.0, 4.0)
    stats.note_ordinary(5.0, {"s2"})
    assert others() == (5.0, 2.0, 5.0)
    stats.note_ordinary(6.0, {"s1", "s3"})  # two sessions' appends in one transaction
    assert others() == (6.0, 6.0, 6.0)
    stats.note_ordinary(7.0, {"s3"})
    assert others() == (7.0, 7.0, 6.0)



async def test_a_flood_waits_in_its_own_pipe_while_another_namespace_has_its_turn(tmp_path: Path) -> None:
    """The event path takes turns across namespaces (``codesdk.supervisor.fair``): while another namespace's unit
    is being stored, a flood's batch is not taken in at all (its worker's pump waits, so its output waits in its own
    pipe), and once its turn comes, it is stored in order and in units of at most its quantum (another namespace
    was active just now)."""
    with trio.fail_after(60):
        async with engine_with_doubles(tmp_path) as (engine, workers):
            flood_session, flood_task, flood = await running_task(engine, workers, namespace="user:flooder")
            _, _, other = await running_task(engine, workers, namespace="user:other")
            before = await engine.store.last_seq(flood_session)
            requests_before = engine.store.writer_stats.requests
            async with trio.open_nursery() as nursery:
                async with engine.turns.turn("user:other", 1):  # the other namespace's unit, being stored
                    nursery.start_soon(flood.emit_batch, _deltas(flood, flood_task, 512))
                    await trio.testing.wait_all_tasks_blocked()
                    assert await engine.store.last_seq(flood_session) == before, "the flood went ahead of a turn"
                    assert engine.turns.stats.waited >= 1
            assert await engine.store.last_seq(flood_session) == before + 512
            cap = engine.turns.cap("user:flooder")
            assert engine.store.writer_stats.requests - requests_before >= 512 // cap
            events = await session_events(engine.store, flood_session)
            deltas = [e for e in events if e.type == EventType.MODEL_OUTPUT_DELTA]
            assert len(deltas) == 512 and [e.seq for e in deltas] == sorted(e.seq for e in deltas)


async def test_another_namespaces_event_is_stored_within_one_unit_of_a_running_flood(tmp_path: Path) -> None:
    """A flood's pump hands over batch after batch; another namespace's event, sent meanwhile, is stored after at
    most the flood's unit that was being stored when it arrived (counted in the flood's stored events, not in
    seconds), however much more the flood has queued."""
    with trio.fail_after(120):
        async with engine_with_doubles(tmp_path) as (engine, workers):
            flood_session, flood_task, flood = await running_task(engine, workers, namespace="user:flooder")
            other_session, other_task, other = await running_task(engine, workers, namespace="user:other")
            stop = trio.Event()
            batches = 0

            async def pump() -> None:
                nonlocal batches
                while not stop.is_set() and batches < 200:
                    await flood.emit_batch(_deltas(flood, flood_task, 512))
                    batches += 1

            async with trio.open_nursery() as nursery:
                nursery.start_soon(pump)
                for _ in range(5):
                    while batches < 2:  # the flood is well under way
                        await trio.sleep(0)
                    flooded_before = await engine.store.last_seq(flood_session)
                    await other.emit(other_task, EventType.MODEL_OUTPUT_DELTA, ModelOutputDelta(block_id="o",
                                                                                                 delta="o"))
                    flooded_meanwhile = await engine.store.last_seq(flood_session) - flooded_before
                    assert flooded_meanwhile <= 512, f"{flooded_meanwhile} flood events went first"
                stop.set()
            assert engine.turns.stats.most_overtaken.get("user:other", 0) <= 1
            stored = [e for e in await session_events(engine.store, other_session)
                      if e.type == EventType.MODEL_OUTPUT_DELTA]
            assert len(stored) == 5
