"""``codesdk-supervisor serve`` with the bench worker (``bench_worker.py``, its ``paced`` runtime) as every
namespace's worker program, for case 16 (``streams``); no production code changes.

    python scripts/benchmarks/streams_serve.py serve --data-dir DIR ...   (the admin command's own flags)

It sets ``SupervisorOptions.worker_argv`` from the parsed flags (the worker template only ever forks
``codesdk-worker``, so these workers start as new interpreters). Instruments, each off unless its variable names a
file (written when the service exits), and one experiment (``CODESDK_BENCH_TREE_SNAPSHOT_S=SECONDS``: how often
a busy worker's process tree is looked at, ``WorkerProcess.tree_snapshot_s``, 1 s as shipped):

- ``CODESDK_BENCH_PROFILE=PATH``: cProfile (timed by each thread's own CPU clock, so a busy machine does not
  inflate it) of the event loop's thread, and of every other thread (the store's
  writer, ``to_thread`` workers) merged into the same file (``pstats`` format). With
  ``CODESDK_BENCH_PROFILE_WINDOW=1``, only between SIGUSR1 and SIGUSR2 (``streams.py`` sends them around the steady
  middle of each rung), and in other threads only the jobs handed to them then.
- ``CODESDK_BENCH_STALLS=PATH``: a timestamped trace of loop stalls, one JSON object a line: each trio task step
  longer than ``CODESDK_BENCH_STALL_MS`` (default 20) with the task's name, each loop turn (between two waits for
  I/O) longer than that, every generation-2 garbage collection (and any longer than a quarter of that), every
  process-table scan (``psutil.process_iter``/``pids``) with who called it, every store write transaction longer
  than a quarter of the threshold (fsync included) and, at exit, counts of collections per generation and a
  histogram of the write transactions' durations.
"""

from __future__ import annotations

import cProfile
import dataclasses
import gc
import json
import os
import pstats
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import trio

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

BENCH_WORKER = str(Path(__file__).resolve().parent / "bench_worker.py")


class _StallTrace(trio.abc.Instrument):
    """Trio instrument + gc callback + psutil scan hook, appending one JSON line per finding."""

    def __init__(self, path: str, threshold_s: float) -> None:
        self.out = open(path, "w", buffering=1)  # noqa: SIM115 - open for the service's whole life
        self.threshold = threshold_s
        self.lock = threading.Lock()
        self.step_started = 0.0
        self.turn_started = time.perf_counter()
        self.gc_started: dict[int, float] = {}
        self.counts: dict[str, float] = {}

    def note(self, **what: Any) -> None:
        with self.lock:
            self.out.write(json.dumps({"t": time.time(), **what}) + "\n")

    def before_task_step(self, task: Any) -> None:
        self.step_started = time.perf_counter()

    def after_task_step(self, task: Any) -> None:
        took = time.perf_counter() - self.step_started
        if took > self.threshold:
            self.note(kind="step", ms=round(took * 1000, 2), task=task.name)

    def before_io_wait(self, timeout: float) -> None:
        took = time.perf_counter() - self.turn_started
        if took > self.threshold:
            self.note(kind="turn", ms=round(took * 1000, 2))

    def after_io_wait(self, timeout: float) -> None:
        self.turn_started = time.perf_counter()

    def on_gc(self, phase: str, info: dict[str, Any]) -> None:
        ident = threading.get_ident()
        if phase == "start":
            self.gc_started[ident] = time.perf_counter()
            return
        took = time.perf_counter() - self.gc_started.pop(ident, time.perf_counter())
        generation = info.get("generation", -1)
        self.counts[f"gc{generation}"] = self.counts.get(f"gc{generation}", 0) + 1
        if generation == 2 or took > self.threshold / 4:
            self.note(kind="gc", generation=generation, ms=round(took * 1000, 2), collected=info.get("collected"),
                      thread=threading.current_thread().name)

    def hook_psutil(self) -> None:
        import psutil

        for name in ("process_iter", "pids"):
            original = getattr(psutil, name)

            def traced(*args: Any, _original: Any = original, _name: str = name, **kwargs: Any) -> Any:
                started = time.perf_counter()
                result = _original(*args, **kwargs)
                if _name == "process_iter":
                    result = list(result)
                caller = " <- ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}"
                                     for f in reversed(traceback.extract_stack(limit=6)[:-1]))
                self.note(kind="psutil." + _name, ms=round((time.perf_counter() - started) * 1000, 3),
                          thread=threading.current_thread().name, caller=caller)
                return result

            setattr(psutil, name, traced)

    def hook_writer(self) -> None:
        """Time every store write transaction (``_writer.run_batch``, in the writer's thread, fsync included):
        those over a quarter of the threshold are noted, all are counted in a histogram."""
        from codesdk.supervisor.store import _writer

        original = _writer.run_batch
        histogram = self.counts

        def timed(conn: Any, batch: list[Any]) -> None:
            started = time.perf_counter()
            try:
                original(conn, batch)
            finally:
                took = (time.perf_counter() - started) * 1000
                bucket = next(f"commit<={edge}ms" for edge in (1, 2, 5, 10, 20, 50, 100, 200, 10**9) if took <= edge)
                histogram[bucket] = histogram.get(bucket, 0) + 1
                histogram["commit_ms_total"] = histogram.get("commit_ms_total", 0) + took
                histogram["commit_requests"] = histogram.get("commit_requests", 0) + len(batch)
                if took > self.threshold * 1000 / 4:
                    self.note(kind="commit", ms=round(took, 2), requests=len(batch))

        _writer.run_batch = timed


def _profiled_threads(sink: list[cProfile.Profile]) -> None:
    """Every thread started from now on runs under a cProfile of its own, kept in ``sink``."""
    run = threading.Thread.run

    def profiled_run(self: threading.Thread) -> None:
        profile = cProfile.Profile(time.thread_time)
        sink.append(profile)
        profile.enable()
        try:
            run(self)
        finally:
            profile.disable()

    threading.Thread.run = profiled_run  # type: ignore[method-assign]


def _profiled_window(main_profile: cProfile.Profile, sink: list[cProfile.Profile]) -> None:
    """Profile only between SIGUSR1 and SIGUSR2 (the harness's steady window): the loop's thread by the signals,
    and each job handed to a thread (``trio.to_thread.run_sync``: the writer's transactions, the process-table
    scans, the orphan sweep) under a profile of its thread while the window is open."""
    active = [False]
    local = threading.local()

    def opened(signum: int, frame: Any) -> None:
        active[0] = True
        main_profile.enable()

    def closed(signum: int, frame: Any) -> None:
        active[0] = False
        main_profile.disable()

    signal.signal(signal.SIGUSR1, opened)
    signal.signal(signal.SIGUSR2, closed)
    original = trio.to_thread.run_sync

    async def run_sync(sync_fn: Any, *args: Any, **kwargs: Any) -> Any:
        def job(*job_args: Any) -> Any:
            if not active[0]:
                return sync_fn(*job_args)
            profile = getattr(local, "profile", None)
            if profile is None:
                profile = local.profile = cProfile.Profile(time.thread_time)
                sink.append(profile)
            profile.enable()
            try:
                return sync_fn(*job_args)
            finally:
                profile.disable()

        return await original(job, *args, **kwargs)

    trio.to_thread.run_sync = run_sync  # type: ignore[assignment]


def main() -> int:
    from codesdk.supervisor.cli import admin

    serve_options = admin._serve_options

    def with_bench_worker(args: Any) -> Any:
        return dataclasses.replace(serve_options(args), worker_argv=(sys.executable, BENCH_WORKER))

    admin._serve_options = with_bench_worker
    if os.environ.get("CODESDK_BENCH_TREE_SNAPSHOT_S"):  # an experiment: how often busy workers' trees are scanned
        from codesdk.worker.client import WorkerProcess

        WorkerProcess.tree_snapshot_s = float(os.environ["CODESDK_BENCH_TREE_SNAPSHOT_S"])

    stalls_path = os.environ.get("CODESDK_BENCH_STALLS")
    profile_path = os.environ.get("CODESDK_BENCH_PROFILE")
    trace = None
    if stalls_path:
        trace = _StallTrace(stalls_path, float(os.environ.get("CODESDK_BENCH_STALL_MS", "20")) / 1000)
        gc.callbacks.append(trace.on_gc)
        trace.hook_psutil()
        trace.hook_writer()
        trio_run = trio.run

        def run_instrumented(*args: Any, **kwargs: Any) -> Any:
            return trio_run(*args, instruments=[trace], **kwargs)

        trio.run = run_instrumented  # type: ignore[assignment]
    threads: list[cProfile.Profile] = []
    main_profile = cProfile.Profile(time.thread_time) if profile_path else None
    if main_profile is not None and os.environ.get("CODESDK_BENCH_PROFILE_WINDOW") == "1":
        _profiled_window(main_profile, threads)
    elif main_profile is not None:
        _profiled_threads(threads)
        main_profile.enable()
    try:
        return admin.main(sys.argv[1:])
    finally:
        if main_profile is not None and profile_path:
            main_profile.disable()
            stats = pstats.Stats(main_profile)
            for profile in threads:
                try:
                    stats.add(profile)
                except TypeError:  # a thread still running, its profile not yet disabled
                    profile.disable()
                    stats.add(profile)
            stats.dump_stats(profile_path)
        if trace is not None:
            trace.note(kind="end", gc_counts=trace.counts)


if __name__ == "__main__":
    sys.exit(main())
