"""The worker alone: ``codesdk-worker`` driven over real pipes, its flood read to the end, no supervisor.

``codesdk`` (ours): start ``codesdk-worker`` (scripted test steps on), ``runtime.initialize``, then
``runtime.startTask`` with an inline ``flood`` scenario of N deltas; read every line until the task's terminal
event, counting lines (no decoding beyond finding the terminal one). Reported: lines/s over the flood, and the
worker's own CPU (user + system, from /proc via psutil) per line.

Baseline (same run): a child writes the same number of ``runtime.event`` lines of the same shape to a pipe, read
the same way; its CPU per line likewise.

Run alone: ``python scripts/benchmarks/worker_alone.py [N] [--profile PATH] [--before TREE]`` (``--profile`` runs the
worker under cProfile and writes the stats to PATH, for finding what a line costs; ``--before`` also measures the
worker of another checkout, e.g. ``git archive REV | tar -x -C TREE``, in the same run).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from codesdk.worker.command import TEST_STEPS_ENV, worker_argv  # noqa: E402

DELTA = "x" * 16
READ_BYTES = 1 << 16


def _request(request_id: int, method: str, params: dict[str, Any]) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}).encode() + b"\n"


def _event_line(n: int) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "method": "runtime.event", "params": {"task_id": "flood", "n": n, "event": {
        "type": "model.output.delta", "time": "2026-01-01T00:00:00.000000Z", "runtime": {"name": "scripted"},
        "payload": {"block_id": "b1", "kind": "text", "delta": DELTA, "index": n}}}}, separators=(",", ":")).encode()


def _cpu_s(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


def _read_until(fd: int, buffer: bytearray, marker: bytes) -> int:
    """Read from ``fd`` until ``marker`` has been seen; returns the lines read (the buffer keeps what follows)."""
    lines = 0
    while True:
        at = buffer.find(marker)
        if at >= 0:
            end = buffer.find(b"\n", at)
            while end < 0:
                chunk = os.read(fd, READ_BYTES)
                if not chunk:
                    raise RuntimeError("the worker closed its output mid-line")
                buffer += chunk
                end = buffer.find(b"\n", at)
            lines += buffer.count(b"\n", 0, end + 1)
            start = buffer.rfind(b"\n", 0, at) + 1
            if b'"error":' in buffer[start:end]:  # an answer refusing what was asked: say so, never wait
                raise RuntimeError(f"the worker answered with an error: {bytes(buffer[start:end])[:500]!r}")
            del buffer[:end + 1]
            return lines
        lines += buffer.count(b"\n")
        last = buffer.rfind(b"\n")
        if last >= 0:
            del buffer[:last + 1]
        chunk = os.read(fd, READ_BYTES)
        if not chunk:
            raise RuntimeError(f"the worker closed its output before {marker!r}")
        buffer += chunk


def worker_codesdk(n: int, profile: Path | None = None, tree: Path | None = None) -> tuple[float, float]:
    """Lines/s of ``codesdk-worker`` flooding ``n`` deltas, and its CPU seconds per line. ``tree``: run the worker
    of another checkout (``git archive REV | tar -x -C TREE``), for a before/after in one run."""
    env = {**os.environ, TEST_STEPS_ENV: "1", "CODESDK_LOG_LEVEL": "WARNING"}
    argv = worker_argv()
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
        argv = [sys.executable, "-m", "codesdk.worker.main"]
    if profile is not None:
        # the worker ends with os._exit (no teardown): the profile is written just before it
        program = ("import cProfile, os, sys\nprofile = cProfile.Profile()\nexit_ = os._exit\n"
                   "def _exit(code):\n    profile.disable()\n    profile.dump_stats(PATH)\n    exit_(code)\n"
                   "os._exit = _exit\nPATH = sys.argv[1]\nsys.argv = ['codesdk-worker']\nfrom codesdk.worker.main import main\n"
                   "profile.enable()\nmain()\n")
        argv = [sys.executable, "-c", program, str(profile)]
    scenario = {"name": "flood", "steps": [{"flood": n, "delta": DELTA}, {"complete": {}}]}
    with subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, cwd=tree or REPO) as child:
        assert child.stdin is not None and child.stdout is not None
        fd, buffer = child.stdout.fileno(), bytearray()
        process = psutil.Process(child.pid)
        child.stdin.write(_request(1, "runtime.initialize", {"protocol_version": "1.0", "supervisor": {"name": "bench",
                                                                                                   "version": "0"}}))
        child.stdin.flush()
        _read_until(fd, buffer, b'"id":1')
        # one small task first: the worker's imports and the scripted runtime are warm before anything is timed
        warm = {"name": "warm", "steps": [{"flood": 10, "delta": DELTA}, {"complete": {}}]}
        child.stdin.write(_request(2, "runtime.startTask", {"runtime": "scripted", "session": {"session_id": "s"},
                                                            "task_id": "warm",
                                                            "runtime_config": {"scenario_inline": warm}}))
        child.stdin.flush()
        _read_until(fd, buffer, b'"type":"task.completed"')
        started, cpu = time.perf_counter(), _cpu_s(process)
        child.stdin.write(_request(3, "runtime.startTask", {"runtime": "scripted", "session": {"session_id": "s"},
                                                            "task_id": "flood",
                                                            "runtime_config": {"scenario_inline": scenario}}))
        child.stdin.flush()
        lines = _read_until(fd, buffer, b'"type":"task.completed"')
        elapsed, cpu = time.perf_counter() - started, _cpu_s(process) - cpu
        child.stdin.write(_request(4, "runtime.shutdown", {}))
        child.stdin.close()
        child.stdout.read()
        if child.wait(timeout=60) != 0:
            raise RuntimeError(f"codesdk-worker exited {child.returncode}")
    events = lines - 1  # the startTask response
    if events != n + 2:  # the deltas, model.output.completed, task.completed
        raise RuntimeError(f"read {events} events of {n + 2}")
    return events / elapsed, cpu / events


def worker_baseline(n: int) -> tuple[float, float]:
    """Lines/s of a child writing ``n + 2`` lines of the same shape to a pipe, read the same way; its CPU per line."""
    line = _event_line(1) + b"\n"
    last = _event_line(n + 2).replace(b"model.output.delta", b"task.completed") + b"\n"
    program = (f"import sys\nline = {line!r}\nw = sys.stdout.buffer.write\n"
               f"for _ in range({n + 1}): w(line)\nw({last!r})\nsys.stdout.flush()\n")
    ready = "import sys; sys.stdout.buffer.write(b'ready\\n'); sys.stdout.flush(); exec(sys.stdin.read())"
    with subprocess.Popen([sys.executable, "-c", ready], stdin=subprocess.PIPE, stdout=subprocess.PIPE) as child:
        assert child.stdin is not None and child.stdout is not None
        process, buffer = psutil.Process(child.pid), bytearray()
        _read_until(child.stdout.fileno(), buffer, b"ready")  # started: its interpreter's start is not timed
        started, cpu = time.perf_counter(), _cpu_s(process)
        child.stdin.write(program.encode())
        child.stdin.close()
        lines = _read_until(child.stdout.fileno(), buffer, b'"type":"task.completed"')
        elapsed, cpu = time.perf_counter() - started, _cpu_s(process) - cpu
        child.wait(timeout=60)
    if lines != n + 2:
        raise RuntimeError(f"baseline read {lines} lines of {n + 2}")
    return lines / elapsed, cpu / lines


def figures(p: dict[str, Any]) -> list[Any]:
    """The ``worker`` case of scripts/bench.py: lines/s and CPU per line, against the pipe, interleaved repetitions."""
    from benchmarks.common import from_reps

    n = p["worker_lines"]
    ours, base = [], []
    for _ in range(p["repeat"]):  # interleaved, so a noisy moment hits both sides alike
        base.append(worker_baseline(n))
        ours.append(worker_codesdk(n))
    rate = from_reps("worker", f"codesdk-worker alone, {n:,} deltas", "lines/s", [o[0] for o in ours],
                     [b[0] for b in base], higher_is_better=True, goal=">= 60k lines/s",
                     note="real pipes, initialize + startTask (scripted flood) read to task.completed; baseline: "
                          "a child writing the same lines to a pipe, read the same way")
    rate.met = rate.ours >= 60_000
    cpu = from_reps("worker", "worker CPU per line", "s", [o[1] for o in ours], [b[1] for b in base],
                    note="the worker process's user+system CPU over the flood / lines; baseline: the writing child's")
    return [rate, cpu]


def main() -> int:
    args = sys.argv[1:]
    profile = None
    if "--profile" in args:
        at = args.index("--profile")
        profile = Path(args[at + 1])
        del args[at:at + 2]
    tree = None
    if "--before" in args:
        at = args.index("--before")
        tree = Path(args[at + 1])
        del args[at:at + 2]
    n = int(args[0]) if args else 200_000
    base = worker_baseline(n)
    before = worker_codesdk(n, tree=tree) if tree is not None else None
    ours = worker_codesdk(n, profile)
    print(f"load {os.getloadavg()[0]:.2f}; worker alone: {ours[0]:,.0f} lines/s, {ours[1] * 1e6:.1f} us CPU/line; "
          f"pipe baseline: {base[0]:,.0f} lines/s, {base[1] * 1e6:.2f} us CPU/line", end="")
    if before is not None:
        print(f"; before ({tree}): {before[0]:,.0f} lines/s, {before[1] * 1e6:.1f} us CPU/line", end="")
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
