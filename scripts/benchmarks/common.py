"""What every case reports: a figure next to its baseline from the same run, as a ratio, with the spread."""

from __future__ import annotations

import statistics
import subprocess
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = str(REPO / "worker" / "adapters" / "scripted" / "scenarios")
BENCH_WORKER = str(Path(__file__).resolve().parent / "bench_worker.py")


def percentile(samples: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100): with few samples p99 is simply the largest, as it should be."""
    ordered = sorted(samples)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def timed_command(argv: list[str], env: dict[str, str], cwd: Path, check: str) -> float:
    """Wall seconds of one whole command; it must exit 0 with ``check`` in its stdout (else RuntimeError)."""
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=300, check=False)
    elapsed = time.perf_counter() - started
    if done.returncode != 0 or check not in done.stdout:
        raise RuntimeError(f"{argv[0]} failed (exit {done.returncode}): {done.stderr[-1000:] or done.stdout[-1000:]}")
    return elapsed


def median(samples: Sequence[float]) -> float:
    return float(statistics.median(samples))


@dataclass
class Figure:
    """One row of the table. ``ours``/``baseline`` are medians over repetitions; ``spread`` is ours' min..max.

    ``higher_is_better`` decides how the ratio reads: for rates it is ours/baseline (1.0 = as fast as raw),
    for times and sizes it is ours/baseline too, but smaller is better.
    """

    case: str
    metric: str
    unit: str
    ours: float
    baseline: float | None
    spread: tuple[float, float] | None = None
    higher_is_better: bool = False
    goal: str = ""
    met: bool | None = None
    note: str = ""
    samples: dict[str, Any] = field(default_factory=dict)

    @property
    def ratio(self) -> float | None:
        if self.baseline is None or self.baseline == 0:
            return None
        return self.ours / self.baseline

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ratio": self.ratio}


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "ev/s":
        return f"{value:,.0f}/s"
    if unit == "s":
        return f"{value:.2f} s" if value >= 1 else f"{value * 1000:.2f} ms" if value < 0.01 else f"{value * 1000:.0f} ms"
    if unit == "MB":
        return f"{value:.1f} MB"
    return f"{value:,.3g} {unit}"


def from_reps(case: str, metric: str, unit: str, ours: Sequence[float], baseline: Sequence[float] | None,
              **kwargs: Any) -> Figure:
    """A figure from per-repetition values: medians, and the spread of ours."""
    return Figure(case, metric, unit, median(ours), median(baseline) if baseline else None,
                  (min(ours), max(ours)), samples={"ours": list(ours), "baseline": list(baseline or [])}, **kwargs)


def print_table(figures: Sequence[Figure]) -> None:
    header = f"{'case':<9} {'metric':<40} {'codesdk':>13} {'baseline':>13} {'ratio':>7} {'spread (codesdk)':>24}  goal"
    print(header)
    print("-" * len(header))
    for f in figures:
        ratio = f"{f.ratio:.2f}" if f.ratio is not None else "-"
        spread = f"{fmt(f.spread[0], f.unit)}..{fmt(f.spread[1], f.unit)}" if f.spread else ""
        verdict = "" if f.met is None else (" ok" if f.met else " NOT MET")
        print(f"{f.case:<9} {f.metric:<40} {fmt(f.ours, f.unit):>13} {fmt(f.baseline, f.unit):>13} {ratio:>7} "
              f"{spread:>24}  {f.goal}{verdict}", flush=True)
        if f.note:
            print(f"{'':<9} ({f.note})")
