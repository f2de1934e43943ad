"""`codesdk run --runtime claude` and `codesdk auth` as an operator uses them (fake API, in the namespace)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from fixtures.fake_anthropic import FakeAnthropic
from codesdk.supervisor.workers.launch import Headstart, PoolConfig
from codesdk.worker.adapters.claude.launch import cli_path

from tests.netns import skip_outside_netns
from tests.waits import wait_for
from tests.worker.harness import REPO

CLI = [sys.executable, "-m", "codesdk.supervisor.cli.front"]
pytestmark = [pytest.mark.runtime, skip_outside_netns,
              pytest.mark.skipif(cli_path() is None, reason="claude-agent-sdk is not installed")]


def _cli(data: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "--data-dir", str(data), *args], capture_output=True, text=True, timeout=120,
                          cwd=REPO, stdin=subprocess.DEVNULL, check=False)


def test_run_with_claude_streams_and_stores(tmp_path: Path) -> None:
    with FakeAnthropic.start(tmp_path / "api.jsonl") as fake:
        done = _cli(tmp_path / "data", "-vv", "run", "hello from the cli", "--runtime", "claude", "--json",
                    "--env", f"ANTHROPIC_BASE_URL={fake.base_url}", "--env", "ANTHROPIC_API_KEY=sk-test",
                    "--env", "CLAUDE_CODE_MAX_RETRIES=0")
    assert done.returncode == 0, done.stderr[-2000:]
    events = [json.loads(line) for line in done.stdout.splitlines()]
    assert events[-1]["type"] == "task.completed"
    assert any(e["type"] == "model.output.delta" for e in events)
    assert all(e["runtime"]["name"] == "claude" for e in events)
    assert "Echo: hello from the cli" in "".join(e["payload"].get("delta", "") for e in events)
    # The CLI was started ahead of the task, by the worker started ahead of the supervisor, and served it.
    assert "started claude ahead of its task" in done.stderr and "worker pid" in done.stderr
    assert "not using the claude started ahead" not in done.stderr and "not adopting" not in done.stderr


def test_auth_reports_per_namespace(tmp_path: Path) -> None:
    data = tmp_path / "data"
    missing = _cli(data, "auth", "--runtime", "claude", "--namespace", "user:alice")
    assert missing.returncode == 1
    assert "unauthenticated" in missing.stdout
    assert f"codesdk auth login --runtime claude --namespace user:alice --data-dir {data}" in missing.stdout
    creds = data / "namespaces" / "user.alice" / "home" / ".claude"
    creds.mkdir(parents=True, exist_ok=True)
    (creds / ".credentials.json").write_text('{"claudeAiOauth": {"accessToken": "tok-secret"}}')
    ok = _cli(data, "auth", "--runtime", "claude", "--namespace", "user:alice", "--json")
    assert ok.returncode == 0
    status = json.loads(ok.stdout)["status"]
    assert (status["state"], status["method"]) == ("authenticated", "oauth_local")
    assert "tok-secret" not in ok.stdout
    other = _cli(data, "auth", "--runtime", "claude", "--namespace", "user:bob")
    assert other.returncode == 1  # alice's login is not bob's


def test_run_without_a_login_fails_and_says_how_to_log_in(tmp_path: Path) -> None:
    with FakeAnthropic.start(tmp_path / "api.jsonl") as fake:
        done = _cli(tmp_path / "data", "run", "hello", "--runtime", "claude", "--json",
                    "--env", f"ANTHROPIC_BASE_URL={fake.base_url}", "--env", "CLAUDE_CODE_MAX_RETRIES=0")
        assert fake.requests() == []
    assert done.returncode == 1, done.stderr[-2000:]
    failed = [json.loads(line) for line in done.stdout.splitlines()][-1]
    assert failed["type"] == "task.failed" and failed["payload"]["code"] == "AUTH_REQUIRED"
    assert not failed["payload"]["retryable"]
    assert (f"codesdk auth login --runtime claude --namespace default --data-dir {tmp_path / 'data'}"
            in failed["payload"]["message"])


def test_a_worker_started_ahead_and_not_adopted_takes_its_cli_with_it(tmp_path: Path) -> None:
    """The CLI a headstart's worker started ahead leads a process group of its own in the worker's session:
    discarding the headstart ends that session, not just the worker's group."""
    ws = tmp_path / "ws"
    ws.mkdir()
    config = PoolConfig(data_dir=tmp_path / "data")
    headstart = Headstart.start(config, "default", runtime_ahead={"runtime": "claude", "runtime_config": {},
                                                                   "workspace": str(ws)})
    assert headstart is not None and headstart.pid is not None
    worker = psutil.Process(headstart.pid)
    clis = wait_for("the worker to start claude ahead",
                    lambda: [p for p in worker.children(recursive=True) if p.name() == "claude"])
    headstart.discard()
    for cli in clis:  # dead: gone, or a zombie left to whoever adopted it (pid 1 when we are no subreaper)
        with contextlib.suppress(psutil.NoSuchProcess):
            assert cli.status() == psutil.STATUS_ZOMBIE and cli.ppid() != os.getpid()
