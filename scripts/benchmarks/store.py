"""Case 6: the event store alone, against raw apsw doing the same work on the same table shape.

Append one event per commit (baseline: one row per transaction), append in batches (baseline: the same rows
per transaction), read everything back page by page (baseline: SELECT + json.loads), and a supervisor restart
with many stored events: opening the store and the engine, recovery included (baseline: opening the SQLite
file raw and asking it for the newest seq).
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

import apsw
import trio

from codesdk.protocol import EventType, RuntimeInfo
from codesdk.supervisor.service.assembly import SupervisorOptions, open_engine
from codesdk.supervisor.store import EventDraft, EventStore, TaskState

RUNTIME = RuntimeInfo(name="scripted")
BODY = json.dumps({"schema_version": 1, "time": "2026-01-01T00:00:00Z", "type": "model.output.delta",
                   "trace": {"session_id": "s"}, "runtime": {"name": "scripted"},
                   "payload": {"block_id": "b", "kind": "text", "delta": "x" * 20, "index": 0}})


def _draft(index: int = 0) -> EventDraft:
    return EventDraft(type=EventType.MODEL_OUTPUT_DELTA, runtime=RUNTIME,
                      payload={"block_id": "b", "delta": "x" * 20, "index": index})


def raw_rates(path: Path, events: int, per_txn: int, synchronous: str = "FULL") -> dict[str, float]:
    """Rows/s of plain apsw inserts (WAL, synchronous=FULL like the store), and of reading them back."""
    conn = apsw.Connection(str(path))
    conn.pragma("journal_mode", "WAL")
    conn.pragma("synchronous", synchronous)
    conn.execute("CREATE TABLE events (session_id TEXT, seq INTEGER, task_id TEXT, type TEXT, time TEXT, "
                 "schema_version INTEGER, body TEXT, PRIMARY KEY (session_id, seq)) WITHOUT ROWID")
    started = time.perf_counter()
    seq = 0
    while seq < events:
        with conn:
            rows = []
            for _ in range(per_txn):
                seq += 1
                rows.append(("s", seq, None, "model.output.delta", "2026-01-01T00:00:00+00:00", 1, BODY))
            conn.executemany("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
    append = seq / (time.perf_counter() - started)
    started = time.perf_counter()
    after, read = 0, 0
    while True:  # paged like the store: 500 rows a query, keyed on the last seq
        page = list(conn.execute("SELECT seq, body FROM events WHERE session_id = 's' AND seq > ? ORDER BY seq "
                                 "LIMIT 500", (after,)))
        if not page:
            break
        for _, body in page:
            json.loads(body)
        after, read = page[-1][0], read + len(page)
    rate_read = read / (time.perf_counter() - started)
    conn.close()
    return {"append": append, "read": rate_read}


async def store_rates(root: Path, single: int, batched: int, batch: int) -> dict[str, float]:
    """Events/s of the EventStore: one append per event, batches of ``batch``, and paging the batched ones."""
    async with EventStore.open(root) as store:
        one = await store.create_session("one", runtime="scripted")
        many = await store.create_session("many", runtime="scripted")
        started = time.perf_counter()
        for index in range(single):
            await store.append(one.session_id, [_draft(index)])
        single_rate = single / (time.perf_counter() - started)
        started = time.perf_counter()
        for start in range(0, batched, batch):
            await store.append(many.session_id, [_draft(i) for i in range(start, start + batch)])
        batched_rate = batched / (time.perf_counter() - started)
        started = time.perf_counter()
        after, read = 0, 0
        while page := await store.read(many.session_id, after_seq=after, limit=500):
            after, read = page[-1].seq, read + len(page)
        read_rate = read / (time.perf_counter() - started)
    return {"single": single_rate, "batched": batched_rate, "read": read_rate}


async def fill(data_dir: Path, events: int, sessions: int = 100, batch: int = 1000) -> float:
    """Store ``events`` deltas over ``sessions`` sessions, leaving one task 'running' for recovery; events/s."""
    async with EventStore.open(data_dir) as store:
        started = time.perf_counter()
        per_session = events // sessions
        for index in range(sessions):
            session = await store.create_session(f"ses_{index}", runtime="scripted")
            for start in range(0, per_session, batch):
                await store.append(session.session_id, [_draft(i) for i in range(start, min(start + batch,
                                                                                          per_session))])
        await store.create_task("ses_0", "task_left_running", runtime="scripted", state=TaskState.RUNNING)
        return per_session * sessions / (time.perf_counter() - started)


async def restart(data_dir: Path) -> float:
    """Seconds to open the whole supervisor on an existing data dir (recovery included) and read a last seq."""
    started = time.perf_counter()
    async with open_engine(SupervisorOptions(data_dir=data_dir)) as engine:
        await engine.store.last_seq("ses_0")
        elapsed = time.perf_counter() - started
    return elapsed


def restart_baseline(data_dir: Path) -> float:
    """Seconds to open the SQLite file raw (WAL) and read the newest seq of a session."""
    started = time.perf_counter()
    conn = apsw.Connection(str(data_dir / "codesdk.sqlite3"))
    conn.pragma("journal_mode", "WAL")
    conn.execute("SELECT max(seq) FROM events WHERE session_id = 'ses_0'").fetchall()
    elapsed = time.perf_counter() - started
    conn.close()
    return elapsed


def run_store_case(single: int, batched: int, stored: int, repeat: int) -> dict[str, Any]:
    """All store figures for one run: lists of per-repetition values (fill and restart use one data dir)."""
    out: dict[str, list[float]] = {k: [] for k in ("single", "single_raw", "batched", "batched_raw", "read",
                                                   "read_raw", "restart", "restart_raw")}
    with tempfile.TemporaryDirectory(prefix="codesdk-bench-store-") as tmp:
        root = Path(tmp)
        for rep in range(repeat):
            raw_single = raw_rates(root / f"raw1-{rep}.sqlite3", single, 1)
            raw_batched = raw_rates(root / f"raw100-{rep}.sqlite3", batched, 100)
            ours = trio.run(store_rates, root / f"store-{rep}", single, batched, 100)
            out["single"].append(ours["single"])
            out["single_raw"].append(raw_single["append"])
            out["batched"].append(ours["batched"])
            out["batched_raw"].append(raw_batched["append"])
            out["read"].append(ours["read"])
            out["read_raw"].append(raw_batched["read"])
        data_dir = root / "big"
        fill_rate = trio.run(fill, data_dir, stored)
        for _ in range(repeat):
            out["restart"].append(trio.run(restart, data_dir))
            out["restart_raw"].append(restart_baseline(data_dir))
        size_mb = sum(p.stat().st_size for p in data_dir.glob("codesdk.sqlite3*")) / 2**20
    return {**out, "fill_rate": fill_rate, "stored": stored, "db_mb": size_mb}

