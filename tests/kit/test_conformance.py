"""The conformance suite (codesdk.testing.conformance), run as a user runs it: against CodeSDK's own worker, which
passes every check, through the command line, which reports a table and an exit code."""

from __future__ import annotations

import subprocess
import sys

import trio

from codesdk.testing.conformance import CHECKS, run_conformance
from supervisor.workers import worker_argv

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
    assert report.failed() == ["handshake", "stdout-clean"]
    assert "exited with code 3" in report.table()
