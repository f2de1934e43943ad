"""Case 'postgres': the event store on PostgreSQL, each figure against a baseline from the same run.

- appends through the store (one per commit, batches of 100) on PostgreSQL, against raw psycopg doing the same
  inserts on the same table shape, and against the SQLite store (the embedded default, at its shipped FULL);
- the round trips of one append (one event per commit), counted in a libpq protocol trace, against raw psycopg's
  BEGIN, INSERT, COMMIT;
- events through a whole supervisor (scripted flood -> worker -> engine -> store -> one live subscriber) and the
  tool round trip, with the store on PostgreSQL against the same on SQLite;
- aggregate events/s of two supervisor processes flooding one database at once, against one alone;
- lease failover: SIGKILL of the supervisor running a task until the other has failed it, against the lease.

The server is a throwaway one the run starts on a unix socket (``tests/postgres.py``) with ``fsync=on``, as a
production server runs; where none can be started the case is skipped with the reason.

Run as a script (``postgres.py flood URL NAMESPACE N``) it is one supervisor of the two-supervisor figure.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if __name__ == "__main__":
    sys.path[:0] = [str(REPO), str(REPO / "scripts")]

import httpx2 as httpx
import trio

from benchmarks import cases
from benchmarks.common import SCENARIOS
from benchmarks.store import BODY, _draft
from codesdk.supervisor.store import EventStore, open_postgres


def unavailable() -> str | None:
    from tests.postgres import unavailable as why

    return why()


# -- appends --------------------------------------------------------------------------------------------


def raw_psycopg(url: str, events: int, per_txn: int) -> float:
    """Rows/s of plain psycopg inserts into the same table shape, ``per_txn`` rows a transaction."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        table = f"raw_{per_txn}_{os.getpid()}_{time.monotonic_ns()}"
        conn.execute(f"CREATE TABLE {table} (session_id TEXT, seq BIGINT, task_id TEXT, type TEXT, time TEXT, "
                     "schema_version INTEGER, body TEXT, PRIMARY KEY (session_id, seq))")
        started = time.perf_counter()
        seq = 0
        while seq < events:
            with conn.transaction(), conn.cursor() as cursor:
                rows = []
                for _ in range(per_txn):
                    seq += 1
                    rows.append(("s", seq, None, "model.output.delta", "2026-01-01T00:00:00+00:00", 1, BODY))
                cursor.executemany(f"INSERT INTO {table} VALUES (%s, %s, %s, %s, %s, %s, %s)", rows)
        return seq / (time.perf_counter() - started)


async def store_appends(opened: Any, single: int, batched: int) -> dict[str, float]:
    """Events/s of one store: one append per event, then batches of 100."""
    async with opened as store:
        await store.create_session("one", runtime="scripted")
        await store.create_session("many", runtime="scripted")
        started = time.perf_counter()
        for index in range(single):
            await store.append("one", [_draft(index)])
        one = single / (time.perf_counter() - started)
        started = time.perf_counter()
        for start in range(0, batched, 100):
            await store.append("many", [_draft(i) for i in range(start, start + 100)])
        return {"single": one, "batched": batched / (time.perf_counter() - started)}


def round_trips(trace: str) -> int:
    """Times the client spoke and then heard back in a libpq protocol trace (an upper bound on round trips)."""
    turns, last = 0, None
    for line in trace.splitlines():
        direction = line.split("\t")[1] if line.count("\t") >= 3 else None
        if direction == "B" and last == "F":
            turns += 1
        last = direction or last
    return turns


def _traced(conn: Any, work: Any) -> int:
    with tempfile.TemporaryFile("w+") as out:
        conn.pgconn.trace(out.fileno())
        try:
            work()
        finally:
            conn.pgconn.untrace()
        out.seek(0)
        return round_trips(out.read())


def append_round_trips(url: str) -> tuple[int, int]:
    """Round trips of one append of one event through the store (its writer's connection, warmed up first), and of
    raw psycopg storing one row in a transaction of its own."""
    import psycopg

    async def ours() -> int:
        async with open_postgres(url) as store:
            await store.create_session("trips", runtime="scripted")
            for index in range(3):
                await store.append("trips", [_draft(index)])
            conn = store._writer._conn.conn  # type: ignore[union-attr, attr-defined]
            return await trio.to_thread.run_sync(_traced, conn, lambda: trio.from_thread.run(
                store.append, "trips", [_draft(3)]))

    store_trips = trio.run(ours)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE raw_trips (seq BIGINT PRIMARY KEY, body TEXT)")

        def raw() -> None:
            with conn.transaction():
                conn.execute("INSERT INTO raw_trips VALUES (%s, %s)", (1, BODY))

        return store_trips, _traced(conn, raw)


# -- two supervisors against one ------------------------------------------------------------------------


def flood_process(url: str, namespace: str, events: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, __file__, "flood", url, namespace, str(events)], cwd=REPO,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            env={**os.environ, "CODESDK_SCENARIO_DIR": SCENARIOS})


def aggregate_rate(url: str, namespaces: list[str], events: int) -> float:
    """Events/s of ``len(namespaces)`` supervisor processes flooding at once: each starts up and warms its worker,
    says so, and floods when told to (all together); all their events over the span from the first flood's start
    to the last one's end."""
    processes = [flood_process(url, namespace, events) for namespace in namespaces]
    for process in processes:
        assert process.stdout is not None
        if process.stdout.readline().strip() != b"ready":
            raise RuntimeError("a flooding supervisor did not start")
    for process in processes:
        assert process.stdin is not None
        process.stdin.write(b"go\n")
        process.stdin.flush()
    spans = []
    for process in processes:
        out, _ = process.communicate(timeout=600)
        if process.returncode:
            raise RuntimeError(f"a flooding supervisor failed ({process.returncode})")
        spans.append(json.loads(out))
    return float(events * len(namespaces)) / float(max(s["end"] for s in spans) - min(s["start"] for s in spans))


async def _flood(url: str, namespace: str, events: int) -> dict[str, float]:
    """One whole supervisor on ``url`` flooding ``events`` deltas in ``namespace``; when its flood began and ended
    (wall clock, to line up with the other process)."""
    async def ready() -> None:
        print("ready", flush=True)
        await trio.to_thread.run_sync(sys.stdin.readline)

    rate, _ = await cases.events_codesdk(events, store=url, namespace=namespace, ready=ready)
    end = time.time()
    return {"start": end - events / rate, "end": end}


# -- failover -------------------------------------------------------------------------------------------


def failover_s(url: str, lease_s: float) -> float:
    """Seconds from SIGKILL of the supervisor running a task to the other supervisor having stored its failure."""
    import psycopg

    with tempfile.TemporaryDirectory(prefix="codesdk-bench-failover-") as tmp:
        root = Path(tmp)
        procs = []
        key = base64.b64encode(os.urandom(32)).decode()  # one scratch deployment key for both supervisors
        try:
            clients = []
            for name in ("a", "b"):
                (root / name).mkdir(mode=0o700)
                if clients:  # the admin token is the database's, made by the first: copied, as an operator does
                    (root / name / "admin.token").write_text((root / "a" / "admin.token").read_text())
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "codesdk.supervisor.cli.admin", "serve", "--data-dir", str(root / name),
                     "--enable-test-scenarios", "--store", url, "--lease-s", str(lease_s), "--no-worker-template"],
                    cwd=REPO, env={**os.environ, "CODESDK_SCENARIO_DIR": SCENARIOS, "CODESDK_SECRET_KEY": key},
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
                clients.append(_client(root / name))
            session = clients[0].post("/v1/sessions", json={"namespace": f"user:bench-{time.monotonic_ns()}"}).json()
            task = clients[0].post(f"/v1/sessions/{session['session_id']}/tasks",
                                   json={"prompt": "x", "runtime_config": {"scenario": "hang"}}).json()
            _until(lambda: clients[0].get(f"/v1/tasks/{task['task_id']}").json()["state"] == "running")
            killed = time.perf_counter()
            procs[0].send_signal(signal.SIGKILL)
            with psycopg.connect(url, autocommit=True) as conn:
                _until(lambda: conn.execute("SELECT state FROM tasks WHERE task_id = %s",
                                            (task["task_id"],)).fetchone() == ("failed",), pause_s=0.01)
            elapsed = time.perf_counter() - killed
            for client in clients:
                client.close()
            return elapsed
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=120)
            from codesdk.supervisor.groups import remove_left

            for name in ("a", "b"):  # the SIGKILLed one closed nothing: its resource groups go with its data dir
                remove_left(root / name)


def _client(data_dir: Path) -> httpx.Client:
    socket = data_dir / "api.sock"
    _until(lambda: socket.exists() and (data_dir / "admin.token").exists())
    token = (data_dir / "admin.token").read_text().strip()
    client = httpx.Client(transport=httpx.HTTPTransport(uds=str(socket)), base_url="http://codesdk",
                          headers={"Authorization": f"Bearer {token}"}, timeout=60)
    _until(lambda: _ready(client))
    return client


def _ready(client: httpx.Client) -> bool:
    try:
        return client.get("/readyz").status_code == 200
    except httpx.TransportError:  # before the socket listens
        return False


def _until(condition: Any, guard_s: float = 120.0, pause_s: float = 0.05) -> None:
    deadline = time.monotonic() + guard_s
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError("gave up waiting")
        time.sleep(pause_s)


# -- the case -------------------------------------------------------------------------------------------


def run_postgres_case(p: dict[str, Any]) -> dict[str, Any]:
    from tests.postgres import PostgresServer

    out: dict[str, list[float]] = {k: [] for k in (
        "pg_single", "raw_single", "sqlite_single", "pg_batched", "raw_batched", "sqlite_batched",
        "pg_events", "sqlite_events", "pg_tool", "sqlite_tool", "two", "one", "failover", "trips", "raw_trips")}
    server = PostgresServer(fsync=True)
    try:
        server.start()
        with tempfile.TemporaryDirectory(prefix="codesdk-bench-pg-") as tmp:
            for rep in range(p["repeat"]):
                raw = server.new_database()
                out["raw_single"].append(raw_psycopg(raw, p["single"], 1))
                out["raw_batched"].append(raw_psycopg(raw, p["batched"], 100))
                trips, raw_trips = append_round_trips(server.new_database())
                out["trips"].append(trips)
                out["raw_trips"].append(raw_trips)
                url = server.new_database()
                ours = trio.run(store_appends, open_postgres(url), p["single"], p["batched"])
                sqlite = trio.run(store_appends, EventStore.open(Path(tmp) / f"sqlite-{rep}"), p["single"],
                                  p["batched"])
                for kind in ("single", "batched"):
                    out[f"pg_{kind}"].append(ours[kind])
                    out[f"sqlite_{kind}"].append(sqlite[kind])
                out["pg_events"].append(trio.run(cases.events_codesdk, p["events"], url)[0])
                out["sqlite_events"].append(trio.run(cases.events_codesdk, p["events"])[0])
                out["pg_tool"].append(_p50(trio.run(cases.tool_codesdk, p["calls"], url)))
                out["sqlite_tool"].append(_p50(trio.run(cases.tool_codesdk, p["calls"])))
                flood = p["pg_flood"]
                out["one"].append(aggregate_rate(server.new_database(), ["user:one"], flood))
                out["two"].append(aggregate_rate(server.new_database(), ["user:one", "user:two"], flood))
                out["failover"].append(failover_s(server.new_database(), p["lease_s"]))
    finally:
        server.close()
    return out


def _p50(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[len(ordered) // 2]


if __name__ == "__main__":
    if sys.argv[1:2] == ["flood"]:
        print(json.dumps(trio.run(_flood, sys.argv[2], sys.argv[3], int(sys.argv[4]))))
