"""Case 9 (``fairness``) through the service: what another tenant sees while one tenant floods.

The real service (``codesdk-supervisor serve``, SQLite store at its shipped durability, on a unix socket) with a
tokens file giving two tenants a namespace each. The *other* tenant runs small tasks (scripted ``echo``) one after
another over the HTTP API with ``codesdk.AsyncClient``: each is timed from ``POST .../tasks`` to its terminal event
read from the SSE stream — what a tenant's app waits for. First with nothing else running (its quiet figures, the
baseline of the same run), then while the flooding tenant streams a million deltas that a follower of its own (a
separate process, as the flooding tenant's app would be) reads over SSE. Quiet and flooded tasks alternate in
rounds (the flood stopped between them), so a busy neighbour on a shared machine hits both alike. The ratio
flooded/quiet is per run.

``CODESDK_BENCH_SERVE=wrapper.py`` runs the service as ``python wrapper.py serve ...`` instead of the admin module
(a wrapper that adds a trio instrument or timers: how the time was found, docs/performance.md case 9).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import trio

from codesdk.client import AsyncClient
from scripts.benchmarks.common import REPO, SCENARIOS, percentile

FLOOD = 1_000_000  # far more than is stored while the other tenant's tasks run; the flood is stopped after
WARM_EVENTS = 2_000  # the flood is streaming (past the stream threshold) before anything is timed
ALONE_EVENTS = 10_000  # the flood's rate alone, measured over this many events
GUARD_S = 120.0

_FOLLOWER = """
import sys, httpx2 as httpx
sock, token, session = sys.argv[1:4]
with httpx.Client(transport=httpx.HTTPTransport(uds=sock), base_url="http://codesdk",
                  headers={"Authorization": f"Bearer {token}"}, timeout=httpx.Timeout(30.0, read=None)) as c:
    with c.stream("GET", f"/v1/sessions/{session}/events/stream") as r:
        for _ in r.iter_bytes():
            pass
"""


def _cli(data_dir: Path, *args: str) -> str:
    return subprocess.run([sys.executable, "-m", "codesdk.supervisor.cli.admin", *args, "--data-dir", str(data_dir)],
                          cwd=REPO, check=True, capture_output=True, text=True).stdout.strip()


async def _serving(sock: Path, token: str) -> None:
    with trio.fail_after(GUARD_S):
        while True:
            if sock.exists():
                try:
                    async with AsyncClient(socket=sock, token=token) as client:
                        await client.namespaces()
                        return
                except Exception:  # noqa: BLE001 - not listening yet
                    pass
            await trio.sleep(0.05)


async def _small_task(client: AsyncClient, session_id: str) -> float:
    """Seconds from starting a small task to its terminal event read from the stream."""
    started = time.perf_counter()
    last: Any = None
    async for event in client.run(session_id, "hello", runtime_config={"scenario": "echo"}):
        last = event
    elapsed = time.perf_counter() - started
    if last is None or last.type != "task.completed":
        raise RuntimeError(f"the other tenant's task ended with {getattr(last, 'type', None)}")
    return elapsed


async def _last_seq(client: AsyncClient, session_id: str) -> int:
    return int((await client.get_session(session_id)).last_seq)


async def _stored_at_least(client: AsyncClient, session_id: str, count: int) -> None:
    with trio.fail_after(GUARD_S):
        while await _last_seq(client, session_id) < count:
            await trio.sleep(0.02)


async def run_once(tasks: int, rounds: int = 2, *extra_serve_args: str) -> dict[str, Any]:
    """One service, two tenants; the other tenant's small tasks, ``tasks`` quiet then ``tasks`` during a flood, for
    ``rounds`` rounds (the flood stopped between them)."""
    with tempfile.TemporaryDirectory(prefix="codesdk-bench-fair-") as tmp:
        data = Path(tmp) / "data"
        data.mkdir(mode=0o700)
        flooder_token = _cli(data, "token", "add", "flooder", "--namespace", "user:flooder")
        other_token = _cli(data, "token", "add", "other", "--namespace", "user:other")
        sock = data / "api.sock"
        env = {**os.environ, "CODESDK_SCENARIO_DIR": SCENARIOS}
        program = os.environ.get("CODESDK_BENCH_SERVE")  # a wrapper of the admin command (profiling), or none
        argv = [sys.executable, *([program] if program else ["-m", "codesdk.supervisor.cli.admin"]), "serve",
                "--data-dir", str(data),
                "--enable-test-scenarios", "--log-level", "WARNING", *extra_serve_args]
        service = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        follower: subprocess.Popen[bytes] | None = None
        try:
            await _serving(sock, other_token)
            async with AsyncClient(socket=sock, token=flooder_token) as flooder, \
                    AsyncClient(socket=sock, token=other_token) as other:
                flood_session = (await flooder.create_session(namespace="user:flooder")).session_id
                other_session = (await other.create_session(namespace="user:other")).session_id
                await _small_task(flooder, flood_session)  # both workers running: spawn time is case 4
                await _small_task(other, other_session)
                follower = subprocess.Popen([sys.executable, "-c", _FOLLOWER, str(sock), flooder_token,
                                             flood_session], cwd=REPO, stdout=subprocess.DEVNULL)
                quiet: list[float] = []
                flooded: list[float] = []
                rates: dict[str, float] = {}
                for round_ in range(rounds):  # quiet and flooded in turns, so a noisy neighbour hits both alike
                    quiet += [await _small_task(other, other_session) for _ in range(tasks)]
                    base = await _last_seq(flooder, flood_session)
                    scenario = {"name": "flood", "steps": [{"flood": FLOOD, "delta": "y" * 16}, {"complete": {}}]}
                    flood = await flooder.start_task(flood_session, "flood",
                                                     runtime_config={"scenario_inline": scenario})
                    await _stored_at_least(flooder, flood_session, base + WARM_EVENTS)
                    if round_ == 0:  # the flood's rate alone
                        alone_from, alone_started = await _last_seq(flooder, flood_session), time.perf_counter()
                        await _stored_at_least(flooder, flood_session, alone_from + ALONE_EVENTS)
                        alone_to, alone_ended = await _last_seq(flooder, flood_session), time.perf_counter()
                        rates["alone"] = (alone_to - alone_from) / (alone_ended - alone_started)
                    shared_from, shared_started = await _last_seq(flooder, flood_session), time.perf_counter()
                    cpu_before = _cpu(service.pid, follower.pid)
                    flooded += [await _small_task(other, other_session) for _ in range(tasks)]
                    cpu_after = _cpu(service.pid, follower.pid)
                    shared_to, shared_ended = await _last_seq(flooder, flood_session), time.perf_counter()
                    rates.setdefault("shared", (shared_to - shared_from) / (shared_ended - shared_started))
                    still = (await flooder.get_task(flood.task_id)).state
                    if still != "running":
                        raise RuntimeError(f"the flood ended ({still}) before the other tenant's tasks did: "
                                           "raise FLOOD")
                    await flooder.stop_task(flood.task_id)
                    with trio.fail_after(GUARD_S):
                        while (await flooder.get_task(flood.task_id)).state == "running":
                            await trio.sleep(0.02)
        finally:
            if follower is not None:
                follower.kill()
                follower.wait(timeout=30)
            service.terminate()
            try:
                service.wait(timeout=60)
            except subprocess.TimeoutExpired:
                service.kill()
                service.wait(timeout=30)
    return {"quiet": quiet, "flooded": flooded, "quiet_p50": percentile(quiet, 50),
            "flooded_p50": percentile(flooded, 50), "quiet_p95": percentile(quiet, 95),
            "flooded_p95": percentile(flooded, 95), "flood_alone_rate": rates["alone"],
            "flood_shared_rate": rates["shared"],
            "cpu_share": {k: (cpu_after[k] - cpu_before.get(k, 0.0)) / (shared_ended - shared_started)
                          for k in cpu_after}}


def _cpu(service: int, follower: int) -> dict[str, float]:
    """CPU seconds so far of the service (per thread), its workers, the flood's follower and this process."""
    found: dict[str, float] = {}
    try:
        proc = psutil.Process(service)
        for thread in proc.threads():
            name = "service main thread" if thread.id == service else "service other threads"
            found[name] = found.get(name, 0.0) + thread.user_time + thread.system_time
        for child in proc.children(recursive=True):
            times = child.cpu_times()
            found[f"worker {child.pid}"] = times.user + times.system
        times = psutil.Process(follower).cpu_times()
        found["flood's SSE follower"] = times.user + times.system
    except psutil.Error:
        pass
    times = psutil.Process().cpu_times()
    found["bench client"] = times.user + times.system
    return found


if __name__ == "__main__":  # a single run, for profiling: python -m scripts.benchmarks.fairness [TASKS [ROUNDS]]
    given = [int(arg) for arg in sys.argv[1:3]]
    tasks, rounds = given + [10, 2][len(given):]
    result = trio.run(run_once, tasks, rounds)
    print({k: v for k, v in result.items() if k not in ("quiet", "flooded")})
    print({k: round(v, 2) for k, v in result["cpu_share"].items()})
    print("flooded", [round(x * 1000) for x in result["flooded"]])
