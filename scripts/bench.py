"""CodeSDK benchmarks: every figure next to a raw baseline measured in the same run, as a ratio.

    ./scripts/bench [--quick] [--case NAME ...] [--repeat N] [--json PATH]

Machines here are small and noisy, so each figure is the median of several repetitions, shown with its spread
(min..max of CodeSDK's repetitions) and the baseline from the same run. Cases (see scripts/benchmarks/):

  events   scripted runtime floods N small deltas: worker -> supervisor -> store (synchronous=FULL, as shipped)
           -> one live subscriber; baseline: the same lines from a child through a pipe, json.loads in the parent
  latency  per event, worker emit -> subscriber receive at a fixed offered rate; baseline: the same paced lines
           through a pipe
  tool     workspace.read round trip measured in the worker (requested -> result back); baseline: a bare
           JSON-RPC request/response with a child over a pipe pair
  spawn    codesdk-worker cold start to initialized; baseline: python -c pass
  density  N idle namespaces (workers): RSS/USS per worker, supervisor RSS; baseline: an idle bare interpreter
  store    append one per commit / batched, paging, restart with many stored events; baseline: raw apsw
  real     one turn with one tool call on Claude Code against the fake API, direct vs through CodeSDK
           (re-runs itself inside scripts/netns-run; skipped with a reason when that or the runtime is missing)
  cold     one whole cold `codesdk run --runtime claude` vs `claude -p` (scripts/benchmarks/real_runtime.py)
  codex    one turn with one tool call on Codex, through CodeSDK vs a minimal client of `codex app-server`
           (warm), and a cold `codesdk run --runtime codex` vs `codex exec`; in scripts/netns-run like `real`
  acp      one turn with one tool call on each ACP agent (Gemini CLI, OpenCode, codex-acp), through CodeSDK (its bridge)
           vs a minimal ACP client of the same agent with a minimal stdio MCP server (warm); in scripts/netns-run
  fairness another tenant's small task while one tenant floods (p50, p95), through the service (two tenants' tokens,
           HTTP API, SSE), against its quiet figures in the same run (rounds of quiet and flooded tasks in turn);
           and the same in-process (engine only) as a second figure
  postgres the store on PostgreSQL (a throwaway server, fsync on): round trips of one append vs raw psycopg's,
           appends vs raw psycopg and vs the SQLite store, events through a supervisor (goal >= 0.5 of SQLite) and
           the tool round trip vs the same on SQLite, two supervisor processes flooding one database vs one, lease
           failover time vs the lease (skipped without a server)
  transcript peak RSS growth of a supervisor process serving the transcript of a 200k-event session (one, and
           four at once); baseline: a raw apsw SELECT of the same events, kept (fetchall), measured the same way
           (--quick: 20k events, measured once)
  worker   codesdk-worker alone over real pipes: a scripted flood read to task.completed, lines/s and the worker's
           CPU per line; baseline: a child writing the same lines to a pipe (scripts/benchmarks/worker_alone.py)
  streams  N concurrent tasks each streaming 50 deltas/s through `codesdk-supervisor serve`, one SSE subscriber each
           (separate subscriber processes, real HTTP over the unix socket), tasks over min(N, 20) namespaces:
           emit -> subscriber p50/p99, achieved vs offered rate, service CPU per event, its RSS before/peak/after,
           over a ladder of N (quick: 10, 20); the largest N with p99 <= 50 ms; baseline: the same paced lines,
           all N streams' worth, through a pipe to one reader
  bundle   a support bundle of a 200k-event session: the supervisor's CPU and loop lag while it builds (in a
           low-priority child), and the cached bundle again; baseline: a raw read of the same events
  telemetry the events flood with the service's metrics observing, and with metrics and traces sent to a local
           OTLP sink; baseline: the same flood with no observer, interleaved (scripts/benchmarks/telemetry.py)

No thresholds are asserted: the goals are printed next to the figures. --quick is the CI smoke run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "scripts")]

import psutil
import trio
from benchmarks import cases, fairness, store, streams, transcript
from benchmarks import worker_alone
from benchmarks.common import Figure, from_reps, median, percentile, print_table

CASES = ("events", "latency", "tool", "spawn", "density", "store", "postgres", "real", "cold", "codex", "acp",
         "fairness", "transcript", "bundle", "streams", "worker", "telemetry")
NETNS_UNAVAILABLE = 97  # scripts/netns-run's exit code when no namespace can be made


def parameters(quick: bool, repeat: int | None) -> dict[str, Any]:
    """Sizes of each case: --quick keeps the whole run well under two minutes on a 2-core machine."""
    if quick:
        return {"repeat": repeat or 2, "events": 20_000, "latency_count": 1_000, "rate": 2_000.0, "calls": 50,
                "spawns": 5, "density": [10], "single": 300, "batched": 10_000, "stored": 50_000, "real_repeat": 1,
                "cold_repeat": 1, "fair_tasks": 10, "fair_rounds": 3, "transcript_events": 20_000, "transcript_repeat": repeat or 1,
                "pg_flood": 5_000, "lease_s": 2.0, "pg_repeat": repeat or 1, "bundle_events": 20_000,
                "worker_lines": 20_000, "streams_ladder": [10, 20], "streams_count": 200, "streams_rate": 50.0}
    return {"repeat": repeat or 3, "events": 200_000, "latency_count": 10_000, "rate": 2_000.0, "calls": 300,
            "spawns": 10, "density": [50, 100, 200], "single": 2_000, "batched": 50_000, "stored": 1_000_000,
            "real_repeat": 5, "cold_repeat": 12, "fair_tasks": 20, "fair_rounds": 4, "transcript_events": 200_000, "transcript_repeat": repeat or 3,
            "pg_flood": 50_000, "lease_s": 5.0, "pg_repeat": repeat or 3, "bundle_events": 200_000,
            "worker_lines": 200_000, "streams_ladder": [10, 20, 50, 100, 150, 200], "streams_count": 500,
            "streams_rate": 50.0}


def repeat(times: int, run: Callable[[], Any]) -> list[Any]:
    return [run() for _ in range(times)]


# -- cases --------------------------------------------------------------------------------------------------


def case_events(p: dict[str, Any]) -> list[Figure]:
    ours, base = [], []
    for _ in range(p["repeat"]):  # interleaved, so a noisy moment hits both sides alike
        base.append(cases.events_baseline(p["events"]))
        ours.append(trio.run(cases.events_codesdk, p["events"]))
    f = from_reps("events", f"{p['events']:,} deltas end to end", "ev/s", [o[0] for o in ours],
                  [b[0] for b in base], higher_is_better=True, goal=">= 50% of baseline and >= 50k/s")
    f.met = f.ratio is not None and f.ratio >= 0.5 and f.ours >= 50_000
    cpu = from_reps("events", "supervisor CPU per event", "s", [o[1] for o in ours], [b[1] for b in base],
                    note="this process's CPU (all threads) over the flood / events; baseline: the reading parent's")
    return [f, cpu]


def case_latency(p: dict[str, Any]) -> list[Figure]:
    ours, base = [], []
    for _ in range(p["repeat"]):
        base.append(cases.latency_baseline(p["latency_count"], p["rate"]))
        ours.append(trio.run(cases.latency_codesdk, p["latency_count"], p["rate"]))
    note = (f"offered {p['rate']:,.0f}/s, achieved {median([o['achieved_rate'] for o in ours]):,.0f}/s "
            f"(baseline {median([b['achieved_rate'] for b in base]):,.0f}/s), {p['latency_count']:,} events a run")
    figures = []
    for stat in ("p50", "p99", "max"):
        f = from_reps("latency", f"emit -> subscriber, {stat}", "s", [o[stat] for o in ours], [b[stat] for b in base])
        if stat == "p99":
            assert f.baseline is not None
            f.goal = "<= baseline + 1 ms"
            f.met = f.ours <= f.baseline + 0.001
            f.note = note
        figures.append(f)
    return figures


def case_tool(p: dict[str, Any]) -> list[Figure]:
    ours, base = [], []
    for _ in range(p["repeat"]):
        base.append(cases.rpc_baseline(p["calls"]))
        ours.append(trio.run(cases.tool_codesdk, p["calls"]))
    figures = []
    for stat, q in (("p50", 50), ("p99", 99)):
        f = from_reps("tool", f"workspace.read round trip, {stat}", "s", [percentile(o, q) for o in ours],
                      [percentile(b, q) for b in base])
        if stat == "p50":
            f.goal, f.met = "<= 1.5 ms", f.ours <= 0.0015
            f.note = f"{p['calls']} sequential calls a run, timed inside the worker"
        figures.append(f)
    return figures


def case_spawn(p: dict[str, Any]) -> list[Figure]:
    ours, base = [], []
    for _ in range(p["spawns"]):
        base.append(cases.spawn_baseline())
        ours.append(trio.run(cases.spawn_codesdk))
    forked = trio.run(cases.spawn_forked_codesdk, p["spawns"])
    figures = []
    for stat, q in (("p50", 50), ("p99", 99)):
        f = Figure("spawn", f"forked by the worker template to initialized, {stat}", "s", percentile(forked, q),
                   percentile(base, q), (min(forked), max(forked)) if q == 50 else None, goal="<= 150 ms",
                   samples={"ours": forked, "baseline": base} if q == 50 else {},
                   note="what the service does; the template started once, before" if q == 50 else
                   f"{p['spawns']} spawns; p99 of so few is the slowest one")
        f.met = f.ours <= 0.15
        figures.append(f)
    figures.append(Figure("spawn", "new interpreter to initialized, p50", "s", percentile(ours, 50),
                          percentile(base, 50), (min(ours), max(ours)), samples={"ours": ours},
                          note="without the template: codesdk run, other worker programs"))
    return figures


def case_density(p: dict[str, Any]) -> list[Figure]:
    bare = cases.density_baseline()
    figures = []
    for workers in p["density"]:
        result = trio.run(cases.density_codesdk, workers)
        uss = Figure("density", f"{workers} idle workers: USS per worker", "MB", result["uss_mb"], bare["uss_mb"],
                     goal="<= 15 MB", samples=result, note="forked by the worker template, as the service does")
        uss.met = uss.ours <= 15
        rss = Figure("density", f"{workers} idle workers: RSS per worker", "MB", result["rss_mb"], bare["rss_mb"],
                     goal="<= 40 MB")
        rss.met = rss.ours <= 40
        sup = Figure("density", f"{workers} idle workers: supervisor RSS", "MB", result["supervisor_rss_mb"], None,
                     note=f"+{result['supervisor_growth_mb']:.1f} MB for the workers; "
                          f"all {workers} started in {result['startup_s']:.1f} s")
        figures += [uss, rss, sup]
    workers = p["density"][0]
    spawned = trio.run(cases.density_codesdk, workers, False)
    figures.append(Figure("density", f"{workers} idle workers, each a new interpreter: USS per worker", "MB",
                          spawned["uss_mb"], bare["uss_mb"], samples=spawned, note="without the template"))
    return figures


def case_store(p: dict[str, Any]) -> list[Figure]:
    r = store.run_store_case(p["single"], p["batched"], p["stored"], p["repeat"])
    return [
        from_reps("store", "append, one event per commit", "ev/s", r["single"], r["single_raw"],
                  higher_is_better=True, note="baseline: one raw row per transaction"),
        from_reps("store", "append, batches of 100", "ev/s", r["batched"], r["batched_raw"], higher_is_better=True,
                  note="baseline: 100 raw rows per transaction"),
        from_reps("store", "read back, pages of 500", "ev/s", r["read"], r["read_raw"], higher_is_better=True),
        from_reps("store", f"restart with {r['stored']:,} events", "s", r["restart"], r["restart_raw"],
                  note=f"open store + engine, recovery, one read; database {r['db_mb']:.0f} MB, filled at "
                       f"{r['fill_rate']:,.0f} ev/s; baseline: open raw + newest seq"),
    ]


def case_postgres(p: dict[str, Any]) -> list[Figure]:
    """The store on PostgreSQL against raw psycopg and against SQLite; two supervisors against one; failover."""
    from benchmarks import postgres

    missing = postgres.unavailable()
    if missing:
        return [_skipped("postgres", missing)]
    r = postgres.run_postgres_case({**p, "repeat": p["pg_repeat"]})
    lease = p["lease_s"]
    events = from_reps("postgres", "events through a supervisor", "ev/s", r["pg_events"], r["sqlite_events"],
                       higher_is_better=True, goal=">= 0.5 of the SQLite store",
                       note=f"{p['events']:,} deltas, worker -> store -> live subscriber; baseline: the same on the "
                            "SQLite store")
    events.met = events.ratio is not None and events.ratio >= 0.5
    trips = from_reps("postgres", "round trips of one append (one event)", "RT", r["trips"], r["raw_trips"],
                      goal="<= 2", note="libpq protocol trace of the store's writer connection (pipelined); "
                                        "baseline: raw psycopg BEGIN, INSERT, COMMIT")
    trips.met = trips.ours <= 2
    return [
        trips,
        from_reps("postgres", "append, one event per commit", "ev/s", r["pg_single"], r["raw_single"],
                  higher_is_better=True, note=f"baseline: one raw psycopg row per transaction; the SQLite store "
                                              f"(FULL): {median(r['sqlite_single']):,.0f} ev/s"),
        from_reps("postgres", "append, batches of 100", "ev/s", r["pg_batched"], r["raw_batched"],
                  higher_is_better=True, note=f"baseline: 100 raw psycopg rows per transaction; the SQLite store: "
                                              f"{median(r['sqlite_batched']):,.0f} ev/s"),
        events,
        from_reps("postgres", "tool round trip, p50", "s", r["pg_tool"], r["sqlite_tool"],
                  note="workspace.read measured in the worker; baseline: the same on the SQLite store"),
        from_reps("postgres", "2 supervisors flooding one database", "ev/s", r["two"], r["one"],
                  higher_is_better=True, note=f"{p['pg_flood']:,} deltas each, separate processes, one namespace "
                                              "each; baseline: one supervisor alone"),
        from_reps("postgres", "lease failover after SIGKILL", "s", r["failover"], [lease] * len(r["failover"]),
                  goal=f"<= lease + a renewal ({lease * 4 / 3:.1f} s) + a claim",
                  note=f"SIGKILL of the supervisor running a task -> the other stored its failure; baseline: the "
                       f"lease (--lease-s {lease:g})"),
    ]


def case_fairness(p: dict[str, Any]) -> list[Figure]:
    """The other tenant's small task while one tenant floods, through the service (``benchmarks/fairness.py``:
    ``codesdk-supervisor serve``, two tenants' tokens, the HTTP API and SSE), against its own quiet figures from the
    same run; then the same in-process (the engine alone, no HTTP) as a second figure."""
    runs = [trio.run(fairness.run_once, p["fair_tasks"], p["fair_rounds"]) for _ in range(p["repeat"])]
    per_run = "; ".join(f"{r['flooded_p50'] / r['quiet_p50']:.2f}x p50, {r['flooded_p95'] / r['quiet_p95']:.2f}x p95"
                        for r in runs)
    sizes = (f"{p['fair_rounds']} rounds of {p['fair_tasks']} echo tasks quiet then {p['fair_tasks']} during another "
             f"namespace's flood (read by its own SSE follower), a run")
    p50 = from_reps("fairness", "other tenant's task during a flood (service), p50", "s",
                    [r["flooded_p50"] for r in runs], [r["quiet_p50"] for r in runs],
                    goal="<= 1.5x its quiet p50 (median of the runs' ratios)",
                    note=f"{sizes}; baseline: the same tasks with nothing else running (same run); ratio per run: "
                         f"{per_run}")
    p50.met = median([r["flooded_p50"] / r["quiet_p50"] for r in runs]) <= 1.5  # the ratio within a run
    p95 = from_reps("fairness", "other tenant's task during a flood (service), p95", "s",
                    [r["flooded_p95"] for r in runs], [r["quiet_p95"] for r in runs],
                    goal="<= 2x its quiet p95 (median of the runs' ratios)")
    p95.met = median([r["flooded_p95"] / r["quiet_p95"] for r in runs]) <= 2
    rate = from_reps("fairness", "the flood's own rate while it shares (service)", "ev/s",
                     [r["flood_shared_rate"] for r in runs], [r["flood_alone_rate"] for r in runs],
                     higher_is_better=True, note="baseline: the same flood alone, just before (same run)")
    engine = [trio.run(cases.fairness_codesdk, p["fair_tasks"]) for _ in range(p["repeat"])]
    inproc = from_reps("fairness", "other tenant's task during a flood (in-process engine), p50", "s",
                       [r["flooded_p50"] for r in engine], [r["quiet_p50"] for r in engine],
                       note="start_task -> stored terminal event, no HTTP; ratio per run: " + ", ".join(
                           f"{r['flooded_p50'] / r['quiet_p50']:.2f}" for r in engine))
    return [p50, p95, rate, inproc]


def case_transcript(p: dict[str, Any]) -> list[Figure]:
    """A supervisor's peak RSS growth while it serves a long session's transcript, each measurement in a fresh
    process (see benchmarks/transcript.py), against a raw SELECT of the same events in the same run."""
    with tempfile.TemporaryDirectory(prefix="codesdk-bench-transcript-") as tmp:
        data_dir = Path(tmp) / "data"
        built = trio.run(transcript.build, data_dir, p["transcript_events"])
        one, four, fetchall, streamed = [], [], [], []
        for _ in range(p["transcript_repeat"]):  # interleaved; the peaks vary by tenths of a MB, so quick runs once
            fetchall.append(transcript.raw_growth(data_dir, "fetchall"))
            one.append(transcript.supervisor_growth(data_dir, built))
            four.append(transcript.supervisor_growth(data_dir, built, transcript.CONCURRENT))
            streamed.append(transcript.raw_growth(data_dir, "stream"))
    methods = sorted({m["method"] for m in (*one, *four, *fetchall, *streamed)})
    session = (f"{built['events']:,} events ({built['db_mb']:.0f} MB stored, built at {built['build_rate']:,.0f} ev/s), "
               f"transcript {built['messages']} messages, {built['text_chars'] / 1e6:.1f} MB of text")
    single = from_reps("transcript", "RSS growth serving its transcript", "MB", [r["growth_mb"] for r in one],
                       [r["growth_mb"] for r in fetchall], goal="<= 50 MB (200k events)",
                       note=f"{session}; served in {median([r['seconds'] for r in one]) * 1000:.0f} ms by a fresh "
                            f"supervisor at {median([r['rss_before_mb'] for r in one]):.0f} MB; baseline: raw apsw "
                            f"SELECT of the same events, rows kept (streamed and dropped instead: "
                            f"{median([r['growth_mb'] for r in streamed]):.2f} MB); peak by {', '.join(methods)}")
    single.met = single.ours <= 50
    together = from_reps("transcript", f"RSS growth serving {transcript.CONCURRENT} transcripts at once", "MB",
                         [r["growth_mb"] for r in four], [r["growth_mb"] for r in fetchall],
                         note=f"the same session, {transcript.CONCURRENT} requests at once, answered in "
                              f"{median([r['seconds'] for r in four]) * 1000:.0f} ms; baseline: one raw SELECT")
    return [single, together]


def case_telemetry(p: dict[str, Any]) -> list[Figure]:
    """The event flood watched by no one, by the service's metrics, and by metrics and traces (benchmarks/telemetry.py):
    what the engine's telemetry hooks and their observers cost, as ratios against no observer in the same run."""
    from benchmarks import telemetry

    r = telemetry.run(p["events"], p["repeat"])
    figures = [from_reps("telemetry", "deltas/s, metrics on (serving's default)", "ev/s", r["metrics"], r["none"],
                         higher_is_better=True, goal=">= 0.95 of no observer",
                         note="baseline: the same flood, no observer (codesdk run's engine)")]
    figures[-1].met = figures[-1].ratio is not None and figures[-1].ratio >= 0.95
    if "traces" in r:
        figures.append(from_reps("telemetry", "deltas/s, metrics and traces to OTLP", "ev/s", r["traces"], r["none"],
                                 higher_is_better=True, note="spans exported to a local sink by the SDK's batch thread"))
    else:
        figures.append(_skipped("telemetry", "traces: the otel extra is not installed"))
    return figures


def case_bundle(p: dict[str, Any]) -> list[Figure]:
    """A support bundle of a long session, built as the API builds it (a child process at the lowest priority),
    against a raw read of the same events in the same run (benchmarks/bundle.py)."""
    from benchmarks import bundle

    r = trio.run(bundle.run, p["bundle_events"])
    raw, child, cached = r["raw"], r["child"], r["cached"]
    return [
        from_reps("bundle", "supervisor CPU for one bundle", "s", [child["cpu_s"]], [raw["cpu_s"]],
                  note=f"{r['events']:,} events; the bundle process itself: {child['child_cpu_s']:.1f} s CPU at "
                       f"SCHED_IDLE, {child['wall_s']:.1f} s wall; baseline: reading the same events raw"),
        from_reps("bundle", "supervisor loop lag while it builds, p99", "s", [child["lag_p99_s"]],
                  [raw["lag_p99_s"]], note="how late a 5 ms sleep wakes; baseline: during the raw read"),
        from_reps("bundle", "the same bundle again (cached)", "s", [cached["wall_s"]], [raw["wall_s"]],
                  note="an unchanged session: served from <data-dir>/bundle-cache; baseline: the raw read's wall"),
    ]


def case_streams(p: dict[str, Any]) -> list[Figure]:
    """N paced streams through the service, one SSE subscriber each, over a ladder of N (benchmarks/streams.py);
    each rung against the same paced lines through a pipe at the same aggregate rate, measured just after it."""
    rate, count = p["streams_rate"], p["streams_count"]
    rungs = trio.run(streams.run_ladder, p["streams_ladder"], count, rate)
    figures = []
    for r in rungs:
        base = streams.baseline(r["n"], count, rate)
        where = (f"{r['n']} x {rate:g}/s offered ({r['offered']:,.0f}/s), achieved {r['achieved']:,.0f}/s; "
                 f"{count} deltas a stream; load {r['load']:.2f}")
        p99 = Figure("streams", f"{r['n']} streams: emit -> subscriber, p99", "s", r["p99"], base["p99"],
                     goal="<= 50 ms", note=where, samples={"rung": r, "baseline": base})
        p99.met = r["p99"] <= streams.GOAL_P99_S
        figures.append(Figure("streams", f"{r['n']} streams: emit -> subscriber, p50", "s", r["p50"], base["p50"]))
        figures.append(p99)
        figures.append(Figure("streams", f"{r['n']} streams: service CPU per event", "s", r["cpu_per_event"], None,
                              goal="<= 40 us (20 streams)" if r["n"] == 20 else "",
                              note=f"service process, all threads, over the steady middle: "
                                   f"{r['service_cpu_share']:.2f} of a core; workers {r['workers_cpu_share']:.2f}; "
                                   f"busiest subscriber process {r['subscriber_cpu_share']:.2f} (keeping up)"))
        if r["n"] == 20:
            figures[-1].met = r["cpu_per_event"] <= 40e-6
        figures.append(Figure("streams", f"{r['n']} streams: service RSS after drain", "MB", r["rss_after_mb"],
                              r["rss_before_mb"], goal="<= before + 10 MB",
                              met=r["rss_after_mb"] <= r["rss_before_mb"] + 10,
                              note=f"baseline: before the streams; peak {r['rss_peak_mb']:.0f} MB"))
    best = streams.largest_within(rungs)
    top = Figure("streams", "largest N with p99 <= 50 ms", "streams", best, None,
                 goal=">= 200", met=best >= 200,
                 note=f"ladder {', '.join(str(r['n']) for r in rungs)}; every smaller N within the goal too")
    return figures + [top]


def case_real(p: dict[str, Any]) -> list[Figure]:
    """Runs inside the loopback-only namespace (re-executing this script there when needed)."""
    from benchmarks import real_runtime

    missing = real_runtime.runtime_missing()
    if missing:
        return [_skipped("real", missing)]
    if not _loopback_only():
        return _in_netns("real", p)
    r = real_runtime.run(p["real_repeat"])
    f = from_reps("real", "one turn + one tool call, Claude Code", "s", r["codesdk"], r["direct"],
                  goal="<= 1.05x direct", note="direct: claude-agent-sdk with an in-process tool, same fake API")
    f.met = f.ratio is not None and f.ratio <= 1.05
    return [f]


def case_codex(p: dict[str, Any]) -> list[Figure]:
    """Codex, warm and cold, inside the loopback-only namespace (re-executing this script there when needed)."""
    from benchmarks import codex_runtime

    missing = codex_runtime.runtime_missing()
    if missing:
        return [_skipped("codex", missing)]
    if not _loopback_only():
        return _in_netns("codex", p)
    r = codex_runtime.warm(p["real_repeat"])
    warm = from_reps("codex", "one turn + one tool call, Codex, warm", "s", r["codesdk"], r["direct"],
                     goal="<= 1.05x direct", note="each a new `codex app-server`; direct: a minimal client of it "
                                                  "answering the tool in-process; same flags, same fake API")
    warm.met = warm.ratio is not None and warm.ratio <= 1.05
    c = codex_runtime.cold(p["cold_repeat"])
    cold = from_reps("codex", "`codesdk run --runtime codex`, one turn, cold", "s", c["codesdk"], c["direct"],
                     note="new process each: supervisor, worker, app-server; baseline: `codex exec`, same flags")
    return [warm, cold]


def case_acp(p: dict[str, Any]) -> list[Figure]:
    """Each installed ACP agent, warm, inside the loopback-only namespace (re-executing this script there)."""
    from benchmarks import acp_runtime

    figures: list[Figure] = []
    agents = [agent for agent in acp_runtime.CONFIGS if not acp_runtime.runtime_missing(agent)]
    for agent in acp_runtime.CONFIGS:
        if agent not in agents:
            figures.append(_skipped("acp", f"{agent}: {acp_runtime.runtime_missing(agent)}"))
    if not agents:
        return figures
    if not _loopback_only():
        return figures + _in_netns("acp", p)
    for agent in agents:
        r = acp_runtime.warm(agent, p["real_repeat"])
        figure = from_reps("acp", f"one turn + one tool call, {agent}, warm", "s", r["codesdk"], r["direct"],
                           goal="<= 1.05x direct", note="each a new agent process; direct: a minimal ACP client, "
                                                        "a minimal stdio MCP server; same launch, same fake API")
        figure.met = figure.ratio is not None and figure.ratio <= 1.05
        figures.append(figure)
    return figures


def _in_netns(case: str, p: dict[str, Any]) -> list[Figure]:
    with tempfile.TemporaryDirectory(prefix="codesdk-bench-") as tmp:
        out = Path(tmp) / f"{case}.json"
        argv = [str(REPO / "scripts" / "netns-run"), sys.executable, str(Path(__file__).resolve()),
                "--case", case, "--json", str(out), "--real-repeat", str(p["real_repeat"]),
                "--cold-repeat", str(p["cold_repeat"]), "--no-table"]
        proc = subprocess.run(argv, check=False, cwd=REPO, stdin=subprocess.DEVNULL)
        if proc.returncode == NETNS_UNAVAILABLE:
            return [_skipped(case, "no loopback-only network namespace can be made here (scripts/netns-run "
                                   "exited 97); a real runtime is never run outside one")]
        if proc.returncode != 0 or not out.exists():
            return [_skipped(case, f"the run inside scripts/netns-run failed (exit {proc.returncode})")]
        return [Figure(**{k: v for k, v in row.items() if k != "ratio"}) for row in json.loads(out.read_text())["figures"]]


def _skipped(case: str, why: str) -> Figure:
    print(f"{case}: SKIPPED: {why}", flush=True)
    return Figure(case, "skipped", "s", float("nan"), None, note=f"skipped: {why}")


def _loopback_only() -> bool:
    return [name for _, name in socket.if_nameindex()] == ["lo"]


RUNNERS: dict[str, Callable[[dict[str, Any]], list[Figure]]] = {
    "events": case_events, "latency": case_latency, "tool": case_tool, "spawn": case_spawn,
    "density": case_density, "store": case_store, "postgres": case_postgres, "real": case_real, "cold": cases.cold, "codex": case_codex,
    "acp": case_acp,
    "fairness": case_fairness, "transcript": case_transcript, "bundle": case_bundle, "streams": case_streams,
    "worker": worker_alone.figures, "telemetry": case_telemetry,
}


def machine() -> dict[str, Any]:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else ""
    return {"cpus": os.cpu_count(), "cpu": cpu, "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
            "python": platform.python_version(), "platform": platform.platform(), "load_avg": os.getloadavg()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog="cases: " + ", ".join(CASES))
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run (CI)")
    parser.add_argument("--case", action="append", choices=CASES, help="run only this case (repeatable)")
    parser.add_argument("--repeat", type=int, help="repetitions per case (default 3, quick 2)")
    parser.add_argument("--real-repeat", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--cold-repeat", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, default=REPO / "build" / "bench" / "results.json",
                        help="where to write the results (default build/bench/results.json)")
    parser.add_argument("--no-table", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    p = parameters(args.quick, args.repeat)
    if args.real_repeat:
        p["real_repeat"] = args.real_repeat
    if args.cold_repeat:
        p["cold_repeat"] = args.cold_repeat
    started = time.perf_counter()
    info = machine()
    if not args.no_table:
        print(f"CodeSDK bench {'(quick) ' if args.quick else ''}on {info['cpus']} cores, {info['cpu']}, "
              f"Python {info['python']}, load {info['load_avg'][0]:.2f}", flush=True)
    figures: list[Figure] = []
    for name in args.case or CASES:
        case_started = time.perf_counter()
        figures += RUNNERS[name](p)
        if not args.no_table:
            print(f"  {name}: done in {time.perf_counter() - case_started:.1f} s", flush=True)
    elapsed = time.perf_counter() - started
    if not args.no_table:
        print()
        print_table(figures)
        print(f"\ntotal {elapsed:.1f} s; ratio = codesdk / baseline (for rates higher is better, "
              f"for times and sizes lower is better)")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"date": datetime.now(UTC).isoformat(timespec="seconds"), "quick": args.quick,
                                     "machine": info, "parameters": p, "elapsed_s": elapsed,
                                     "figures": [f.to_json() for f in figures]}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
