"""The conformance suite (codesdk.testing.conformance), run as a user runs it: against CodeSDK's own worker, which
passes every check, through the command line, which reports a table and an exit code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import trio

from codesdk.testing.conformance import CHECKS, Verdict, run_conformance
from codesdk.worker.client import worker_argv

#: Seconds each wait of the suite gives a worker here (a hang guard; passing checks take well under one).
TIMEOUT_S = 60.0


async def test_codesdk_s_own_worker_passes_every_check() -> None:
    report = await run_conformance(worker_argv(), timeout_s=TIMEOUT_S)
    assert report.passed, report.table()
    assert [result.check.name for result in report.results] == [check.name for check in CHECKS]


def test_the_command_line_prints_the_table_and_exits_0_when_all_passed() -> None:
    done = subprocess.run([*worker_argv(), "conformance", "--only", "handshake", "stop", "--", *worker_argv()],
                          capture_output=True, text=True, timeout=300, check=False, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "handshake" in done.stdout and "§3.6 §8" in done.stdout and "2 checks: 2 passed, 0 failed" in done.stdout


def test_the_command_line_refuses_bad_usage_with_exit_2() -> None:
    for args, complaint in ((["--"], "give the worker command after --"),
                            (["--", "/no/such/worker"], "'/no/such/worker' is not an executable"),
                            (["--only", "no-such-check", "--", sys.executable], "no such check: no-such-check")):
        done = subprocess.run([sys.executable, "-m", "codesdk.testing.conformance", *args], capture_output=True,
                              text=True, timeout=120, check=False, stdin=subprocess.DEVNULL)
        assert done.returncode == 2 and complaint in done.stderr, (args, done.stderr)


async def test_a_worker_that_is_not_one_fails_every_check_saying_why() -> None:
    with trio.fail_after(300):
        report = await run_conformance([sys.executable, "-c", "import sys; print('hello'); sys.exit(3)"],
                                       timeout_s=5.0, only=["handshake", "stdout-clean"])
    assert report.verdicts() == {"handshake": Verdict.FAIL, "stdout-clean": Verdict.SKIP}, report.table()
    assert "exited with code 3" in report.table() and "1 not run (no handshake" in report.table()


#: A worker written from docs/protocol.md alone, with the standard library: nothing of CodeSDK's worker runs in it.
MINIMAL_WORKER = [sys.executable, str(Path(__file__).resolve().parents[1] / "conformance" / "minimal_worker.py")]


async def test_a_worker_written_from_the_spec_alone_passes_every_check() -> None:
    report = await run_conformance(MINIMAL_WORKER, timeout_s=TIMEOUT_S)
    assert report.passed, report.table()


@pytest.mark.parametrize(("breakage", "failing"), [
    ("logs-on-stdout", ["stdout-clean"]),
    ("events-before-response", ["response-before-events"]),
    ("ordinal-gap", ["event-stream"]),
])
async def test_a_worker_broken_in_one_way_fails_exactly_the_check_for_it(breakage: str, failing: list[str]) -> None:
    report = await run_conformance([*MINIMAL_WORKER, "--break", breakage], timeout_s=TIMEOUT_S)
    assert report.failed() == failing, report.table()
    assert f"FAIL {failing[0]}" in report.table()


async def test_a_worker_that_forgets_terminal_events_fails_saying_so() -> None:
    """Every wait for a terminal event runs out (short waits: nothing would ever arrive), and the table says what
    the task did send."""
    report = await run_conformance([*MINIMAL_WORKER, "--break", "no-terminal-event"], timeout_s=3.0,
                                   only=["event-stream", "stop", "denial"])
    assert report.verdicts() == {"event-stream": Verdict.FAIL, "stop": Verdict.FAIL, "denial": Verdict.ERROR}, \
        report.table()  # a task that never ends breaks how tasks end; it only keeps denial from being judged
    assert "did not end within 3 s" in report.table() and "events of 'task-1' so far" in report.table()
    assert "1 could not be judged" in report.table()


def test_a_relative_worker_command_runs_from_where_the_suite_was_started() -> None:
    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-m", "codesdk.testing.conformance", "--only", "handshake", "--",
                           sys.executable, "tests/conformance/minimal_worker.py"], cwd=repo, capture_output=True,
                          text=True, timeout=300, check=False, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout + done.stderr
