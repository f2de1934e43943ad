"""The test kit's pytest plugin, as a user's own test suite meets it: loaded by the entry point, its fixtures and
its marker working in a separate pytest run."""

from __future__ import annotations

import sys

import pytest

from codesdk.testing import loopback_only

from tests.worker.harness import REPO

USER_TESTS = '''
import pytest
import trio

from codesdk.protocol import EventType


async def test_with_trio(open_test_worker, worker_home, worker_workspace):
    async with open_test_worker() as worker:
        task = await worker.start_task("from a user's suite", scenario="echo", workspace=worker_workspace)
        events = await task.until_terminal()
    assert events[-1].event.type == EventType.TASK_COMPLETED
    assert (worker_home / ".config").is_dir()


def test_without_trio(run_test_worker):
    with run_test_worker(extra_env={"MY_VARIABLE": "1"}) as worker:
        assert worker.start_task(scenario="echo").until_terminal()[-1].event.type == EventType.TASK_COMPLETED


@pytest.mark.loopback_only
def test_that_must_not_reach_the_network():
    pass
'''


def test_the_plugin_s_fixtures_and_marker_in_a_user_s_suite(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_user=USER_TESTS)
    pytester.makeini("[pytest]\ntrio_mode = true\n")
    result = pytester.runpytest_subprocess("-rs", "-p", "no:cacheprovider")
    if loopback_only():
        result.assert_outcomes(passed=3)
    else:
        result.assert_outcomes(passed=2, skipped=1)
        result.stdout.fnmatch_lines(["*needs a loopback-only network namespace*"])


def test_the_marker_is_declared(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess("--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.loopback_only*"])


def test_a_worker_command_given_with_a_relative_script_runs_from_where_pytest_started(
        pytester: pytest.Pytester) -> None:
    """``--worker-command "python my_worker.py"``: the script next to the user's tests, as the conformance suite
    reads the same command (the worker used to run in the scratch HOME, where no my_worker.py is)."""
    pytester.makepyfile(test_user='''
from codesdk.protocol import EventType


def test_their_worker(run_test_worker):
    with run_test_worker() as worker:
        assert worker.info.worker.name != "codesdk-worker"
        assert worker.start_task(scenario="echo").until_terminal()[-1].event.type == EventType.TASK_COMPLETED
''')
    pytester.makeini("[pytest]\ntrio_mode = true\n")
    (pytester.path / "my_worker.py").write_text((REPO / "tests" / "conformance" / "minimal_worker.py").read_text())
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--worker-command",
                                           f"{sys.executable} my_worker.py")
    result.assert_outcomes(passed=1)
