"""Cases 1-5: event throughput, per-event latency, tool round trip, worker spawn, idle-worker density.

Each function returns one repetition's numbers for CodeSDK or for its raw baseline; ``scripts/bench.py`` repeats
them, takes medians and builds the table.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import psutil
import trio

from codesdk.protocol import EventType, ModelOutputDelta
from codesdk.procs.children import Children
from codesdk.procs.orphans import become_subreaper
from codesdk.supervisor.namespaces import SecretKey
from codesdk.supervisor.service.assembly import SupervisorOptions, open_engine
from codesdk.supervisor.engine import Engine, Telemetry
from codesdk.procs.launch import Launch
from codesdk.supervisor.workers.launch import WorkerPolicy
from codesdk.worker.client import WorkerProcess, WorkerSpec, worker_argv
from codesdk.supervisor.workers.template import WorkerTemplate

from scripts.benchmarks.common import BENCH_WORKER, SCENARIOS, percentile

WORKER_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "CODESDK_SCENARIO_DIR": SCENARIOS}
DELTA = "x" * 20  # a typical small streamed token or two


@asynccontextmanager
async def engine_in(tmp: Path, *, bench_worker: bool = False, idle_timeout_s: float = 300.0,
                    template: bool = False, store: str | None = None) -> AsyncIterator[Engine]:
    """A whole supervisor (store at its shipped durability, pool, tools) in a scratch data dir; ``store``: a
    PostgreSQL URL instead of SQLite in the data dir."""
    options = SupervisorOptions(data_dir=tmp / "data", worker_env={"*": {"CODESDK_SCENARIO_DIR": SCENARIOS}},
                                test_scenarios=True, worker_template=template, store=store,
                                worker_policy=WorkerPolicy(idle_timeout_s=idle_timeout_s),
                                worker_argv=(sys.executable, BENCH_WORKER) if bench_worker else (),
                                # a scratch deployment key: a PostgreSQL store keeps namespace variables under one
                                secret_key=SecretKey(os.urandom(32)) if store is not None else None)
    async with open_engine(options) as engine:
        yield engine


# -- 1. event throughput ----------------------------------------------------------------------------


def _cpu_s() -> float:
    """CPU seconds this process (all its threads, not its children) has used."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def events_codesdk(n: int, store: str | None = None, namespace: str = "default",
                         ready: Callable[[], Awaitable[None]] | None = None,
                         observers: Sequence[Telemetry] = ()) -> tuple[float, float]:
    """Events/s: n deltas from the scripted runtime until one live subscriber has seen task.completed; and the
    supervisor's CPU seconds per event meanwhile (this process: store, engine, subscriber; not the worker).
    ``ready``: awaited once all is warm, just before the flood (to start several supervisors' floods at once).
    ``observers``: the engine's telemetry (the service's metrics, a tracer); none: as ``codesdk run`` has it."""
    with tempfile.TemporaryDirectory(prefix="codesdk-bench-") as tmp:
        async with engine_in(Path(tmp), store=store) as engine:
            for observer in observers:
                engine.observers.add(observer)
            session = await engine.create_session(namespace=namespace)
            warm = await engine.start_task(session.session_id, "warm", runtime_config={"scenario": "echo"})
            await engine.wait_task(warm.task_id)  # the worker is running: spawn time is case 4, not this one
            after = await engine.store.last_seq(session.session_id)
            if ready is not None:
                await ready()
            scenario = {"name": "flood", "steps": [{"flood": n, "delta": DELTA}, {"complete": {}}]}
            seen = 0
            async with engine.store.subscribe(session.session_id, after_seq=after, until_terminal=True) as sub:
                started, cpu = time.perf_counter(), _cpu_s()
                await engine.start_task(session.session_id, "flood", runtime_config={"scenario_inline": scenario})
                async for event in sub:
                    seen += event.type == EventType.MODEL_OUTPUT_DELTA
                elapsed, cpu = time.perf_counter() - started, _cpu_s() - cpu
    if seen != n:
        raise RuntimeError(f"the subscriber saw {seen} deltas of {n}")
    return n / elapsed, cpu / n


def _event_line(n: int, delta: str) -> str:
    return json.dumps({"jsonrpc": "2.0", "method": "runtime.event", "params": {"task_id": "t", "n": n, "event": {
        "type": "model.output.delta", "time": "2026-01-01T00:00:00.000000Z", "runtime": {"name": "scripted"},
        "payload": {"block_id": "b", "kind": "text", "delta": delta, "index": n}}}}, separators=(",", ":"))


def events_baseline(n: int) -> tuple[float, float]:
    """Lines/s: a child writes the same lines to a pipe; the parent reads and json.loads each. And the parent's
    CPU seconds per line."""
    program = f"import sys\nline = {_event_line(1, DELTA)!r} + '\\n'\nw = sys.stdout.write\nfor _ in range({n}): w(line)\n"
    started, cpu = time.perf_counter(), _cpu_s()
    with subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE) as child:
        assert child.stdout is not None
        count = sum(1 for raw in child.stdout if json.loads(raw))
    elapsed, cpu = time.perf_counter() - started, _cpu_s() - cpu
    if count != n:
        raise RuntimeError(f"baseline read {count} lines of {n}")
    return n / elapsed, cpu / n


# -- 2. latency at a fixed offered rate ------------------------------------------------------------------


def _latency_summary(latencies_s: list[float], emitted_span_s: float, count: int) -> dict[str, float]:
    return {"p50": percentile(latencies_s, 50), "p99": percentile(latencies_s, 99), "max": max(latencies_s),
            "achieved_rate": (count - 1) / emitted_span_s if emitted_span_s > 0 else 0.0}


async def latency_codesdk(count: int, rate: float) -> dict[str, float]:
    """Worker emit -> live subscriber receive, per delta, at ``rate`` deltas/s (emit time is carried in the delta)."""
    with tempfile.TemporaryDirectory(prefix="codesdk-bench-") as tmp:
        async with engine_in(Path(tmp), bench_worker=True) as engine:
            session = await engine.create_session(runtime="bench")
            warm = await engine.start_task(session.session_id, "warm", runtime_config={"paced": 20, "rate": rate})
            await engine.wait_task(warm.task_id)
            after = await engine.store.last_seq(session.session_id)
            latencies: list[float] = []
            emitted: list[int] = []
            async with engine.store.subscribe(session.session_id, after_seq=after, until_terminal=True) as sub:
                await engine.start_task(session.session_id, "paced", runtime_config={"paced": count, "rate": rate})
                async for event in sub:
                    if event.type == EventType.MODEL_OUTPUT_DELTA:
                        received = time.time_ns()
                        assert isinstance(event.payload, ModelOutputDelta)
                        sent = int(event.payload.delta)
                        latencies.append((received - sent) / 1e9)
                        emitted.append(sent)
    return _latency_summary(latencies, (emitted[-1] - emitted[0]) / 1e9, count)


_PACED_CHILD = """
import sys, time
count, rate = int(sys.argv[1]), float(sys.argv[2])
head, tail = sys.argv[3], sys.argv[4]
out = sys.stdout
start = time.monotonic()
for index in range(count):
    delay = start + index / rate - time.monotonic()
    if delay > 0:
        time.sleep(delay)
    out.write(head + str(time.time_ns()) + tail)
    out.flush()
"""


def latency_baseline(count: int, rate: float) -> dict[str, float]:
    """The same paced lines from a child to a pipe, read line by line and json.loads'ed in the parent."""
    head, tail = _event_line(0, "@@").split("@@")
    latencies: list[float] = []
    emitted: list[int] = []
    with subprocess.Popen([sys.executable, "-c", _PACED_CHILD, str(count), str(rate), head, tail + "\n"],
                          stdout=subprocess.PIPE, bufsize=0) as child:
        assert child.stdout is not None
        for raw in iter(child.stdout.readline, b""):
            received = time.time_ns()
            sent = int(json.loads(raw)["params"]["event"]["payload"]["delta"])
            latencies.append((received - sent) / 1e9)
            emitted.append(sent)
    return _latency_summary(latencies, (emitted[-1] - emitted[0]) / 1e9, count)


# -- 3. tool round trip ---------------------------------------------------------------------------------


async def tool_codesdk(calls: int, store: str | None = None) -> list[float]:
    """Per-call seconds, measured in the worker: tool.call.requested emitted -> result delivered back."""
    with tempfile.TemporaryDirectory(prefix="codesdk-bench-") as tmp:
        ws = Path(tmp) / "ws"
        ws.mkdir()
        (ws / "f.txt").write_text("hello\n")
        async with engine_in(Path(tmp), bench_worker=True, store=store) as engine:
            session = await engine.create_session(runtime="bench", workspace=ws)
            for config in ({"tool_calls": 3}, {"tool_calls": calls}):  # the first task warms the worker
                after = await engine.store.last_seq(session.session_id)
                task = await engine.start_task(session.session_id, "tools", runtime_config=config)
                record = await engine.wait_task(task.task_id)
            if record.state != "completed":
                raise RuntimeError(f"tool task ended {record.state}: {record}")
            events = await engine.store.read(session.session_id, after_seq=after, limit=100_000)
    timings = [e.payload.delta for e in events if e.type == EventType.MODEL_OUTPUT_DELTA
               and isinstance(e.payload, ModelOutputDelta) and e.payload.block_id == "timings"]
    return [float(t) for t in json.loads(timings[0])]


_ECHO_SERVER = """
import json, sys
out = sys.stdout
for line in sys.stdin:
    request = json.loads(line)
    out.write(json.dumps({"jsonrpc": "2.0", "id": request["id"], "result": {"text": "hello\\n"}}) + "\\n")
    out.flush()
"""


def rpc_baseline(calls: int) -> list[float]:
    """Per-call seconds of a bare JSON-RPC request/response with a child over a pair of pipes."""
    timings = []
    with subprocess.Popen([sys.executable, "-c", _ECHO_SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          bufsize=0) as child:
        assert child.stdin is not None and child.stdout is not None
        for index in range(calls + 3):
            request = {"jsonrpc": "2.0", "id": index, "method": "tools/call",
                       "params": {"name": "workspace.read", "arguments": {"path": "f.txt"}}}
            started = time.perf_counter()
            child.stdin.write(json.dumps(request).encode() + b"\n")
            reply = json.loads(child.stdout.readline())
            elapsed = time.perf_counter() - started
            assert reply["id"] == index
            if index >= 3:
                timings.append(elapsed)
        child.stdin.close()
    return timings


# -- 4. worker spawn ---------------------------------------------------------------------------------------


async def spawn_codesdk() -> float:
    """Seconds from spawning codesdk-worker (a new interpreter) to a completed runtime.initialize."""
    async with trio.open_nursery() as nursery:
        started = time.perf_counter()
        worker = await WorkerProcess.start(nursery, WorkerSpec(argv=worker_argv(), env=WORKER_ENV, name="bench"))
        elapsed = time.perf_counter() - started
        await worker.shutdown()
    return elapsed


async def spawn_forked_codesdk(spawns: int) -> list[float]:
    """Seconds from asking the worker template for a worker to a completed runtime.initialize, ``spawns`` times
    (the template started once, before, in the background: what a service pays per new namespace)."""
    become_subreaper()  # as the supervisor is: the forked workers become our children
    launch = Launch(argv=tuple(worker_argv()), env=WORKER_ENV, cwd="/")
    spec = WorkerSpec(argv=launch.argv, env=launch.env, name="bench")
    children = Children()  # this process's: the template and its workers are owned there
    template = WorkerTemplate(worker_argv(), WORKER_ENV, children)
    times = []
    async with trio.open_nursery() as nursery:
        template.ensure_started(nursery)
        while (state := template.state()) != "ready":  # it starts in the background, as with the pool
            if state != "starting":
                raise RuntimeError(f"the worker template did not start: {state}")
            await trio.sleep(0.01)
        for _ in range(spawns):
            started = time.perf_counter()
            worker = await WorkerProcess.start(nursery, spec, adopted=await template.fork(nursery, launch),
                                               children=children)
            times.append(time.perf_counter() - started)
            await worker.shutdown()
        template.close()
    return times


def spawn_baseline() -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    return time.perf_counter() - started


# -- 5. density ---------------------------------------------------------------------------------------------

MB = 1024 * 1024


def _memory(pid: int) -> tuple[float, float]:
    info = psutil.Process(pid).memory_full_info()
    return info.rss / MB, info.uss / MB


async def density_codesdk(workers: int, template: bool = True) -> dict[str, Any]:
    """Start ``workers`` idle namespaces through the pool (forked from the worker template, as the service does,
    or each a new interpreter); per-worker RSS/USS (medians) and supervisor RSS."""
    with tempfile.TemporaryDirectory(prefix="codesdk-bench-") as tmp:
        async with engine_in(Path(tmp), idle_timeout_s=3600, template=template) as engine:
            while template and (state := engine.pool.template_state()) != "ready":  # a service's first second
                if state != "starting":
                    raise RuntimeError(f"the worker template did not start: {state}")
                await trio.sleep(0.01)
            rss_before = psutil.Process().memory_info().rss / MB
            limiter = trio.CapacityLimiter(4)
            pids: list[int] = []

            async def start(index: int) -> None:
                async with limiter:
                    namespace = f"user:bench{index}"
                    worker = await engine.pool.acquire(namespace)
                    engine.pool.release(namespace, worker)
                    pids.append(worker.pid)

            started = time.perf_counter()
            async with trio.open_nursery() as nursery:
                for index in range(workers):
                    nursery.start_soon(start, index)
            startup_s = time.perf_counter() - started
            await trio.sleep(1.0)  # let start-up garbage settle
            memory = [_memory(pid) for pid in pids]
            supervisor_rss = psutil.Process().memory_info().rss / MB
    rss, uss = [m[0] for m in memory], [m[1] for m in memory]
    return {"workers": workers, "rss_mb": percentile(rss, 50), "uss_mb": percentile(uss, 50),
            "uss_max_mb": max(uss), "supervisor_rss_mb": supervisor_rss,
            "supervisor_growth_mb": supervisor_rss - rss_before, "startup_s": startup_s}


def density_baseline() -> dict[str, float]:
    """RSS/USS of a bare idle interpreter (``python -c`` blocked reading stdin)."""
    with subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE) as child:
        time.sleep(0.5)
        rss, uss = _memory(child.pid)
        assert child.stdin is not None
        child.stdin.close()
    return {"rss_mb": rss, "uss_mb": uss}


def os_cpu_note() -> str:
    return f"{os.cpu_count()} cores"


# -- 8. cold start of a real runtime --------------------------------------------------------------------------


def cold(p: dict[str, Any]) -> list[Any]:
    """Case 8 (``cold``): one cold ``codesdk run --runtime claude`` vs ``claude -p`` directly, as a ratio and a
    difference (``real_runtime.case_cold``; like case 7 it runs inside scripts/netns-run or skips with the reason).
    scripts/bench.py runs it as ``--case cold`` once ``"cold"`` is in its CASES and ``"cold": cases.cold`` in its
    RUNNERS."""
    from scripts.benchmarks import real_runtime

    return real_runtime.case_cold(p["cold_repeat"])


# -- 9. fairness: another tenant's small task while one tenant floods --------------------------------------------

FAIR_FLOOD = 1_000_000  # far more than is stored while the other tenant's tasks run; the flood is stopped after
FAIR_WARM_EVENTS = 2_000  # the flood is streaming (past the stream threshold) before anything is timed
FAIR_ALONE_EVENTS = 10_000  # the flood's rate alone, measured over this many events


async def _small_task(engine: Engine, session_id: str) -> float:
    """Seconds from start_task to the stored terminal event of a small task (scripted ``echo``)."""
    started = time.perf_counter()
    task = await engine.start_task(session_id, "hello", runtime_config={"scenario": "echo"})
    record = await engine.wait_task(task.task_id)
    elapsed = time.perf_counter() - started
    if record.state != "completed":
        raise RuntimeError(f"the other tenant's task ended {record.state}: {record.error}")
    return elapsed


async def _stored_at_least(engine: Engine, session_id: str, count: int) -> None:
    with trio.fail_after(120):
        while await engine.store.last_seq(session_id) < count:
            await trio.sleep(0.02)


async def fairness_codesdk(tasks: int) -> dict[str, Any]:
    """One supervisor, two tenants (namespaces): the other tenant's small tasks one after another, first with
    nothing else running (its quiet p50, the same-run baseline), then while the flooding tenant streams a
    million deltas. Also the flood's own rate alone and while it shares."""
    with tempfile.TemporaryDirectory(prefix="codesdk-bench-") as tmp:
        async with engine_in(Path(tmp)) as engine:
            flooder = await engine.create_session(namespace="user:flooder")
            other = await engine.create_session(namespace="user:other")
            for session in (flooder, other):  # both workers running: spawn time is case 4
                await _small_task(engine, session.session_id)
            quiet = [await _small_task(engine, other.session_id) for _ in range(tasks)]
            base = await engine.store.last_seq(flooder.session_id)
            scenario = {"name": "flood", "steps": [{"flood": FAIR_FLOOD, "delta": "y" * 16}, {"complete": {}}]}
            flood = await engine.start_task(flooder.session_id, "flood", runtime_config={"scenario_inline": scenario})
            await _stored_at_least(engine, flooder.session_id, base + FAIR_WARM_EVENTS)
            alone_from, alone_started = await engine.store.last_seq(flooder.session_id), time.perf_counter()
            await _stored_at_least(engine, flooder.session_id, alone_from + FAIR_ALONE_EVENTS)
            alone_to, alone_ended = await engine.store.last_seq(flooder.session_id), time.perf_counter()
            flooded = [await _small_task(engine, other.session_id) for _ in range(tasks)]
            shared_to, shared_ended = await engine.store.last_seq(flooder.session_id), time.perf_counter()
            still = (await engine.store.get_task(flood.task_id)).state
            await engine.stop_task(flood.task_id)
    if still != "running":
        raise RuntimeError(f"the flood ended ({still}) before the other tenant's tasks did: raise FAIR_FLOOD")
    return {"quiet": quiet, "flooded": flooded, "quiet_p50": percentile(quiet, 50),
            "flooded_p50": percentile(flooded, 50), "quiet_p90": percentile(quiet, 90),
            "flooded_p90": percentile(flooded, 90),
            "flood_alone_rate": (alone_to - alone_from) / (alone_ended - alone_started),
            "flood_shared_rate": (shared_to - alone_to) / (shared_ended - alone_ended)}
