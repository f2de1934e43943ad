"""``codesdk run --timeout / --idle-timeout`` end to end, embedded and through a service: a task that hangs is
stopped at its deadline and fails ``TASK_TIMEOUT`` (exit 1, the deadline said); a deadline over the service's
maximum is a usage error before anything is stored. Each waits for the command to end, never for a duration."""

from __future__ import annotations

import json
from pathlib import Path

from codesdk.supervisor.cli.common import EXIT_USAGE

from tests.e2e.test_cli import _run
from tests.e2e.test_cli_lifecycle import _cli, _service


def _last(stdout: str) -> dict[str, object]:
    events = [json.loads(line) for line in stdout.splitlines()]
    assert events and events[-1]["type"] == "task.failed", stdout
    return dict(events[-1]["payload"])


def test_run_with_a_timeout_stops_a_hanging_task_embedded(tmp_path: Path) -> None:
    done = _run(tmp_path, "run", "hang on", "--scenario", "hang", "--timeout", "0.5", "--json", "--non-interactive")
    assert done.returncode == 1, done.stderr
    payload = _last(done.stdout)
    assert payload["code"] == "TASK_TIMEOUT" and payload["retryable"] is False
    details = payload["details"]
    assert isinstance(details, dict) and details["deadline"] == "timeout_s" and details["receipt"]["worker"] == "confirmed"
    human = _run(tmp_path, "run", "hang on", "--scenario", "hang", "--idle-timeout", "0.5", "--non-interactive")
    assert human.returncode == 1 and "TASK_TIMEOUT" in human.stdout and "idle_timeout_s = 0.5 s" in human.stdout, \
        human.stdout


def test_run_with_deadlines_through_a_service(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with _service(data, "--enable-test-scenarios", "--task-idle-timeout-max", "60"):
        token = (data / "admin.token").read_text().strip()
        remote = ("--url", f"unix:{data / 'api.sock'}", "--token", token)
        done = _cli(data, *remote, "run", "hang on", "--scenario", "hang", "--idle-timeout", "0.5", "--json",
                    "--non-interactive")
        over = _cli(data, *remote, "run", "hang on", "--scenario", "hang", "--idle-timeout", "61",
                    "--non-interactive")
    assert done.returncode == 1, done.stderr
    payload = _last(done.stdout)
    assert payload["code"] == "TASK_TIMEOUT" and "idle_timeout_s = 0.5 s" in str(payload["message"])
    assert over.returncode == EXIT_USAGE, (over.returncode, over.stderr)
    assert "idle_timeout_s 61 s is above this supervisor's maximum of 60 s" in over.stderr, over.stderr
    assert len(over.stderr.strip().splitlines()) == 1, over.stderr
