"""Budgets from the command line, embedded and through a service: ``codesdk run --budget-tokens`` stops a task at its
budget (exit 3, ``budget_reached``), ``codesdk budget`` shows the pause, a new task is refused until
``codesdk budget --raise``; through a service ``--raise --continue`` goes on at once; ``serve --price-table`` refuses a
bad table at start; ``codesdk-supervisor namespace budget`` refuses new tasks (exit 69) once the month's budget is
spent. Each waits for its command to end, never for a duration."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from codesdk.supervisor.cli.common import EXIT_STOPPED, EXIT_UNAVAILABLE, EXIT_USAGE

from tests.e2e.test_cli import _env, _run
from tests.e2e.test_cli_lifecycle import SERVICE, _cli, _service
from tests.worker.harness import REPO


def _session_of(stdout: str) -> str:
    events = [json.loads(line) for line in stdout.splitlines()]
    return str(events[0]["trace"]["session_id"])


def test_a_task_over_its_budget_stops_and_its_session_waits_for_a_raise_embedded(tmp_path: Path) -> None:
    done = _run(tmp_path, "run", "hi", "--budget-tokens", "5", "--json", "--non-interactive")
    assert done.returncode == EXIT_STOPPED, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    assert [e["type"] for e in events][-2:] == ["budget.reached", "task.stopped"], done.stdout
    assert events[-1]["payload"]["reason"] == "budget_reached"
    sid = _session_of(done.stdout)
    shown = _run(tmp_path, "budget", sid)
    assert shown.returncode == 0 and "paused\tthe task's tokens limit (5) was reached" in shown.stdout, shown.stdout
    assert f"go on with: codesdk budget {sid} --raise\n" in shown.stdout, shown.stdout  # a task's limit: a plain raise
    refused = _run(tmp_path, "run", "more", "--session", sid, "--non-interactive")
    assert refused.returncode == EXIT_USAGE and "paused at its budget" in refused.stderr, refused.stderr
    continuing = _run(tmp_path, "budget", sid, "--raise", "--continue")
    assert continuing.returncode == EXIT_USAGE and "--continue needs a running service" in continuing.stderr
    raised = _run(tmp_path, "budget", sid, "--raise", "--json")
    assert raised.returncode == 0 and json.loads(raised.stdout).get("paused") is None, raised.stdout
    assert _run(tmp_path, "run", "more", "--session", sid, "--non-interactive").returncode == 0
    bad = _run(tmp_path, "run", "hi", "--budget-usd", "-1")
    assert bad.returncode == EXIT_USAGE and "--budget-usd" in bad.stderr, bad.stderr


def test_budgets_through_a_service_with_prices_and_a_monthly_budget(tmp_path: Path) -> None:
    data = tmp_path / "data"
    broken = tmp_path / "broken.json"
    broken.write_text('{"models": {"m": {"input": 1}}}')
    refused = subprocess.run([*SERVICE, "serve", "--data-dir", str(data), "--price-table", str(broken)],
                             capture_output=True, text=True, timeout=60, env=_env(tmp_path), cwd=REPO, check=False)
    assert refused.returncode == EXIT_USAGE and "models.m.output: Field required" in refused.stderr, refused.stderr
    prices = tmp_path / "prices.json"
    prices.write_text('{"models": {"scripted-1": {"input": 3, "output": 15}}}')
    with _service(data, "--enable-test-scenarios", "--price-table", str(prices)):
        token = (data / "admin.token").read_text().strip()
        remote = ("--url", f"unix:{data / 'api.sock'}", "--token", token)
        done = _cli(data, *remote, "run", "hi", "--budget-tool-calls", "0", "--scenario", "edit-file", "--json",
                    "--non-interactive", "--mode", "yolo")
        assert done.returncode == EXIT_STOPPED, done.stderr
        sid = _session_of(done.stdout)
        raised = _cli(data, *remote, "budget", sid, "--raise", "--tool-calls", "10", "--continue")
        assert raised.returncode == 0 and "goes on with the work" in raised.stderr, raised.stderr
        limit = subprocess.run([*SERVICE, "namespace", "budget", "user:team", "--monthly-usd", "0", "--data-dir",
                                str(data)], capture_output=True, text=True, timeout=60, env=_env(tmp_path), cwd=REPO,
                               check=False)
        assert limit.returncode == 0 and "monthly_usd\t0" in limit.stdout, limit.stderr
        spent = _cli(data, *remote, "run", "hi", "--namespace", "user:team", "--non-interactive")
        assert spent.returncode == EXIT_UNAVAILABLE and "monthly budget" in spent.stderr, spent.stderr
