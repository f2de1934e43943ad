"""The writer's linger: a paced stream's commit may wait a little for other sessions' to share it, and nothing
else ever waits (``store/_writer.py``, "Linger"). Trio's clock stands still unless a test moves it: whether a
request waited shows as its not being done yet, or the clock having had to move, never as a measured duration."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import apsw
import pytest
import trio
import trio.testing

from codesdk.protocol import EventType, ModelOutputDelta, TaskCompleted
from codesdk.supervisor.engine import session_events
from codesdk.supervisor.store import COMMIT_LINGER_S, MAX_COMMIT_LINGER_S, EventStore, TaskState
from codesdk.supervisor.store._db import SQLiteDb
from codesdk.supervisor.store._writer import COMPANY_WINDOW_S, Writer, WriterStats, WriteRequest
from codesdk.testing.invariants import check_session
from tests.engine.doubles import engine_with_doubles, running_task
from tests.waits import real_time_limit

LINGER_S = 0.002


@asynccontextmanager
async def _writer(tmp_path: Path, linger_s: float = LINGER_S) -> AsyncIterator[tuple[Writer, trio.Nursery]]:
    writer = Writer(SQLiteDb(apsw.Connection(str(tmp_path / "writer.sqlite3"))), lambda session, events: None,
                    max_batch=256, linger_s=linger_s)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer.run)
        try:
            yield writer, nursery
        finally:
            writer.close()


def _request(session: str, *, linger: bool = True) -> WriteRequest[Any]:
    return WriteRequest(lambda _: None, f"a write of {session}", session, linger=linger)


async def _submitted(nursery: trio.Nursery, writer: Writer, request: WriteRequest[Any]) -> WriteRequest[Any]:
    nursery.start_soon(writer.submit, request)
    await trio.testing.wait_all_tasks_blocked()
    return request


async def _company(writer: Writer, *sessions: str) -> None:
    """Other sessions' lingering requests, committed just now: what makes company expected."""
    for session in sessions:
        await writer.submit(_request(session))


async def test_a_paced_stream_waits_for_company_and_shares_its_commit(tmp_path: Path,
                                                                     still_clock: trio.testing.MockClock) -> None:
    async with _writer(tmp_path, linger_s=1.0) as (writer, nursery):
        await _company(writer, "s2")
        before = writer.stats.transactions
        first = await _submitted(nursery, writer, _request("s1"))
        second = await _submitted(nursery, writer, _request("s2"))
        assert not first.done.is_set() and not second.done.is_set(), "the first commit did not wait for company"
        still_clock.jump(1.0)
        with real_time_limit("the writer's requests"):
            await first.done.wait()
            await second.done.wait()
        assert writer.stats.transactions == before + 1, "the two sessions' events were not committed together"
        assert writer.stats.lingers == 1


async def test_a_request_nobody_may_keep_waiting_ends_the_linger_at_once(tmp_path: Path,
                                                                        still_clock: trio.testing.MockClock) -> None:
    """A tool call's record or a task's end (not lingering) goes at once, and takes the waiting stream along."""
    async with _writer(tmp_path, linger_s=1.0) as (writer, nursery):
        await _company(writer, "s2")
        before, started = writer.stats.transactions, trio.current_time()
        waiting = await _submitted(nursery, writer, _request("s1"))
        assert not waiting.done.is_set()
        with real_time_limit("the writer's requests"):
            await writer.submit(_request("s3", linger=False))
            await waiting.done.wait()
        assert trio.current_time() == started, "the request that may not linger waited"
        assert writer.stats.transactions == before + 1


async def test_a_lone_stream_and_every_other_request_never_wait(tmp_path: Path,
                                                               still_clock: trio.testing.MockClock) -> None:
    """No other session lingers lately: no company is expected, so nothing waits (the latency of one stream, or
    of a flood, is not traded for commits it could not share)."""
    async with _writer(tmp_path, linger_s=1.0) as (writer, _):
        started = trio.current_time()
        with real_time_limit("the writer's requests"):
            for _ in range(20):
                await writer.submit(_request("s1"))
            for session in ("s2", "s3"):
                await writer.submit(_request(session, linger=False))
        assert trio.current_time() == started
        assert writer.stats.lingers == 0


async def test_company_seen_too_long_ago_is_not_expected(tmp_path: Path,
                                                         still_clock: trio.testing.MockClock) -> None:
    async with _writer(tmp_path, linger_s=1.0) as (writer, _):
        await _company(writer, "s2")
        still_clock.jump(COMPANY_WINDOW_S * 2)
        started = trio.current_time()
        with real_time_limit("the writer's requests"):
            await writer.submit(_request("s1"))
        assert trio.current_time() == started and writer.stats.lingers == 0


@pytest.fixture
def jumping_clock() -> trio.testing.MockClock:
    """Every wait ends at its deadline at once."""
    return trio.testing.MockClock(autojump_threshold=0)


async def test_a_linger_is_bounded(tmp_path: Path, jumping_clock: trio.testing.MockClock) -> None:
    """Company expected but none comes: the request waits ``linger_s`` and no longer."""
    async with _writer(tmp_path, linger_s=LINGER_S) as (writer, _):
        for session in [f"s{n}" for n in range(2, 60)]:  # a busy host: company expected within the linger
            await writer.submit(_request(session))
        # The writer waited ``linger_s`` for the first of these when it found company expected, so count from now.
        started = trio.current_time()
        await writer.submit(_request("s1"))
        assert trio.current_time() - started == pytest.approx(LINGER_S)
        assert writer.stats.lingers > 0


async def test_no_linger_when_it_is_turned_off(tmp_path: Path, still_clock: trio.testing.MockClock,
                                               ) -> None:
    async with _writer(tmp_path, linger_s=0.0) as (writer, _):
        await _company(writer, *[f"s{n}" for n in range(2, 60)])
        started = trio.current_time()
        with real_time_limit("the writer's requests"):
            await writer.submit(_request("s1"))
        assert trio.current_time() == started and writer.stats.lingers == 0


def test_serve_takes_the_commit_linger_and_refuses_what_it_cannot_keep(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    from codesdk.supervisor.cli.admin import _serve_options, build_parser

    def options(*flags: str) -> float:
        return _serve_options(build_parser().parse_args(["serve", "--data-dir", str(tmp_path), *flags])).commit_linger_s

    assert options() == pytest.approx(COMMIT_LINGER_S)
    assert options("--commit-linger-ms", "0") == 0
    assert options("--commit-linger-ms", "0.5") == pytest.approx(0.0005)
    for bad, said in (("11", "11 ms is outside 0-10 ms"), ("-1", "-1 ms is outside 0-10 ms"),
                      ("soon", "'soon' is not a number of milliseconds"), ("nan", "nan ms is outside 0-10 ms")):
        with pytest.raises(SystemExit):
            options("--commit-linger-ms", bad)
        assert said in capsys.readouterr().err


async def test_the_store_takes_a_linger_within_its_bound(tmp_path: Path) -> None:
    async with EventStore.open(tmp_path / "data") as store:
        assert store.commit_linger_s == 0  # a store opened alone does not linger; the engine sets it
        store.commit_linger_s = MAX_COMMIT_LINGER_S
        assert store.commit_linger_s == MAX_COMMIT_LINGER_S
        for bad in (-0.001, MAX_COMMIT_LINGER_S * 2, float("nan")):
            with pytest.raises(ValueError, match="the commit linger must be between 0 and 10 ms"):
                store.commit_linger_s = bad
        assert store.commit_linger_s == MAX_COMMIT_LINGER_S


async def test_many_paced_streams_through_the_engine_share_commits(tmp_path: Path,
                                                                  still_clock: trio.testing.MockClock) -> None:
    """Twelve tenants' tasks each send one delta, one task after the other, round after round (paced streams on a
    busy host): their appends wait for each other and share commits, and each session's events stay whole and in
    order."""
    sessions, rounds = 12, 8
    with real_time_limit("twelve paced streams"):
        async with engine_with_doubles(tmp_path, commit_linger_s=MAX_COMMIT_LINGER_S) as (engine, workers):
            assert engine.store.commit_linger_s == MAX_COMMIT_LINGER_S
            runs = [await running_task(engine, workers, namespace=f"user:tenant{index}") for index in range(sessions)]
            stats = engine.store.writer_stats
            commits_per_round = []
            for _ in range(rounds):
                before, lingers_before = stats.transactions, stats.lingers
                async with trio.open_nursery() as nursery:
                    for _, task_id, worker in runs:  # one after the other: each reaches the writer alone
                        nursery.start_soon(worker.emit, task_id, EventType.MODEL_OUTPUT_DELTA,
                                           ModelOutputDelta(block_id="b1", delta="x"))
                        await trio.testing.wait_all_tasks_blocked()
                    await _end_each_linger(still_clock, stats, lingers_before, lambda: not nursery.child_tasks)
                commits_per_round.append(stats.transactions - before)
            # Without the linger the first of a round commits alone and the rest queue behind it: two per round. The
            # first round finds no company yet; a write of the engine's own may fall into a round.
            assert commits_per_round.count(1) >= rounds - 2, f"commits per round: {commits_per_round}"
            assert stats.lingers >= rounds - 2
            for session_id, task_id, worker in runs:
                await worker.emit(task_id, EventType.TASK_COMPLETED, TaskCompleted())
                assert (await engine.wait_task(task_id)).state == TaskState.COMPLETED
                events = await session_events(engine.store, session_id)
                check_session(events)
                assert sum(event.type == EventType.MODEL_OUTPUT_DELTA for event in events) == rounds



async def _end_each_linger(clock: trio.testing.MockClock, stats: WriterStats, lingers_ended: int,
                           finished: Callable[[], bool]) -> None:
    """Until ``finished``: move the still clock past each linger once it has begun, and only then. Through the
    engine an append may reach the writer after ``wait_all_tasks_blocked`` returned (it counts a task waiting for
    the store's thread as blocked), so a single jump could come before the linger it was meant to end."""
    while not finished():
        await trio.testing.wait_all_tasks_blocked()
        if stats.lingers > lingers_ended:
            lingers_ended = stats.lingers
            clock.jump(MAX_COMMIT_LINGER_S)
