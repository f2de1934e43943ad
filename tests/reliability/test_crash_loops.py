"""A namespace whose worker keeps dying is quarantined; the others keep working; the quarantine lifts.

Burst intensity (many crashes in a short window) and sustained intensity (a slower but steady rate over a
long window) both quarantine. The quarantine ends by itself after ``quarantine_s`` or by an operator command
against the running service (``codesdk-supervisor quarantine lift NS``).
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import trio

from codesdk.protocol import EventType
from codesdk.supervisor.engine import Engine
from codesdk.supervisor.store import TaskState
from codesdk.supervisor.workers.launch import WorkerPolicy
from tests.conftest import MakeEngine
from tests.e2e.conftest import of_type, run_task
from tests.service.test_service import _client, _datagrams, _start
from tests.waits import wait_for
from tests.worker.harness import REPO

CRASH = {"scenario": "crash-exit"}
ECHO = {"scenario": "echo"}


async def _crash(engine: Engine, times: int, namespace: str = "default") -> None:
    for _ in range(times):
        _, record, _ = await run_task(engine, namespace=namespace, runtime_config=CRASH)
        assert record.error is not None and record.error["code"] == "WORKER_CRASHED"


def _slot(engine: Engine, namespace: str = "default") -> dict[str, Any]:
    return {s["namespace"]: s for s in engine.pool.status()}[namespace]


async def test_a_burst_of_crashes_quarantines_only_that_namespace(make_engine: MakeEngine) -> None:
    with trio.fail_after(90):
        policy = WorkerPolicy(max_restarts=3, restart_window_s=300, quarantine_s=3600)
        async with make_engine(worker_policy=policy) as engine:
            await _crash(engine, 3)
            slot = _slot(engine)
            assert slot["state"] == "failing" and slot["quarantined_until"] > time.time() + 3000
            assert "3 crashes in 300 s" in slot["quarantine_reason"]
            for _ in range(2):  # every new task is refused the same clear way, and no worker is started
                _, record, events = await run_task(engine, runtime_config=ECHO)
                assert record.state == TaskState.FAILED
                failed = of_type(events, EventType.TASK_FAILED)[0]
                assert failed.code == "WORKER_UNAVAILABLE" and failed.retryable
                assert "is quarantined" in failed.message
                assert "codesdk-supervisor quarantine lift default" in failed.message
            assert _slot(engine)["workers_started"] == 3
            # Another tenant is served meanwhile, by its own worker.
            _, other, _ = await run_task(engine, namespace="user:bob", runtime_config=ECHO)
            assert other.state == TaskState.COMPLETED


async def test_a_sustained_crash_rate_quarantines_too(make_engine: MakeEngine) -> None:
    """Crashes too far apart to ever make a burst still add up over the long window."""
    with trio.fail_after(90):
        policy = WorkerPolicy(max_restarts=2, restart_window_s=0.001, sustained_max_restarts=4,
                              sustained_window_s=300, quarantine_s=3600)
        async with make_engine(worker_policy=policy) as engine:
            await _crash(engine, 3)
            assert _slot(engine)["quarantined_until"] is None  # below both intensities: restarted each time
            await _crash(engine, 1)
            slot = _slot(engine)
            assert slot["quarantined_until"] is not None
            assert "4 crashes in 300 s" in slot["quarantine_reason"]
            _, record, _ = await run_task(engine, runtime_config=ECHO)
            assert record.error is not None and record.error["code"] == "WORKER_UNAVAILABLE"


async def test_the_quarantine_lifts_by_itself_after_its_time(make_engine: MakeEngine) -> None:
    quarantine_s = 1.0
    with trio.fail_after(90):
        policy = WorkerPolicy(max_restarts=2, restart_window_s=300, quarantine_s=quarantine_s)
        async with make_engine(worker_policy=policy) as engine:
            await _crash(engine, 2)
            _, refused, _ = await run_task(engine, runtime_config=ECHO)
            assert refused.error is not None and refused.error["code"] == "WORKER_UNAVAILABLE"
            await trio.sleep(quarantine_s)
            _, record, _ = await run_task(engine, runtime_config=ECHO)
            assert record.state == TaskState.COMPLETED
            # A fresh budget: one more crash restarts the worker instead of quarantining again.
            await _crash(engine, 1)
            _, again, _ = await run_task(engine, runtime_config=ECHO)
            assert again.state == TaskState.COMPLETED


async def test_the_operator_lifts_a_quarantine_at_once(make_engine: MakeEngine) -> None:
    with trio.fail_after(90):
        policy = WorkerPolicy(max_restarts=2, restart_window_s=300, quarantine_s=3600)
        async with make_engine(worker_policy=policy) as engine:
            assert engine.pool.lift_quarantine("default") is False  # nothing to lift
            await _crash(engine, 2)
            assert engine.pool.lift_quarantine("default") is True
            _, record, _ = await run_task(engine, runtime_config=ECHO)
            assert record.state == TaskState.COMPLETED
            assert _slot(engine)["quarantined_until"] is None


def _supervisor(*args: str, data: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "codesdk.supervisor.cli.admin", *args, "--data-dir", str(data)],
                          check=False, cwd=REPO, capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)


def test_codesdk_supervisor_quarantine_lift_against_the_running_service(tmp_path: Path) -> None:
    data = tmp_path / "data"
    notify = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(notify))
        proc = _start(tmp_path, notify, "--max-restarts", "1", "--quarantine", "3600")
        try:
            _datagrams(sock, "READY=1")
            with _client(tmp_path) as client:
                def run(config: dict[str, str]) -> dict[str, Any]:
                    session = client.post("/v1/sessions", json={"namespace": "default"}).json()
                    task = client.post(f"/v1/sessions/{session['session_id']}/tasks",
                                       json={"prompt": "x", "runtime_config": config}).json()
                    def ended() -> dict[str, Any] | None:
                        record = client.get(f"/v1/tasks/{task['task_id']}").json()
                        return None if record["state"] in ("pending", "running") else dict(record)

                    return wait_for(f"task {task['task_id']} to end", ended)

                assert run(CRASH)["error"]["code"] == "WORKER_CRASHED"
                assert run(ECHO)["error"]["code"] == "WORKER_UNAVAILABLE"
                listed = _supervisor("quarantine", "list", data=data)
                assert listed.returncode == 0, listed.stderr
                assert "default\tfailing" in listed.stdout and "quarantined until" in listed.stdout
                lifted = _supervisor("quarantine", "lift", "default", data=data)
                assert (lifted.returncode, lifted.stdout.strip()) == (0, "default: quarantine lifted")
                assert run(ECHO)["state"] == "completed"
                again = _supervisor("quarantine", "lift", "default", data=data)
                assert again.stdout.strip() == "default: not quarantined"
                # Tenants may neither see the pool nor lift anything.
                token = _supervisor("token", "add", "alice", "--namespace", "user:alice", data=data).stdout.strip()
                headers = {"Authorization": f"Bearer {token}"}
                assert client.get("/v1/workers", headers=headers).status_code == 403
                assert client.delete("/v1/namespaces/default/quarantine", headers=headers).status_code == 403
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            finally:
                if proc.poll() is None:
                    proc.kill()
                proc.communicate(timeout=30)


def test_the_quarantine_command_says_when_the_service_is_not_running(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    missing = _supervisor("quarantine", "list", data=data)
    assert missing.returncode == 2 and "admin token" in missing.stderr
    (data / "admin.token").write_text("x\n")
    down = _supervisor("quarantine", "lift", "default", data=data)
    assert down.returncode == 3 and "cannot reach" in down.stderr and str(data / "api.sock") in down.stderr
    assert down.stderr.count("running") == 1 and down.stderr.count("\n") == 1, down.stderr  # said once
