"""Case ``bundle``: what a support bundle of a long session costs the supervisor (issue 34).

One flood session; then, each measured in this process (the supervisor's): a raw read of the same events through
the store (the baseline), a bundle built the way the API builds it (a child process at the lowest priority:
``BundleService``), and the same session's bundle again (the cache). CPU seconds are this process's (RUSAGE_SELF)
and its children's (RUSAGE_CHILDREN); the loop's lag is how late a 5 ms sleep on the supervisor's loop wakes
meanwhile (what another tenant's request waits for).
"""

from __future__ import annotations

import resource
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

from codesdk.supervisor import bundle

from .cases import engine_in

_TICK_S = 0.005


def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


async def _lag(lags: list[float], stop: trio.Event) -> None:
    while not stop.is_set():
        started = time.perf_counter()
        await trio.sleep(_TICK_S)
        lags.append(max(0.0, time.perf_counter() - started - _TICK_S))


async def _measured(work: Callable[[], Awaitable[None]]) -> dict[str, float]:
    lags: list[float] = []
    stop = trio.Event()
    own, children, wall = _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN), time.perf_counter()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_lag, lags, stop)
        await work()
        stop.set()
    lags.sort()
    return {"wall_s": time.perf_counter() - wall, "cpu_s": _cpu(resource.RUSAGE_SELF) - own,
            "child_cpu_s": _cpu(resource.RUSAGE_CHILDREN) - children,
            "lag_p50_s": lags[len(lags) // 2], "lag_p99_s": lags[min(len(lags) - 1, int(len(lags) * 0.99))]}


async def run(events: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="codesdk-bench-bundle-") as tmp:
        async with engine_in(Path(tmp)) as engine:
            session = await engine.create_session(namespace="user:flood")
            scenario = {"name": "flood", "steps": [{"flood": events, "delta": "y" * 16}, {"complete": {}}]}
            task = await engine.start_task(session.session_id, "flood", runtime_config={"scenario_inline": scenario})
            await engine.wait_task(task.task_id)
            sid = session.session_id

            async def raw() -> None:
                after = 0
                while page := await engine.store.read(sid, after_seq=after, limit=500):
                    after = page[-1].seq

            service = bundle.BundleService(engine, bundle.BundleLimits(max_bytes=1 << 30))

            async def built() -> None:
                (await service.open("bench", sid)).close()

            baseline = await _measured(raw)
            ours = await _measured(built)
            cached = await _measured(built)
            return {"events": await engine.store.last_seq(sid), "raw": baseline, "child": ours, "cached": cached}
