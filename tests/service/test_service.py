"""`codesdk-supervisor serve` as systemd runs it: sd_notify, SIGTERM drain, SIGKILL and recovery."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Any

import httpx2 as httpx
import psutil
import pytest

from tests.waits import HANG_GUARD_S, wait_for
from tests.worker.harness import REPO

SCENARIOS = str(REPO / "worker" / "adapters" / "scripted" / "scenarios")


def _start(tmp_path: Path, notify: Path | None = None, *serve_args: str, quiet: bool = False,
           **env: str) -> subprocess.Popen[bytes]:
    """``codesdk-supervisor serve`` on ``tmp_path/data``; ``quiet`` drops its log (for runs too chatty for a pipe
    nobody reads)."""
    full_env = {**os.environ, "CODESDK_SCENARIO_DIR": SCENARIOS, **env}
    if notify is not None:
        full_env["NOTIFY_SOCKET"] = str(notify)
    argv = [sys.executable, "-m", "codesdk.supervisor.cli.admin", "serve", "--data-dir", str(tmp_path / "data"),
            "--enable-test-scenarios", *serve_args]
    return subprocess.Popen(argv, env=full_env, cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL if quiet else subprocess.PIPE)


def kill_and_reap(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the service as a crash would, and reap the workers it leaves behind once they end (on the EOF of
    their stdin). A test process that ran an engine is a child subreaper, so they become its children."""
    try:
        workers = [child.pid for child in psutil.Process(proc.pid).children()]
    except psutil.Error:
        workers = []
    proc.kill()
    proc.wait(timeout=30)
    def reaped(pid: int) -> bool:
        try:
            return os.waitpid(pid, os.WNOHANG)[0] == pid
        except ChildProcessError:  # not ours: pid 1 reaps it
            return True

    for pid in workers:
        wait_for(f"worker {pid} to end and be reaped", partial(reaped, pid))


def _datagrams(sock: socket.socket, until: str) -> list[str]:
    """The notify socket's lines until one starts with ``until`` (a silent socket past the hang guard fails)."""
    seen: list[str] = []
    sock.settimeout(HANG_GUARD_S)
    while not any(line.startswith(until) for line in seen):
        try:
            seen += sock.recv(4096).decode().splitlines()
        except TimeoutError:
            raise AssertionError(f"no {until} among {seen}") from None
    return seen


def _client(tmp_path: Path) -> httpx.Client:
    token = (tmp_path / "data" / "admin.token").read_text().strip()
    transport = httpx.HTTPTransport(uds=str(tmp_path / "data" / "api.sock"))
    return httpx.Client(transport=transport, base_url="http://codesdk", headers={"Authorization": f"Bearer {token}"},
                        timeout=30)


def test_sd_notify_ready_watchdog_stopping_and_a_clean_exit(tmp_path: Path) -> None:
    notify = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(notify))
        proc = _start(tmp_path, notify, WATCHDOG_USEC="200000")
        try:
            ready = _datagrams(sock, "READY=1")
            assert any(line.startswith("STATUS=serving on") for line in ready), ready
            with _client(tmp_path) as client:
                assert client.get("/healthz").status_code == 200
            _datagrams(sock, "WATCHDOG=1")
            proc.send_signal(signal.SIGTERM)
            _datagrams(sock, "STOPPING=1")
            assert proc.wait(timeout=30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.communicate(timeout=30)


def test_sigterm_drains_a_running_task(tmp_path: Path) -> None:
    notify = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(notify))
        proc = _start(tmp_path, notify)
        try:
            _datagrams(sock, "READY=1")
            with _client(tmp_path) as client:
                session = client.post("/v1/sessions", json={"namespace": "default"}).json()
                task = client.post(f"/v1/sessions/{session['session_id']}/tasks",
                                   json={"prompt": "x", "runtime_config": {"scenario": "hang"}}).json()
                _wait_for_running(client, task["task_id"])
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.communicate(timeout=30)
    proc = _start(tmp_path, None)
    try:
        _wait_socket(tmp_path)
        with _client(tmp_path) as client:
            record = client.get(f"/v1/tasks/{task['task_id']}").json()
            assert record["state"] == "stopped"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)


def test_sigkill_mid_task_then_restart_recovers(tmp_path: Path) -> None:
    proc = _start(tmp_path)
    try:
        _wait_socket(tmp_path)
        with _client(tmp_path) as client:
            session = client.post("/v1/sessions", json={"namespace": "default"}).json()
            task = client.post(f"/v1/sessions/{session['session_id']}/tasks",
                               json={"prompt": "x", "interaction_mode": "interactive",
                                     "runtime_config": {"scenario": "write-or-deny"}}).json()
            _wait_for_running(client, task["task_id"])
            wait_for("a pending approval (the write waits for a human)",
                     lambda: client.get("/v1/approvals").json()["approvals"])
            before = client.get(f"/v1/sessions/{session['session_id']}/events").json()["events"]
        kill_and_reap(proc)
    finally:
        proc.communicate(timeout=30)
    (tmp_path / "data" / "api.sock").unlink(missing_ok=True)
    proc = _start(tmp_path)
    try:
        _wait_socket(tmp_path)
        with _client(tmp_path) as client:
            after = client.get(f"/v1/sessions/{session['session_id']}/events").json()["events"]
            record = client.get(f"/v1/tasks/{task['task_id']}").json()
            approvals = client.get("/v1/approvals?state=all").json()["approvals"]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    assert after[: len(before)] == before  # every committed event survived
    assert [e["seq"] for e in after] == list(range(1, len(after) + 1))
    terminals = [e for e in after if e["type"] in ("task.completed", "task.failed", "task.stopped")]
    assert len(terminals) == 1 and terminals[0]["payload"]["code"] == "SUPERVISOR_RESTARTED"
    assert record["state"] == "failed"
    # The approval that was pending is still listed, closed with the reason.
    assert [(a["tool_name"], a["state"]) for a in approvals] == [("workspace.write", "expired")]
    assert "restarted" in approvals[0]["decision_reason"]


def _wait_socket(tmp_path: Path, guard_s: float = HANG_GUARD_S) -> None:
    """Until the service answers /healthz. Probed first with a socket closed here: a refused httpx connection
    (between the service's bind and listen) leaks its socket, a ResourceWarning that fails whichever test is
    running when it is collected."""
    path = tmp_path / "data" / "api.sock"

    def serving() -> bool:
        if not (path.exists() and (tmp_path / "data" / "admin.token").exists()):
            return False
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(str(path))
            except (FileNotFoundError, ConnectionRefusedError):
                return False
        with _client(tmp_path) as client:
            return client.get("/healthz").status_code == 200

    wait_for(f"the supervisor to serve on {path}", serving, guard_s)


def _wait_for_running(client: httpx.Client, task_id: str) -> None:
    wait_for(f"task {task_id} to be running",
             lambda: client.get(f"/v1/tasks/{task_id}").json()["state"] == "running")


def test_cli_through_the_api(tmp_path: Path) -> None:
    proc = _start(tmp_path)
    try:
        _wait_socket(tmp_path)
        token = (tmp_path / "data" / "admin.token").read_text().strip()
        base = [sys.executable, "-m", "codesdk.supervisor.cli.front", "--url", f"unix:{tmp_path / 'data' / 'api.sock'}"]
        env = {**os.environ, "CODESDK_TOKEN": token, "NO_COLOR": "1"}

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([*base, *args], capture_output=True, text=True, timeout=60, env=env, cwd=REPO,
                                  stdin=subprocess.DEVNULL, check=False)

        ran = cli("run", "hello remote", "--json")
        assert ran.returncode == 0, ran.stderr
        events = [json.loads(line) for line in ran.stdout.splitlines()]
        assert events[-1]["type"] == "task.completed"
        session_id = events[0]["trace"]["session_id"]
        assert session_id in cli("sessions").stdout
        stored = [json.loads(line) for line in cli("events", session_id, "--json").stdout.splitlines()]
        assert stored[-len(events):] == events
        assert "You said: hello remote" in cli("show", session_id).stdout
        failed = cli("run", "x", "--scenario", "fail")
        assert failed.returncode == 1 and "RATE_LIMITED" in failed.stdout
        missing = cli("events", "ses_nope")
        assert missing.returncode == 2 and "404" in missing.stderr and "Traceback" not in missing.stderr
        no_token = subprocess.run([*base, "sessions"], capture_output=True, text=True, timeout=60, cwd=REPO,
                                  env={k: v for k, v in env.items() if k != "CODESDK_TOKEN"}, check=False)
        assert no_token.returncode == 2 and "needs a token" in no_token.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)


def test_a_token_added_while_serving_works_at_once(tmp_path: Path) -> None:
    proc = _start(tmp_path)
    try:
        _wait_socket(tmp_path)
        added = subprocess.run([sys.executable, "-m", "codesdk.supervisor.cli.admin", "token", "add", "carol", "--namespace",
                                "user:carol", "--data-dir", str(tmp_path / "data")], capture_output=True, text=True,
                               timeout=60, cwd=REPO, check=False)
        assert added.returncode == 0, added.stderr
        token = added.stdout.strip()
        transport = httpx.HTTPTransport(uds=str(tmp_path / "data" / "api.sock"))
        with httpx.Client(transport=transport, base_url="http://codesdk", timeout=30,
                          headers={"Authorization": f"Bearer {token}"}) as client:
            assert client.post("/v1/sessions", json={"namespace": "user:carol"}).status_code == 201
            assert client.post("/v1/sessions", json={"namespace": "default"}).status_code == 403
        bad = subprocess.run([sys.executable, "-m", "codesdk.supervisor.cli.admin", "token", "add", "x", "--namespace",
                              "user:../y", "--data-dir", str(tmp_path / "data")], capture_output=True, text=True,
                             timeout=60, cwd=REPO, check=False)
        assert bad.returncode == 2 and "invalid namespace" in bad.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)


def test_serve_allow_exec_enables_workspace_exec_for_tenants(tmp_path: Path) -> None:
    """``serve --allow-exec CMD`` turns the sandboxed tool on for the service's tenants (off without it), and only
    for the commands named."""
    scenario = {"name": "exec", "steps": [
        {"tool_calls": [{"id": "a", "name": "workspace.exec", "input": {"argv": ["echo", "from-exec"]}},
                        {"id": "b", "name": "workspace.exec", "input": {"argv": ["sh", "-c", "true"]}}]},
        {"text": "done"}, {"complete": {}}]}
    proc = _start(tmp_path, None, "--allow-exec", "echo")
    try:
        _wait_socket(tmp_path)
        with _client(tmp_path) as client:
            session = client.post("/v1/sessions", json={"namespace": "user:exec"}).json()
            sid = session["session_id"]
            started = client.post(f"/v1/sessions/{sid}/tasks", json={
                "prompt": "run it", "permission_mode": "yolo", "runtime_config": {"scenario_inline": scenario}})
            assert started.status_code in (200, 201, 202), started.text

            def ended() -> list[dict[str, Any]] | None:
                stored: list[dict[str, Any]] = client.get(f"/v1/sessions/{sid}/events").json()["events"]
                return stored if any(e["type"] in ("task.completed", "task.failed") for e in stored) else None

            events = wait_for("the task to end", ended)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    completed = {e["payload"]["tool_call_id"]: e["payload"] for e in events if e["type"] == "tool.call.completed"}
    denied = {e["payload"]["tool_call_id"]: e["payload"] for e in events if e["type"] == "tool.call.denied"}
    assert events[-1]["type"] == "task.completed", events[-1]
    assert completed["a"]["is_error"] is False and "from-exec" in str(completed["a"]["result_preview"])
    assert "b" in denied or completed["b"]["is_error"] is True  # sh is not on the allowlist


def test_a_store_that_is_no_postgresql_url_is_refused_without_echoing_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A libpq connection string has its password inside: the refusal must not print it."""
    from codesdk.supervisor.cli.admin import main

    for bad in ("host=/tmp user=u password=S3cretPW dbname=d", "S3cretPW"):
        assert main(["serve", "--data-dir", str(tmp_path / "data"), "--store", bad]) == 2
        err = capsys.readouterr().err
        assert "postgresql://" in err and "S3cretPW" not in err


def test_serve_without_flags_runs_on_the_defaults_of_the_options(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Each default is defined once, by the dataclass that holds it (``WorkerPolicy``, ``Quotas``, ``ApiLimits``,
    ``SupervisorOptions``): ``serve``'s flags read them, so the service and an embedded supervisor agree. Only what
    the service means to do differently differs: who it says it is, forking workers from a template, default
    task deadlines (a tenant's runaway task is nobody's to see; ``codesdk run``'s is its user's, at the terminal),
    a resource group per namespace, and approval routing (an embedded supervisor's tasks ask their terminal)."""
    from codesdk.supervisor.cli.admin import _serve_options, build_parser
    from codesdk.supervisor.engine import (
        SERVICE_IDLE_TIMEOUT_MAX_S,
        SERVICE_IDLE_TIMEOUT_S,
        SERVICE_TIMEOUT_MAX_S,
        SERVICE_TIMEOUT_S,
        DeadlineLimits,
        RoutingPolicy,
    )
    from codesdk.supervisor.service.assembly import SupervisorOptions

    monkeypatch.delenv("CODESDK_STORE", raising=False)
    args = build_parser().parse_args(["serve", "--data-dir", str(tmp_path)])
    assert _serve_options(args) == dataclasses.replace(SupervisorOptions(data_dir=tmp_path),
                                                       holder="codesdk-supervisor serve", worker_template=True,
                                                       task_deadlines=DeadlineLimits(
                                                           timeout_default_s=SERVICE_TIMEOUT_S,
                                                           idle_default_s=SERVICE_IDLE_TIMEOUT_S,
                                                           timeout_max_s=SERVICE_TIMEOUT_MAX_S,
                                                           idle_max_s=SERVICE_IDLE_TIMEOUT_MAX_S),
                                                       resource_groups=True, routing=RoutingPolicy())
