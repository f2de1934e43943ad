"""`codesdk auth login`: the runtime's own login, run in one namespace's HOME, never opening a browser."""

from __future__ import annotations

import contextlib
import os
import queue
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest

from codesdk.worker.adapters.claude.launch import cli_path

from tests.netns import skip_outside_netns
from tests.worker.harness import REPO

CLI = [sys.executable, "-m", "codesdk.supervisor.cli.front"]
#: Seconds the login may take to print its URL before the test gives up as hung (not a timing claim).
HANG_GUARD_S = 60.0


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CODESDK_", "ANTHROPIC_", "CLAUDE_"))}
    env.update(HOME=str(tmp_path / "operator-home"), NO_COLOR="1", DISPLAY=":99")  # a display: still no browser
    (tmp_path / "operator-home").mkdir(exist_ok=True)
    return env


def test_a_runtime_without_a_login_says_so(tmp_path: Path) -> None:
    done = subprocess.run([*CLI, "auth", "login", "--runtime", "scripted", "--data-dir", str(tmp_path / "data")],
                          capture_output=True, text=True, timeout=120, env=_env(tmp_path), cwd=REPO,
                          stdin=subprocess.DEVNULL, check=False)
    assert done.returncode == 0 and "scripted has no login of its own" in done.stdout


@pytest.mark.runtime
@skip_outside_netns
@pytest.mark.skipif(cli_path() is None, reason="claude-agent-sdk (with its bundled CLI) is not installed")
def test_claude_login_runs_in_the_namespace_home_and_prints_the_url(tmp_path: Path) -> None:
    data = tmp_path / "data"
    bin_dir = tmp_path / "bin"  # an xdg-open that records being called: no browser may be opened
    bin_dir.mkdir()
    opened = tmp_path / "browser-opened"
    for name in ("xdg-open", "open", "sensible-browser"):
        (bin_dir / name).write_text(f"#!/bin/sh\necho \"$@\" >> {opened}\n")
        (bin_dir / name).chmod(0o755)
    env = _env(tmp_path)
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    with subprocess.Popen([*CLI, "auth", "login", "--runtime", "claude", "--namespace", "user:alice",
                           "--data-dir", str(data)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, env=env, cwd=REPO) as login:
        try:
            assert login.stdout is not None and login.stdin is not None
            lines: queue.Queue[str] = queue.Queue()  # what it prints, then "" at its end
            stdout = login.stdout

            def pump() -> None:
                for printed in stdout:
                    lines.put(printed)
                lines.put("")

            threading.Thread(target=pump, daemon=True).start()
            seen = ""
            while "https://" not in seen:
                try:
                    line = lines.get(timeout=HANG_GUARD_S)  # a hang guard only
                except queue.Empty:
                    line = ""
                assert line, f"no URL printed: {seen!r}"
                seen += line
            # offline, exchanging the code fails: the login ends with an error. (Not communicate(): it would
            # read stdout beside the pump thread.)
            assert login.stderr is not None
            stderr = login.stderr
            errors: list[str] = []
            reader = threading.Thread(target=lambda: errors.append(stderr.read()), daemon=True)
            reader.start()
            login.stdin.write("not-a-real-code#not-a-real-state\n")
            login.stdin.close()
            login.wait(timeout=HANG_GUARD_S)
            reader.join(timeout=HANG_GUARD_S)
            err = "".join(errors)
        finally:  # the runtime's login does not end on EOF: never leave it (or this test) waiting
            with contextlib.suppress(psutil.Error):
                for process in [*psutil.Process(login.pid).children(recursive=True), psutil.Process(login.pid)]:
                    process.kill()
    assert login.returncode == 1 and "the login exited with code" in err
    assert "opens no browser" in err and "claude auth login" in err
    assert not opened.exists(), "a browser was opened"
    home = data / "namespaces" / "user.alice" / "home"
    assert (home / ".claude.json").exists()  # the runtime's state went to the namespace's HOME ...
    assert not any((tmp_path / "operator-home").iterdir())  # ... not the operator's
