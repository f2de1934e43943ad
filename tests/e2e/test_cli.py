"""The `codesdk` command as a user runs it: real processes, real data dir."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from codesdk._version import __version__
from tests.worker.harness import REPO

CLI = [sys.executable, "-m", "codesdk.supervisor.cli.front"]


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CODESDK_")}
    env["CODESDK_DATA_DIR"] = str(tmp_path / "data")
    env["NO_COLOR"] = "1"
    return env


def _run(tmp_path: Path, *args: str, stdin: int | None = subprocess.DEVNULL) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120, env=_env(tmp_path),
                          stdin=stdin, cwd=REPO, check=False)


def test_run_streams_json_and_events_reads_back_the_same(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("alpha\n")
    (ws / "b.txt").write_text("beta\n")
    done = _run(tmp_path, "run", "read them", "--scenario", "parallel-tools", "--workspace", str(ws), "--json")
    assert done.returncode == 0, done.stderr
    streamed = [json.loads(line) for line in done.stdout.splitlines()]
    assert streamed[0]["type"] == "session.created" and streamed[-1]["type"] == "task.completed"
    session_id = streamed[0]["trace"]["session_id"]
    again = _run(tmp_path, "events", session_id, "--json")
    assert again.returncode == 0
    assert [json.loads(line) for line in again.stdout.splitlines()] == streamed
    listed = _run(tmp_path, "sessions")
    assert session_id in listed.stdout and "completed" in listed.stdout
    shown = _run(tmp_path, "show", session_id)
    assert "user: read them" in shown.stdout and "alpha" in shown.stdout


def test_human_output_and_exit_codes(tmp_path: Path) -> None:
    done = _run(tmp_path, "run", "hello there")
    assert done.returncode == 0
    assert "You said: hello there" in done.stdout and "task.completed" in done.stdout
    failed = _run(tmp_path, "run", "x", "--scenario", "fail")
    assert failed.returncode == 1 and "RATE_LIMITED" in failed.stdout
    missing = _run(tmp_path, "events", "ses_nope")
    assert missing.returncode == 2 and "no session 'ses_nope'" in missing.stderr
    bad_ns = _run(tmp_path, "run", "x", "--namespace", "user:../../etc")
    assert bad_ns.returncode == 2 and "invalid namespace" in bad_ns.stderr
    assert "Traceback" not in bad_ns.stderr + missing.stderr
    namespaces = _run(tmp_path, "namespaces")
    assert namespaces.stdout.startswith("default") and "namespaces/default/home" in namespaces.stdout


def _read_until(proc: subprocess.Popen[bytes], marker: bytes, seen: bytes = b"") -> bytes:
    deadline = time.monotonic() + 60
    assert proc.stderr is not None
    while marker not in seen and time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stderr], [], [], 1.0)
        if ready:
            seen += os.read(proc.stderr.fileno(), 4096)
    return seen


def test_ask_mode_prompts_on_a_terminal(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    master, slave = pty.openpty()
    proc = subprocess.Popen([*CLI, "run", "write", "--scenario", "write-or-deny", "--workspace", str(ws)],
                            stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(tmp_path),
                            cwd=REPO)
    os.close(slave)
    try:
        seen = _read_until(proc, b"[N]o: ")
        assert b"workspace.write" in seen and b"Allow? [y]es once" in seen
        os.write(master, b"y\n")
        out, _ = proc.communicate(timeout=60)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0
    assert (ws / "notes.txt").read_text() == "hello from the scripted runtime\n"
    assert b"tool.call.approved" in out and b"(user) approved on the terminal" in out


def test_a_runtimes_question_is_answered_on_the_terminal(tmp_path: Path) -> None:
    master, slave = pty.openpty()
    proc = subprocess.Popen([*CLI, "run", "a widget", "--scenario", "ask-user"], stdin=slave,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(tmp_path), cwd=REPO)
    os.close(slave)
    try:
        seen = _read_until(proc, b"> ")
        assert b"Before I start on: a widget" in seen and b"1. red" in seen and b"2. blue" in seen
        os.write(master, b"green\n")  # not a choice: said why, and asked again
        seen = _read_until(proc, b"'green' is not a choice", seen)
        os.write(master, b"1\n")
        seen = _read_until(proc, b"What should it be called?", seen)
        os.write(master, b"Widget\n")
        out, _ = proc.communicate(timeout=60)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert b"Colour red, name Widget." in out and b"question.answered (user)" in out


def test_an_unanswered_question_takes_the_operators_fallback(tmp_path: Path) -> None:
    master, slave = pty.openpty()
    proc = subprocess.Popen([*CLI, "run", "a widget", "--scenario", "ask-user", "--question-timeout", "1",
                             "--question-fallback", "default"], stdin=slave, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=_env(tmp_path), cwd=REPO)
    os.close(slave)
    try:
        out, _ = proc.communicate(timeout=60)  # nobody types
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert b"Colour blue, name untitled." in out and b"question.answered (fallback)" in out


def test_a_question_in_a_task_nobody_can_be_asked_in_is_declined(tmp_path: Path) -> None:
    done = _run(tmp_path, "run", "a widget", "--scenario", "ask-user", "--non-interactive")
    assert done.returncode == 0, done.stderr
    assert "question.answered (refused) declined: the task is not interactive" in done.stdout


def test_a_session_answer_on_the_terminal_is_a_grant_listed_and_revoked(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    master, slave = pty.openpty()
    proc = subprocess.Popen([*CLI, "run", "write", "--scenario", "write-twice", "--workspace", str(ws), "--json"],
                            stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(tmp_path),
                            cwd=REPO)
    os.close(slave)
    try:
        seen = _read_until(proc, b"[N]o: ")
        os.write(master, b"s\n")  # for the rest of the session: the second write is not asked
        out, err = proc.communicate(timeout=60)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert (ws / "first.txt").exists() and (ws / "second.txt").exists()
    assert (seen + err).count(b"[N]o: ") == 1
    events = [json.loads(line) for line in out.splitlines()]
    session_id = events[0]["trace"]["session_id"]
    [grant_id] = [e["payload"]["grant_id"] for e in events if e["type"] == "grant.created"]

    listed = _run(tmp_path, "grants", session_id)
    assert listed.returncode == 0 and grant_id in listed.stdout and "active" in listed.stdout
    assert "session" in listed.stdout and "workspace.write" in listed.stdout
    revoked = _run(tmp_path, "revoke", session_id, grant_id, "--json")
    assert revoked.returncode == 0, revoked.stderr
    assert json.loads(revoked.stdout)["state"] == "revoked"
    again = _run(tmp_path, "revoke", session_id, grant_id)
    assert again.returncode == 2 and "already revoked" in again.stderr
    unknown = _run(tmp_path, "revoke", session_id, "grt_nope")
    assert unknown.returncode == 2 and "has no grant grt_nope" in unknown.stderr
    assert "revoked" in _run(tmp_path, "grants", session_id).stdout
    # deciding needs the supervisor that runs the task; a decision's flags are checked before anything is sent
    nowhere = _run(tmp_path, "decide", "allow", "apr_x")
    assert nowhere.returncode == 2 and "--url" in nowhere.stderr
    bad = _run(tmp_path, "--url", "unix:/nonexistent.sock", "decide", "allow", "apr_x", "--scope", "rule")
    assert bad.returncode == 2 and "--path/--command/--host" in bad.stderr
    assert "Traceback" not in nowhere.stderr + bad.stderr + again.stderr


def test_events_follow_sees_a_task_run_by_another_process(tmp_path: Path) -> None:
    env = _env(tmp_path)
    first = _run(tmp_path, "run", "first")
    session_id = first.stdout.split("session ", 1)[1].split()[0]
    follower = subprocess.Popen([*CLI, "events", session_id, "--follow", "--json"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
    try:
        second = _run(tmp_path, "run", "second", "--session", session_id, "--scenario", "slow-stream",
                      "--config", "stop_grace_s=0")
        assert second.returncode == 0, second.stderr
        deadline = time.monotonic() + 30
        seen: list[dict[str, Any]] = []
        assert follower.stdout is not None
        while time.monotonic() < deadline:
            line = follower.stdout.readline()
            seen.append(json.loads(line))
            if seen[-1]["type"] == "task.completed" and seen[-1]["trace"]["task_id"] != seen[1]["trace"]["task_id"]:
                break
        assert [e["seq"] for e in seen] == list(range(1, len(seen) + 1))
        assert sum(e["type"] == "task.completed" for e in seen) == 2
    finally:
        follower.kill()
        follower.communicate(timeout=30)  # reaps it and closes its pipes


def test_a_reader_that_goes_away_ends_the_command_quietly(tmp_path: Path) -> None:
    """``codesdk run … --json | head -1``: the rest of the output has nowhere to go; no traceback, exit 0."""
    process = subprocess.Popen([*CLI, "--data-dir", str(tmp_path / "data"),
                                "run", "hello", "--json", "--scenario", "slow-stream"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                               env=_env(tmp_path), cwd=REPO)
    assert process.stdout is not None and process.stderr is not None
    first = json.loads(process.stdout.readline())
    process.stdout.close()
    with process.stderr:
        stderr = process.stderr.read().decode()
    assert process.wait(timeout=120) == 0, stderr
    assert first["type"] == "session.created" and "Traceback" not in stderr


def test_a_runtime_config_the_runtime_cannot_use_is_the_callers_mistake(tmp_path: Path) -> None:
    done = _run(tmp_path, "run", "hello", "--json", "--config", "stop_grace_s=-1")
    assert done.returncode == 1, done.stderr
    failed = json.loads(done.stdout.splitlines()[-1])
    assert failed["type"] == "task.failed"
    assert failed["payload"]["code"] == "INVALID_RUNTIME_CONFIG"
    assert "runtime_config.stop_grace_s must be a number of seconds from 0 to 60" in failed["payload"]["message"]


@pytest.mark.parametrize("command", ["codesdk.supervisor.cli.front", "codesdk.supervisor.cli.admin"])
def test_both_commands_say_their_version(command: str) -> None:
    """``codesdk --version`` and ``codesdk-supervisor --version``: the one version (``codesdk._version``), as a
    bug report should quote it."""
    done = subprocess.run([sys.executable, "-m", command, "--version"], capture_output=True, text=True, timeout=60,
                          cwd=REPO, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"codesdk {__version__}\n"
