"""``codesdk run``'s question flags set the embedded supervisor's policy; through a service they are refused (its
operator sets its own), as ``--env`` and ``--allow-exec`` are, never silently dropped."""

from __future__ import annotations

from pathlib import Path

import pytest

from codesdk.supervisor.cli import front
from codesdk.supervisor.cli.common import EXIT_USAGE, question_policy
from codesdk.supervisor.engine import QuestionFallback

from tests.e2e.test_cli import _run


@pytest.mark.parametrize("flags", [["--question-timeout", "5"], ["--question-fallback", "default"],
                                   ["--question-fallback", "decline"]])
def test_question_flags_through_a_service_are_refused(tmp_path: Path, flags: list[str]) -> None:
    done = _run(tmp_path, "run", "hello", "--url", "unix:/nonexistent/api.sock", *flags)
    assert done.returncode == EXIT_USAGE, done.stderr
    assert f"{flags[0]} cannot be honoured through the API" in done.stderr, done.stderr


def test_the_embedded_policy_declines_by_default() -> None:
    assert question_policy(front.build_parser().parse_args(["run", "x"])).fallback == QuestionFallback.DECLINE
    given = front.build_parser().parse_args(["run", "x", "--question-fallback", "default"])
    assert question_policy(given).fallback == QuestionFallback.DEFAULT
