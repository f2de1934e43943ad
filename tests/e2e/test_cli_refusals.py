"""``codesdk`` answers a refusal with one line and an exit code by whose move it is: the command's (2) or the
service's state (69: try again later, or the operator acts)."""

from __future__ import annotations

from pathlib import Path

import pytest

from codesdk.client import ApiError
from codesdk.supervisor.cli.local import refusal_exit_code
from codesdk.supervisor.cli.common import EXIT_UNAVAILABLE, EXIT_USAGE, CliError, api_exit_code
from codesdk.supervisor.engine import (
    ApproverRequired,
    InvalidTaskInput,
    NamespaceUnavailable,
    RuntimeUnavailable,
    SessionBusy,
    UnknownRuntime,
    WorkspaceRefused,
)
from codesdk.supervisor.namespaces import InvalidNamespace
from codesdk.supervisor.store import QuotaExceeded, UnknownSession
from codesdk.supervisor.store import SessionBusy as StoredSessionBusy

from tests.e2e.test_cli import _run


@pytest.mark.parametrize(("error", "code"), [
    (CliError("x"), EXIT_USAGE),
    (WorkspaceRefused("x"), EXIT_USAGE),
    (UnknownRuntime("x"), EXIT_USAGE),
    (InvalidTaskInput("x"), EXIT_USAGE),
    (ApproverRequired("x"), EXIT_USAGE),
    (InvalidNamespace("x"), EXIT_USAGE),
    (UnknownSession("ses_1"), EXIT_USAGE),
    (NamespaceUnavailable("x"), EXIT_UNAVAILABLE),
    (RuntimeUnavailable("x"), EXIT_UNAVAILABLE),
    (SessionBusy("ses_1", "task_1"), EXIT_UNAVAILABLE),
    (StoredSessionBusy("ses_1", "task_1", "running"), EXIT_UNAVAILABLE),
    (QuotaExceeded("namespace_tasks", 1, 1, 1, "ses_1", "default", starting=True), EXIT_UNAVAILABLE),
    (ApiError(409, "workspace_refused", "x"), EXIT_USAGE),
    (ApiError(409, "session_busy", "x"), EXIT_UNAVAILABLE),
    (ApiError(429, "too_many_tasks", "x"), EXIT_UNAVAILABLE),
    (ApiError(503, "namespace_failing", "x"), EXIT_UNAVAILABLE),
])
def test_each_refusal_exits_by_whose_move_it_is(error: Exception, code: int) -> None:
    assert refusal_exit_code(error) == code


def test_api_statuses_map_like_the_refusals_behind_them() -> None:
    assert api_exit_code(422, "invalid_request") == EXIT_USAGE
    assert api_exit_code(404, "unknown_runtime") == EXIT_USAGE
    assert api_exit_code(503, "runtime_unavailable") == EXIT_UNAVAILABLE


def test_a_refused_workspace_and_an_unknown_runtime_are_one_line_and_exit_2(tmp_path: Path) -> None:
    refused = _run(tmp_path, "run", "x", "--workspace", "/")
    assert refused.returncode == EXIT_USAGE and "root of the file system" in refused.stderr
    unknown = _run(tmp_path, "auth", "--runtime", "nope")
    assert unknown.returncode == EXIT_USAGE and "no runtime 'nope' in namespace 'default'; it can run: claude, " in unknown.stderr
    for done in (refused, unknown):
        assert "Traceback" not in done.stderr and done.stderr.startswith("codesdk: ")


@pytest.mark.parametrize("args", [("sessions", "--limit", "0"), ("sessions", "--limit", "x"),
                                  ("events", "ses_1", "--after", "-3")])
def test_a_bad_page_is_a_usage_error_not_a_traceback(tmp_path: Path, args: tuple[str, ...]) -> None:
    done = _run(tmp_path, *args)
    assert done.returncode == EXIT_USAGE
    assert "Traceback" not in done.stderr and "expected a whole number" in done.stderr


def test_namespaces_through_url_never_reads_the_local_data_dir(tmp_path: Path) -> None:
    """Through --url it asks the service (GET /v1/namespaces); a service not there is said, not a local listing."""
    done = _run(tmp_path, "--url", f"unix:{tmp_path / 'api.sock'}", "--token", "x", "namespaces")
    assert done.returncode == EXIT_UNAVAILABLE
    assert "cannot reach the CodeSDK service" in done.stderr and done.stdout == ""
