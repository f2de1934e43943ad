"""One supervisor per data dir, stop signals, and nothing outliving its supervisor — with real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

from codesdk.supervisor.store import current_holder

from tests.waits import wait_for
from tests.worker.harness import REPO

CLI = [sys.executable, "-m", "codesdk.supervisor.cli.front"]
SERVICE = [sys.executable, "-m", "codesdk.supervisor.cli.admin"]
#: Seconds a condition these tests wait for may take before the test fails as hung (never a timing claim).
HANG_GUARD_S = 60.0


def _env(data: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CODESDK_")}
    env.update(CODESDK_DATA_DIR=str(data), NO_COLOR="1")
    return env


def _cli(data: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120, env=_env(data),
                          stdin=subprocess.DEVNULL, cwd=REPO, check=False)


def _start_cli(data: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([*CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(data), stdin=subprocess.DEVNULL, cwd=REPO)


def _read_until(proc: subprocess.Popen[str], needle: str) -> str:
    """stdout lines until one contains ``needle`` (the CLI streams events as they are stored)."""
    assert proc.stdout is not None
    seen = ""
    deadline = time.monotonic() + HANG_GUARD_S
    while needle not in seen:
        line = proc.stdout.readline()
        if not line or time.monotonic() > deadline:
            pytest.fail(f"no {needle!r} in the output: {seen[-2000:]}")
        seen += line
    return seen


def _gone(pid: int) -> bool:
    """Dead and reaped, or dead and someone else's to reap; a zombie re-parented to this (subreaper) test process
    is reaped here."""
    try:
        process = psutil.Process(pid)
        if process.status() != psutil.STATUS_ZOMBIE:
            return False
        if process.ppid() == os.getpid():
            os.waitpid(pid, 0)
        return True
    except (psutil.Error, ChildProcessError):
        return True


def _serving(data: Path) -> bool:
    holder = current_holder(data)
    return holder is not None and bool(holder.api)


@contextmanager
def _service(data: Path, *flags: str) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen([*SERVICE, "serve", "--data-dir", str(data), *flags], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=_env(data), cwd=REPO)
    try:
        wait_for("the service to hold the data dir and announce its API", lambda: _serving(data))
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)


def test_a_second_supervisor_on_a_busy_data_dir_is_refused_and_harms_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with _start_cli(data, "run", "count", "--scenario", "hang", "--non-interactive") as first:
        try:
            _read_until(first, "runtime.request.started")  # then it hangs until stopped
            holder = current_holder(data)
            assert holder is not None and holder.pid == first.pid and holder.command == "codesdk run"
            second = _cli(data, "run", "hi")
            assert second.returncode == 2
            assert f"in use by codesdk run (pid {first.pid})" in second.stderr and "--url" in second.stderr
            assert "Traceback" not in second.stderr
            service = subprocess.run([*SERVICE, "serve", "--data-dir", str(data)], capture_output=True, text=True,
                                     env=_env(data), cwd=REPO, timeout=120, check=False)
            assert service.returncode == 2 and f"(pid {first.pid})" in service.stderr, service.stderr[-2000:]
            # Readers need no lock: the store is readable while the run writes it.
            listed = _cli(data, "sessions", "--json")
            row = json.loads(listed.stdout.splitlines()[0])
            assert listed.returncode == 0 and row["last_task_state"] in ("pending", "running")
            assert _cli(data, "events", row["session_id"]).returncode == 0
            assert "user: count" in _cli(data, "show", row["session_id"]).stdout
        finally:
            first.send_signal(signal.SIGINT)
            out, _ = first.communicate(timeout=120)
    # The first run's task was never failed by the others: it was stopped by its own Ctrl-C.
    assert first.returncode == 130 and "task.stopped interrupted (SIGINT)" in out
    assert "SUPERVISOR_RESTARTED" not in _cli(data, "events", row["session_id"]).stdout
    assert current_holder(data) is None


def test_cli_goes_through_the_service_that_holds_the_data_dir(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with _service(data):
        done = _cli(data, "run", "hello through the service", "--json")
        assert done.returncode == 0, done.stderr
        assert "going through its API at unix:" in done.stderr
        events = [json.loads(line) for line in done.stdout.splitlines()]
        assert events[-1]["type"] == "task.completed"
        assert "hello through the service" in "".join(e["payload"].get("delta", "") for e in events)
        session_id = events[-1]["trace"]["session_id"]
        shown = _cli(data, "run", "again, as text", "--session", session_id)  # says where to read it back
        assert shown.returncode == 0, shown.stderr
        assert f"session {session_id}  task task_" in shown.stdout + shown.stderr
        assert "task completed. Read it again: codesdk " in shown.stdout
        assert f"events {session_id}  |  transcript: codesdk " in shown.stdout
        again = _cli(data, "events", session_id)
        assert again.returncode == 0 and "again, as text" in again.stdout
        refused = _cli(data, "run", "x", "--env", "A=B")
        assert refused.returncode == 2 and "--env cannot be honoured through the API" in refused.stderr
        refused = _cli(data, "run", "x", "--allow-exec", "ls")
        assert refused.returncode == 2 and "--allow-exec cannot be honoured" in refused.stderr
        refused = _cli(data, "run", "x", "--allow-fetch", "example.com")
        assert refused.returncode == 2 and "--allow-fetch cannot be honoured" in refused.stderr
        assert "serve --allow-fetch" in refused.stderr
        auth = _cli(data, "auth", "--runtime", "scripted")
        assert auth.returncode == 0 and "scripted in default" in auth.stdout


def test_run_session_takes_its_namespace_and_moves_only_when_told(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = _cli(data, "run", "one", "--namespace", "user:alice", "--json")
    assert first.returncode == 0, first.stderr
    session_id = json.loads(first.stdout.splitlines()[0])["trace"]["session_id"]
    again = _cli(data, "run", "two", "--session", session_id, "--json")
    assert again.returncode == 0, again.stderr
    assert any(e["type"] == "task.started" for e in map(json.loads, again.stdout.splitlines()))
    assert "namespace user:alice" not in again.stderr  # nothing printed about it: it simply applies
    clash = _cli(data, "run", "three", "--session", session_id, "--namespace", "user:bob")
    assert clash.returncode == 2 and "belongs to namespace 'user:alice', not 'user:bob'" in clash.stderr
    moved = _cli(data, "run", "three", "--session", session_id, "--runtime", "no-such-runtime", "--json")
    assert moved.returncode == 2 and moved.stdout == ""  # refused before a task is stored
    assert "no runtime 'no-such-runtime' in namespace 'user:alice'; it can run: " in moved.stderr
    shown = _cli(data, "run", "four", "--session", session_id)  # a failed move leaves the session where it was
    assert shown.returncode == 0 and " runtime scripted " in shown.stdout
    capped = _cli(data, "run", "five " * 100, "--session", session_id, "--max-input-tokens", "20")
    assert capped.returncode == 1 and "CONTEXT_TOO_LARGE" in capped.stdout and "raise max_input_tokens" in capped.stdout
    bad = _cli(data, "run", "six", "--session", session_id, "--max-input-tokens", "0")
    assert bad.returncode == 2 and "--max-input-tokens: expected a whole number of at least 1" in bad.stderr
    clash = _cli(data, "run", "three", "--session", session_id, "--workspace", str(tmp_path))
    assert clash.returncode == 2 and "keeps the workspace" in clash.stderr


def test_global_options_work_after_the_subcommand(tmp_path: Path) -> None:
    data = tmp_path / "elsewhere"
    done = subprocess.run([*CLI, "run", "hi", "--data-dir", str(data), "-v", "--json"], capture_output=True,
                          text=True, timeout=120, env=_env(tmp_path / "default"), stdin=subprocess.DEVNULL,
                          cwd=REPO, check=False)
    assert done.returncode == 0, done.stderr
    assert (data / "codesdk.sqlite3").exists() and not (tmp_path / "default").exists()
    assert " INFO " in done.stderr  # -v took effect
    listed = subprocess.run([*CLI, "sessions", "--data-dir", str(data)], capture_output=True, text=True,
                            timeout=120, env=_env(tmp_path / "default"), cwd=REPO, check=False)
    assert listed.returncode == 0 and "scripted" in listed.stdout


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGHUP, 129), (signal.SIGINT, 130)])
def test_a_stop_signal_stops_the_task_and_leaves_nothing_running(tmp_path: Path, signum: int, code: int) -> None:
    data = tmp_path / "data"
    with _start_cli(data, "run", "count", "--scenario", "hang", "--non-interactive") as run:
        try:
            _read_until(run, "runtime.request.started")
            tree = [p.pid for p in psutil.Process(run.pid).children(recursive=True)]
            run.send_signal(signum)
            out, _ = run.communicate(timeout=120)
        finally:
            if run.poll() is None:
                run.kill()
    name = signal.Signals(signum).name
    assert run.returncode == code and f"task.stopped interrupted ({name})" in out
    assert "task stopped. Read it again" in out
    wait_for("the worker to be gone", lambda: all(_gone(pid) for pid in tree))
    session_id = json.loads(_cli(data, "sessions", "--json").stdout)["session_id"]
    stored = [json.loads(line) for line in _cli(data, "events", session_id, "--json").stdout.splitlines()]
    assert stored[-1]["type"] == "task.stopped"


def test_nothing_outlives_a_killed_supervisor(tmp_path: Path) -> None:
    """SIGKILL of `codesdk run`: its worker and every process the runtime started (one that left the worker's
    session too) end by themselves; the next supervisor fails the task it left running, once."""
    data = tmp_path / "data"
    marker = f"7{uuid.uuid4().int % 10**6:06d}"
    steps = [{"spawn": ["sleep", f"{marker}1"]}, {"spawn": ["sleep", f"{marker}2"], "new_session": True},
             {"text": "spawned", "chunk_size": 64}, {"hang": True}]
    scenario = json.dumps({"name": "spawner", "steps": steps})
    with _start_cli(data, "run", "go", "--config", f"scenario_inline={scenario}", "--non-interactive") as run:
        try:
            _read_until(run, "spawned")
            tree = [p.pid for p in psutil.Process(run.pid).children(recursive=True)]
            sleepers = [p for p in psutil.process_iter(["name", "cmdline"])
                        if p.info["name"] == "sleep" and marker in " ".join(p.info["cmdline"] or ())]
            assert len(sleepers) == 2 and {p.pid for p in sleepers} <= set(tree)
        finally:
            run.kill()
    wait_for("the worker and what it started to be gone", lambda: all(_gone(pid) for pid in tree))
    assert current_holder(data) is None  # the kernel released the dead supervisor's lock
    again = _cli(data, "run", "hello again")
    assert again.returncode == 0, again.stderr
    session_id = json.loads(_cli(data, "sessions", "--json").stdout.splitlines()[0])["session_id"]
    stored = [json.loads(line) for line in _cli(data, "events", session_id, "--json").stdout.splitlines()]
    assert [(e["type"], e["payload"].get("code")) for e in stored if e["type"].startswith("task.")][-1] == (
        "task.failed", "SUPERVISOR_RESTARTED")


def test_a_tenants_control_characters_never_reach_the_operators_terminal(tmp_path: Path) -> None:
    """A prompt (and so the echoed answer) carrying escape sequences, a bell, a carriage return and a bidi
    override: `run`, `events` and `show` print them escaped, and keep them as they are in --json."""
    data = tmp_path / "data"
    hostile = "hi \x1b[2J\x1b]0;pwned\x07 \r\u202e done"
    ran = _cli(data, "run", hostile, "--scenario", "echo")
    assert ran.returncode == 0, ran.stderr
    session = next(line.split()[1] for line in ran.stdout.splitlines() if line.startswith("session "))
    for out in (ran.stdout, _cli(data, "events", session).stdout, _cli(data, "show", session).stdout):
        assert "\\x1b[2J" in out and "\\x07" in out and "\\u202e" in out
        assert not any(c in out for c in "\x1b\x07\r\u202e")
    stored = [json.loads(line) for line in _cli(data, "events", session, "--json").stdout.splitlines()]
    assert stored[1]["type"] == "task.started" and "\x1b[2J\x1b]0;pwned\x07" in stored[1]["payload"]["prompt_preview"]
