"""``codesdk run`` sends lines typed while its task streams to the task (steering): from a terminal by default, from
a pipe with ``--steer``, never from a stdin that is no terminal without it (CI has none to read)."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path
from typing import Any

CLI = [sys.executable, "-m", "codesdk.supervisor.cli.front"]
GUARD_S = 90


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("CODESDK_")} | {"NO_COLOR": "1"}


def _appended(data: Path) -> list[dict[str, Any]]:
    sessions = subprocess.run([*CLI, "--data-dir", str(data), "sessions", "--json"], capture_output=True, text=True,
                              env=_env(), stdin=subprocess.DEVNULL, timeout=GUARD_S, check=True)
    [sid] = [json.loads(line)["session_id"] for line in sessions.stdout.splitlines()]
    events = subprocess.run([*CLI, "--data-dir", str(data), "events", sid, "--json"], capture_output=True,
                            text=True, env=_env(), stdin=subprocess.DEVNULL, timeout=GUARD_S, check=True)
    return [e["payload"] for e in map(json.loads, events.stdout.splitlines()) if e["type"] == "model.input.appended"]


def test_piped_lines_steer_the_task_with_the_flag(tmp_path: Path) -> None:
    data = tmp_path / "data"
    ran = subprocess.run([*CLI, "--data-dir", str(data), "run", "go", "--scenario", "steer", "--steer"],
                         input="and the docs\n", capture_output=True, text=True, env=_env(), timeout=GUARD_S)
    assert ran.returncode == 0, ran.stderr
    assert "You added: and the docs" in ran.stdout
    assert "input sent (into the running turn)" in ran.stdout
    assert [(a["text"], a["delivery"]) for a in _appended(data)] == [("and the docs", "mid_turn")]


def test_a_stdin_that_is_no_terminal_is_not_read_without_the_flag(tmp_path: Path) -> None:
    data = tmp_path / "data"
    ran = subprocess.run([*CLI, "--data-dir", str(data), "run", "go", "--scenario", "echo"],
                         input="not for the task\n", capture_output=True, text=True, env=_env(), timeout=GUARD_S)
    assert ran.returncode == 0, ran.stderr
    assert _appended(data) == []


def test_lines_typed_on_a_terminal_steer_the_task(tmp_path: Path) -> None:
    data = tmp_path / "data"
    leader, follower = pty.openpty()
    try:
        process = subprocess.Popen([*CLI, "--data-dir", str(data), "run", "go", "--scenario", "steer"],
                                   stdin=follower, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   env=_env())
        os.close(follower)
        os.write(leader, b"typed here\n")
        out, err = process.communicate(timeout=GUARD_S)
    finally:
        os.close(leader)
    assert process.returncode == 0, err
    assert "You added: typed here" in out
    assert [a["text"] for a in _appended(data)] == ["typed here"]


def test_json_output_holds_events_only(tmp_path: Path) -> None:
    data = tmp_path / "data"
    ran = subprocess.run([*CLI, "--data-dir", str(data), "run", "go", "--scenario", "steer", "--steer", "--json"],
                         input="as json\n", capture_output=True, text=True, env=_env(), timeout=GUARD_S)
    assert ran.returncode == 0, ran.stderr
    events = [json.loads(line) for line in ran.stdout.splitlines()]
    assert "model.input.appended" in [e["type"] for e in events]
    assert "input sent (into the running turn)" in ran.stderr
