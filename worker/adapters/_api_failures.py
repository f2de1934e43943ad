"""What a model API's HTTP status means for a task, the same for every runtime that reports one."""

from __future__ import annotations

from codesdk.protocol import TaskFailureCode

#: HTTP status of the failing API call -> (task.failed code, retryable)
API_FAILURES: dict[int, tuple[TaskFailureCode, bool]] = {
    400: (TaskFailureCode.INVALID_REQUEST, False), 401: (TaskFailureCode.AUTH_REQUIRED, False),
    403: (TaskFailureCode.AUTH_REQUIRED, False), 413: (TaskFailureCode.CONTEXT_TOO_LARGE, False),
    429: (TaskFailureCode.RATE_LIMITED, True), 500: (TaskFailureCode.API_ERROR, True),
    502: (TaskFailureCode.API_ERROR, True), 503: (TaskFailureCode.API_ERROR, True),
    504: (TaskFailureCode.API_ERROR, True), 529: (TaskFailureCode.OVERLOADED, True),
}


def failure_for_status(status: int | None) -> tuple[TaskFailureCode, bool]:
    """(code, retryable) for an API status; an unknown or missing one is a non-retryable RUNTIME_ERROR."""
    return API_FAILURES.get(status or 0, (TaskFailureCode.RUNTIME_ERROR, False))
