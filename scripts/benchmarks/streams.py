"""Case 16 (``streams``): N concurrent paced streams through ``codesdk-supervisor serve``, one SSE subscriber each.

One real service (SQLite store at its shipped durability, HTTP on its unix socket) started by
``streams_serve.py`` (the admin command with the bench worker as the worker program: its ``paced`` runtime emits
COUNT deltas at RATE/s, each carrying its emit time). The tasks are spread over ``min(N, 20)`` namespaces, each
with a token of its own (``codesdk-supervisor token add``), as on a multi-tenant host. For each N of a ladder, on
the same service: N sessions' streams are opened by separate subscriber processes (``streams_subscriber.py``, up
to ``STREAMS_PER_SUBSCRIBER`` streams each), then the N tasks start at once. Reported per N: emit -> subscriber
p50/p99/max, the rate achieved vs offered (over the steady middle of the run), the service's CPU per event (its
process, every thread, over that same middle part), its RSS before, at peak and after the streams ended and the
service drained, the workers' and the subscribers' CPU (the subscribers must keep up: their share of a core is
reported). Baseline in the same run: the same paced lines from a child through a pipe to one reader at the same
aggregate rate (``cases.latency_baseline``).

    python -m scripts.benchmarks.streams [N ...]   (one ladder, printed; CODESDK_BENCH_PROFILE / _STALLS: see
                                                    streams_serve.py)
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import trio

from codesdk.client import AsyncClient
from scripts.benchmarks.cases import latency_baseline
from scripts.benchmarks.common import REPO, percentile
from scripts.benchmarks.fairness import _serving

HERE = Path(__file__).resolve().parent
SERVE = str(HERE / "streams_serve.py")
SUBSCRIBER = str(HERE / "streams_subscriber.py")
MAX_NAMESPACES = 20
STREAMS_PER_SUBSCRIBER = 50
GOAL_P99_S = 0.050
WARM_DELTAS = 5
#: The middle of a run over which CPU and the achieved rate are measured (fractions of its paced duration).
STEADY = (0.2, 0.8)


def _token(data: Path, name: str, namespace: str) -> str:
    """``codesdk-supervisor token add`` in this process (the same code, without an interpreter start each)."""
    from codesdk.supervisor.cli import admin

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = admin.main(["token", "add", name, "--namespace", namespace, "--data-dir", str(data)])
    if code != 0:
        raise RuntimeError(f"token add {name} failed ({code})")
    return out.getvalue().strip().splitlines()[-1]


def _cpu_s(proc: psutil.Process, children: bool = False) -> float:
    """CPU seconds of the process (every thread), or of its children (the workers) when ``children``."""
    if not children:
        times = proc.cpu_times()
        return times.user + times.system
    total = 0.0
    for child in proc.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            times = child.cpu_times()
            total += times.user + times.system
    return total


def _rss_mb(proc: psutil.Process) -> float:
    return proc.memory_info().rss / 2**20


async def _finished(client: AsyncClient, task_id: str, guard_s: float) -> str:
    with trio.fail_after(guard_s):
        while (state := (await client.get_task(task_id)).state) in ("pending", "running", "starting"):
            await trio.sleep(0.05)
    return str(state)


async def _rung(n: int, count: int, rate: float, sock: Path, service: psutil.Process,
                sessions: list[tuple[AsyncClient, str, str]], tmp: Path) -> dict[str, Any]:
    """One N of the ladder: open the streams, start the tasks, measure, wait for all to end and drain."""
    duration = count / rate
    guard_s = duration * 4 + 60
    profiling = os.environ.get("CODESDK_BENCH_PROFILE_WINDOW") == "1"
    chosen = sessions[:n]
    afters = [int((await client.get_session(session)).last_seq) for client, session, _ in chosen]
    rss_before = _rss_mb(service)
    specs = []
    for first in range(0, n, STREAMS_PER_SUBSCRIBER):
        last = first + STREAMS_PER_SUBSCRIBER
        part = [[token, session, after] for (_, session, token), after in zip(chosen[first:last], afters[first:last],
                                                                            strict=True)]
        spec, out = tmp / f"spec-{n}-{first}.json", tmp / f"out-{n}-{first}.json"
        spec.write_text(json.dumps({"socket": str(sock), "guard_s": guard_s, "streams": part}))
        specs.append((spec, out))
    subscribers = [subprocess.Popen([sys.executable, SUBSCRIBER, str(spec), str(out)], cwd=REPO,
                                    stdout=subprocess.PIPE, text=True) for spec, out in specs]
    try:
        with trio.fail_after(60):
            for sub in subscribers:
                assert sub.stdout is not None
                line = await trio.to_thread.run_sync(sub.stdout.readline)
                if line.strip() != "ready":
                    raise RuntimeError(f"a subscriber did not open its streams (exit {sub.poll()})")
        peak = [rss_before]
        window: dict[str, float] = {}
        task_ids: list[tuple[AsyncClient, str]] = []
        started_ns = time.time_ns()

        async def start(client: AsyncClient, session: str) -> None:
            task = await client.start_task(session, "paced", runtime_config={"paced": count, "rate": rate})
            task_ids.append((client, task.task_id))

        async def sample() -> None:
            begin, end = (started_ns / 1e9 + duration * f for f in STEADY)
            await trio.sleep(max(0.0, begin - time.time()))
            if profiling:
                service.send_signal(signal.SIGUSR1)  # streams_serve.py: profile from here
            window.update(t0=time.time(), cpu0=_cpu_s(service), workers0=_cpu_s(service, True))
            while time.time() < end:
                peak[0] = max(peak[0], _rss_mb(service))
                await trio.sleep(0.1)
            window.update(t1=time.time(), cpu1=_cpu_s(service), workers1=_cpu_s(service, True))
            if profiling:
                service.send_signal(signal.SIGUSR2)  # ... to here
            while any(sub.poll() is None for sub in subscribers):
                peak[0] = max(peak[0], _rss_mb(service))
                await trio.sleep(0.1)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(sample)
            async with trio.open_nursery() as starting:
                for client, session, _ in chosen:
                    starting.start_soon(start, client, session)
            with trio.fail_after(guard_s + 10):
                for sub in subscribers:
                    await trio.to_thread.run_sync(sub.wait)
        states = [await _finished(client, task_id, guard_s) for client, task_id in task_ids]
    finally:
        for sub in subscribers:
            if sub.poll() is None:
                sub.kill()
                sub.wait(timeout=30)
    if any(sub.returncode != 0 for sub in subscribers):
        raise RuntimeError(f"a subscriber failed: exits {[sub.returncode for sub in subscribers]}")
    await trio.sleep(1.0)  # the drained service, a moment later (its own timers, a collection, have run)
    rss_after = _rss_mb(service)
    results = [json.loads(out.read_text()) for _, out in specs]
    pairs = [pair for result in results for stream in result["pairs"] for pair in stream]
    if len(pairs) != n * count:
        raise RuntimeError(f"{len(pairs)} deltas reached the subscribers of {n * count}")
    latencies = [(received - emitted) / 1e9 for emitted, received in pairs]
    t0, t1 = window["t0"] * 1e9, window["t1"] * 1e9
    in_window = sum(1 for _, received in pairs if t0 <= received < t1)
    emitted_in_window = sum(1 for emitted, _ in pairs if t0 <= emitted < t1)
    span = window["t1"] - window["t0"]
    return {
        "n": n, "count": count, "rate": rate, "offered": n * rate, "states": sorted(set(states)),
        "p50": percentile(latencies, 50), "p99": percentile(latencies, 99), "max": max(latencies),
        "achieved": in_window / span, "emitted_rate": emitted_in_window / span,
        "cpu_per_event": (window["cpu1"] - window["cpu0"]) / max(1, in_window),
        "service_cpu_share": (window["cpu1"] - window["cpu0"]) / span,
        "workers_cpu_share": (window["workers1"] - window["workers0"]) / span,
        "subscriber_cpu_share": max(r["cpu_s"] / r["wall_s"] for r in results),
        "subscribers": len(results),
        "rss_before_mb": rss_before, "rss_peak_mb": peak[0], "rss_after_mb": rss_after,
        "load": os.getloadavg()[0],
    }


async def run_ladder(ladder: list[int], count: int, rate: float = 50.0, stop_above_s: float | None = None,
                     extra_env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """One service for the whole ladder; each rung's figures (see ``_rung``). With ``stop_above_s``, the ladder
    stops early once a rung's p99 passes it (the service is past saturation: larger N only takes longer to say so);
    by default every rung runs, so that each N's figures are there to compare across changes."""
    namespaces = min(max(ladder), MAX_NAMESPACES)
    with tempfile.TemporaryDirectory(prefix="codesdk-bench-streams-") as tmp_name:
        tmp = Path(tmp_name)
        data = tmp / "data"
        data.mkdir(mode=0o700)
        tokens = [(f"user:s{k}", _token(data, f"tenant{k}", f"user:s{k}")) for k in range(namespaces)]
        sock = data / "api.sock"
        argv = [sys.executable, SERVE, "serve", "--data-dir", str(data), "--log-level", "WARNING"]
        env = {**os.environ, **(extra_env or {})}
        log = (tmp / "serve.log").open("wb")  # a file, not a pipe: a pipe nobody reads would block the service
        popen = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=log)
        rungs: list[dict[str, Any]] = []
        try:
            await _serving(sock, tokens[0][1])
            service = psutil.Process(popen.pid)
            clients = {token: AsyncClient(socket=sock, token=token) for _, token in tokens}
            async with contextlib.AsyncExitStack() as stack:
                for client in clients.values():
                    await stack.enter_async_context(client)
                sessions: list[tuple[AsyncClient, str, str]] = []
                for index in range(max(ladder)):
                    namespace, token = tokens[index % namespaces]
                    created = await clients[token].create_session(namespace=namespace, runtime="bench")
                    sessions.append((clients[token], created.session_id, token))

                async def warm(client: AsyncClient, session: str) -> None:  # every namespace's worker running
                    task = await client.start_task(session, "warm", runtime_config={"paced": WARM_DELTAS,
                                                                                    "rate": rate})
                    await _finished(client, task.task_id, 120)

                async with trio.open_nursery() as nursery:
                    for client, session, _ in sessions[:namespaces]:
                        nursery.start_soon(warm, client, session)
                for n in ladder:
                    rung = await _rung(n, count, rate, sock, service, sessions, tmp)
                    rungs.append(rung)
                    if stop_above_s is not None and rung["p99"] > stop_above_s:
                        break
        finally:
            popen.terminate()
            try:
                popen.wait(timeout=60)
            except subprocess.TimeoutExpired:
                popen.kill()
                popen.wait(timeout=30)
            log.close()
            if popen.returncode not in (0, -15) and not rungs:
                err = (tmp / "serve.log").read_bytes()[-2000:].decode(errors="replace")
                print(f"streams: the service exited {popen.returncode}: {err}", file=sys.stderr)
    return rungs


def baseline(n: int, count: int, rate: float) -> dict[str, float]:
    """The same paced lines, all N streams' worth (N x rate per second), from a child through a pipe to one reader."""
    return latency_baseline(n * count, n * rate)


def largest_within(rungs: list[dict[str, Any]], goal_s: float = GOAL_P99_S) -> int:
    """The largest N of the ladder whose p99 met the goal, every smaller N meeting it too (0: none did)."""
    best = 0
    for rung in rungs:
        if rung["p99"] > goal_s:
            break
        best = rung["n"]
    return best


def _print(rungs: list[dict[str, Any]], bases: dict[int, dict[str, float]]) -> None:
    print(f"{'N':>4} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'pipe p99':>8} {'offered':>8} {'achieved':>8} "
          f"{'us/ev':>7} {'svc cpu':>7} {'workers':>7} {'sub cpu':>7} {'rss b/pk/a MB':>18} {'load':>5}")
    for r in rungs:
        b = bases.get(r["n"], {})
        print(f"{r['n']:>4} {r['p50'] * 1e3:>8.1f} {r['p99'] * 1e3:>8.1f} {r['max'] * 1e3:>8.1f} "
              f"{b.get('p99', math.nan) * 1e3:>8.2f} {r['offered']:>8.0f} {r['achieved']:>8.0f} "
              f"{r['cpu_per_event'] * 1e6:>7.0f} {r['service_cpu_share']:>7.2f} {r['workers_cpu_share']:>7.2f} "
              f"{r['subscriber_cpu_share']:>7.2f} "
              f"{r['rss_before_mb']:>5.0f}/{r['rss_peak_mb']:>5.0f}/{r['rss_after_mb']:>5.0f} {r['load']:>5.2f}")


if __name__ == "__main__":
    ladder = [int(arg) for arg in sys.argv[1:]] or [10, 20, 50]
    count = int(os.environ.get("STREAMS_COUNT", "500"))
    rungs = trio.run(run_ladder, ladder, count)
    bases = {r["n"]: baseline(r["n"], count, r["rate"]) for r in rungs}
    _print(rungs, bases)
    print(json.dumps({"rungs": rungs, "baselines": bases}))
