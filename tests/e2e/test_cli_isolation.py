"""``codesdk run --isolation``: the level a new session is made at, what its runtime's HOME was, and the refusals —
an unknown level, a level for a session that has one, shared outside the operator's namespace — each exit 2 with one
line that says what to do."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from codesdk.protocol import IsolationLevel
from codesdk.supervisor.cli.common import ISOLATION_LEVELS

from tests.worker.harness import REPO

CLI = [sys.executable, "-m", "codesdk.supervisor.cli.front"]


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CODESDK_")}
    env |= {"CODESDK_DATA_DIR": str(tmp_path / "data"), "NO_COLOR": "1"}
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120, env=env,
                          stdin=subprocess.DEVNULL, cwd=REPO, check=False)


def _refusal(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2 and done.stdout == "", (done.returncode, done.stdout, done.stderr)
    return done.stderr


def test_run_makes_an_ephemeral_session_whose_home_goes_with_it(tmp_path: Path) -> None:
    done = _run(tmp_path, "run", "hello", "--isolation", "ephemeral", "--json", "--non-interactive")
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    session_id = events[0]["trace"]["session_id"]
    (model_input,) = [e for e in events if e["type"] == "model.input"]
    assert model_input["payload"]["isolation"] == "ephemeral"
    home = tmp_path / "data" / "ephemeral" / session_id / "home"
    assert home.is_dir()
    again = _run(tmp_path, "run", "more", "--session", session_id, "--json", "--non-interactive")
    assert again.returncode == 0, again.stderr
    assert '"isolation":"ephemeral"' in again.stdout.replace(" ", "")
    [listed] = _run(tmp_path, "sessions").stdout.splitlines()
    assert listed.startswith(session_id) and " isolation=ephemeral" in listed
    deleted = _run(tmp_path, "delete", session_id)
    assert deleted.returncode == 0, deleted.stderr
    assert not home.parent.exists()


def test_the_refusals_exit_2_and_say_what_to_do(tmp_path: Path) -> None:
    unknown = _refusal(_run(tmp_path, "run", "x", "--isolation", "isolated"))
    assert "namespaced" in unknown and "ephemeral" in unknown and "shared" in unknown
    first = _run(tmp_path, "run", "x", "--json", "--non-interactive")
    session_id = json.loads(first.stdout.splitlines()[0])["trace"]["session_id"]
    kept = _refusal(_run(tmp_path, "run", "y", "--session", session_id, "--isolation", "ephemeral"))
    assert "keeps the one it was created with" in kept
    shared = _refusal(_run(tmp_path, "run", "x", "--isolation", "shared", "--namespace", "user:alice"))
    assert "only for namespace 'default'" in shared and "'ephemeral'" in shared


def test_the_command_line_knows_the_levels_the_protocol_does() -> None:
    assert sorted(ISOLATION_LEVELS) == sorted(level.value for level in IsolationLevel)
    assert ISOLATION_LEVELS[0] == IsolationLevel.NAMESPACED  # the default first
