#!/usr/bin/env python3
"""Event store throughput, as ratios against raw apsw doing the same inserts in the same run.

    .venv/bin/python scripts/bench_store.py [--events 20000] [--synchronous FULL|NORMAL]

Shapes measured: one appender appending one event at a time (baseline: one row per transaction), 100
concurrent appenders of one event each (group commit; baseline: one row per transaction), one appender
appending batches of 100 events (baseline: 100 rows per transaction), and reading everything back
(baseline: selecting the rows and json.loads of each body).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.store import raw_rates

from codesdk.protocol import EventType, RuntimeInfo
from codesdk.supervisor.store import EventDraft, EventStore

RUNTIME = RuntimeInfo(name="scripted")


def draft() -> EventDraft:
    return EventDraft(type=EventType.MODEL_OUTPUT_DELTA, runtime=RUNTIME, payload={"block_id": "b", "delta": "x" * 60})


def raw_baseline(path: Path, synchronous: str, events: int, per_txn: int) -> float:
    """Rows/s for plain apsw inserts into the same table shape (the read-back rate is kept alongside)."""
    rates = raw_rates(path, events, per_txn, synchronous)
    raw_baseline.last_read_rate = rates["read"]  # type: ignore[attr-defined]
    return rates["append"]


async def timed(action: Callable[[], Awaitable[int]]) -> float:
    start = time.perf_counter()
    count = await action()
    return count / (time.perf_counter() - start)


async def bench_store(root: Path, synchronous: str, events: int) -> dict[str, float]:
    rates: dict[str, float] = {}
    async with EventStore.open(root, synchronous=synchronous) as store:  # type: ignore[arg-type]
        one = await store.create_session("one", runtime="scripted")
        many = await store.create_session("many", runtime="scripted")
        batched = await store.create_session("batched", runtime="scripted")
        single_count = max(events // 10, 100)

        async def sequential() -> int:
            for _ in range(single_count):
                await store.append(one.session_id, [draft()])
            return single_count

        async def concurrent() -> int:
            async def appender() -> None:
                for _ in range(events // 100):
                    await store.append(many.session_id, [draft()])

            async with trio.open_nursery() as nursery:
                for _ in range(100):
                    nursery.start_soon(appender)
            return (events // 100) * 100

        async def batches() -> int:
            for _ in range(events // 100):
                await store.append(batched.session_id, [draft() for _ in range(100)])
            return (events // 100) * 100

        async def read_all() -> int:
            after, count = 0, 0
            while page := await store.read(batched.session_id, after_seq=after, limit=1000):
                after, count = page[-1].seq, count + len(page)
            return count

        rates["sequential 1/append"] = await timed(sequential)
        before = store.writer_stats.transactions
        rates["100 concurrent 1/append"] = await timed(concurrent)
        rates["(transactions for concurrent)"] = store.writer_stats.transactions - before
        rates["batches of 100"] = await timed(batches)
        rates["read back"] = await timed(read_all)
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--synchronous", choices=["FULL", "NORMAL"], default="FULL")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="codesdk-bench-") as tmp:
        root = Path(tmp)
        single_count = max(args.events // 10, 100)
        raw_single = raw_baseline(root / "raw1.sqlite3", args.synchronous, single_count, 1)
        raw_batch = raw_baseline(root / "raw100.sqlite3", args.synchronous, args.events, 100)
        raw_read = raw_baseline.last_read_rate  # type: ignore[attr-defined]
        rates = trio.run(bench_store, root / "store", args.synchronous, args.events)
    baselines = {
        "sequential 1/append": raw_single,
        "100 concurrent 1/append": raw_single,
        "batches of 100": raw_batch,
        "read back": raw_read,
    }
    print(f"synchronous={args.synchronous}, events={args.events}")
    print(f"{'shape':<26}{'store ev/s':>14}{'raw ev/s':>14}{'ratio':>9}")
    for shape, baseline in baselines.items():
        print(f"{shape:<26}{rates[shape]:>14,.0f}{baseline:>14,.0f}{rates[shape] / baseline:>9.2f}")
    print(f"concurrent appends used {int(rates['(transactions for concurrent)'])} transactions "
          f"for {(args.events // 100) * 100} appends")


if __name__ == "__main__":
    main()
