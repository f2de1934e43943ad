"""End-to-end benchmarks, each reported next to a raw baseline measured in the same run, as a ratio.

    .venv/bin/python scripts/bench.py [--repeat 3] [--events 20000] [--calls 50] [--json results.json]

Cases (median of --repeat runs, with min..max):
- events:  the scripted runtime floods N deltas through worker -> supervisor -> store (synchronous=FULL) -> one
           live subscriber.  Baseline: a child process writing the same number of JSON lines to a pipe, parsed
           with json.loads in the parent.
- spawn:   cold start of codesdk-worker to a completed runtime.initialize.  Baseline: `python -c pass`.
- tool:    a scripted task making K sequential workspace.read calls (request -> policy -> run -> result back
           in the runtime), per call.  Baseline: a bare JSON-RPC request/response to a worker over its pipes.
No timed assertions anywhere: this prints numbers; docs/performance.md records them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from protocol import EventType, Method
from supervisor.app import SupervisorOptions, open_engine
from supervisor.workers import WorkerProcess, WorkerSpec, worker_argv

SCENARIOS = str(REPO / "fixtures" / "scenarios")
ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "CODESDK_SCENARIO_DIR": SCENARIOS}


def _median(samples: list[float]) -> tuple[float, float, float]:
    return statistics.median(samples), min(samples), max(samples)


# -- events ---------------------------------------------------------------------------------------


async def events_through_codesdk(n: int) -> float:
    """Seconds from task start to the subscriber seeing task.completed after n deltas."""
    with tempfile.TemporaryDirectory() as tmp:
        options = SupervisorOptions(data_dir=Path(tmp), worker_env={"*": {"CODESDK_SCENARIO_DIR": SCENARIOS}})
        async with open_engine(options) as engine:
            session = await engine.create_session()
            # warm the worker so spawn time is not counted here
            warm = await engine.start_task(session.session_id, "warm", runtime_config={"scenario": "echo"})
            await engine.wait_task(warm.task_id)
            after = await engine.store.last_seq(session.session_id)
            scenario = {"name": "flood", "steps": [{"flood": n, "delta": "x" * 20}, {"complete": {}}]}
            started = time.perf_counter()
            await engine.start_task(session.session_id, "flood", runtime_config={"scenario_inline": scenario})
            seen = 0
            async with engine.store.subscribe(session.session_id, after_seq=after, until_terminal=True) as sub:
                async for event in sub:
                    seen += event.type == EventType.MODEL_OUTPUT_DELTA
            elapsed = time.perf_counter() - started
            assert seen == n, (seen, n)
            return elapsed


def events_baseline(n: int) -> float:
    line = json.dumps({"jsonrpc": "2.0", "method": "runtime.event", "params": {"task_id": "t", "n": 1, "event": {
        "type": "model.output.delta", "time": "2026-01-01T00:00:00Z", "runtime": {"name": "scripted"},
        "payload": {"block_id": "b", "kind": "text", "delta": "x" * 20, "index": 0}}}})
    program = f"import sys\nline = {line!r} + '\\n'\nw = sys.stdout.write\nfor _ in range({n}): w(line)\n"
    started = time.perf_counter()
    with subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE) as child:
        assert child.stdout is not None
        count = sum(1 for raw in child.stdout if json.loads(raw))
    elapsed = time.perf_counter() - started
    assert count == n
    return elapsed


# -- spawn ----------------------------------------------------------------------------------------


async def spawn_worker() -> float:
    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        worker = await WorkerProcess.start(nursery, WorkerSpec(argv=worker_argv(), env=ENV, name="bench"))
        elapsed = time.perf_counter() - started
        await worker.shutdown()
    return elapsed


def spawn_baseline() -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    return time.perf_counter() - started


# -- tool round trip --------------------------------------------------------------------------------


async def tool_calls(k: int) -> float:
    """Seconds per workspace.read call inside a scripted task (task time minus a no-tool task's, / k)."""
    with tempfile.TemporaryDirectory() as tmp:
        ws = Path(tmp) / "ws"
        ws.mkdir()
        (ws / "f.txt").write_text("hello\n")
        options = SupervisorOptions(data_dir=Path(tmp) / "data", worker_env={"*": {"CODESDK_SCENARIO_DIR": SCENARIOS}})
        steps = [{"tool_calls": [{"id": f"c{i}", "name": "workspace.read", "input": {"path": "f.txt"}}]}
                 for i in range(k)]
        async with open_engine(options) as engine:
            session = await engine.create_session(workspace=ws)
            durations = []
            for scenario in ({"name": "none", "steps": [{"complete": {}}]},
                             {"name": "tools", "steps": [*steps, {"complete": {}}]}):
                started = time.perf_counter()
                task = await engine.start_task(session.session_id, "go", runtime_config={"scenario_inline": scenario})
                await engine.wait_task(task.task_id)
                durations.append(time.perf_counter() - started)
        return (durations[1] - durations[0]) / k


async def rpc_baseline(k: int) -> float:
    async with trio.open_nursery() as nursery:
        worker = await WorkerProcess.start(nursery, WorkerSpec(argv=worker_argv(), env=ENV, name="bench"))
        started = time.perf_counter()
        for _ in range(k):
            await worker.connection.request(Method.GET_AUTH_STATUS, {"runtime": "scripted"})
        elapsed = (time.perf_counter() - started) / k
        await worker.shutdown()
    return elapsed


# -- driver ---------------------------------------------------------------------------------------


def measure(repeat: int, run: Callable[[], float]) -> list[float]:
    return [run() for _ in range(repeat)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()

    def trio_run(fn: Callable[..., Awaitable[float]], *a: object) -> Callable[[], float]:
        return lambda: trio.run(fn, *a)

    rows = []
    cases = [
        ("events", f"{args.events} deltas end to end", trio_run(events_through_codesdk, args.events),
         lambda: events_baseline(args.events), lambda s: f"{args.events / s:,.0f} ev/s"),
        ("spawn", "worker cold start to initialized", trio_run(spawn_worker), spawn_baseline,
         lambda s: f"{s * 1000:.0f} ms"),
        ("tool", "per workspace.read call", trio_run(tool_calls, args.calls), trio_run(rpc_baseline, args.calls),
         lambda s: f"{s * 1000:.2f} ms"),
    ]
    print(f"{'case':<7} {'what':<34} {'codesdk (median)':>18} {'baseline':>12} {'ratio':>7}  spread")
    for name, what, ours, base, fmt in cases:
        o, b = measure(args.repeat, ours), measure(args.repeat, base)
        om, bm = _median(o), _median(b)
        ratio = om[0] / bm[0]
        rows.append({"case": name, "what": what, "codesdk_s": o, "baseline_s": b, "ratio": ratio})
        print(f"{name:<7} {what:<34} {fmt(om[0]):>18} {fmt(bm[0]):>12} {ratio:>6.1f}x  "
              f"{fmt(om[1])}..{fmt(om[2])}", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"repeat": args.repeat, "results": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
