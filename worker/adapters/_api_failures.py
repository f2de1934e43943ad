"""What a model API's failure means for a task, the same for every runtime that reports one: its HTTP status, or no
connection at all; and the base URL named in the message (never a key)."""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

from codesdk.protocol import TaskFailureCode

#: HTTP status of the failing API call -> (task.failed code, retryable). A 404 is the caller's: a wrong base URL or
#: a model the API does not serve; retrying cannot help.
API_FAILURES: dict[int, tuple[TaskFailureCode, bool]] = {
    400: (TaskFailureCode.INVALID_REQUEST, False), 401: (TaskFailureCode.AUTH_REQUIRED, False),
    403: (TaskFailureCode.AUTH_REQUIRED, False), 404: (TaskFailureCode.INVALID_REQUEST, False),
    413: (TaskFailureCode.CONTEXT_TOO_LARGE, False),
    429: (TaskFailureCode.RATE_LIMITED, True), 500: (TaskFailureCode.API_ERROR, True),
    502: (TaskFailureCode.API_ERROR, True), 503: (TaskFailureCode.API_ERROR, True),
    504: (TaskFailureCode.API_ERROR, True), 529: (TaskFailureCode.OVERLOADED, True),
}

#: How runtimes say they could not reach the model API at all (Node's fetch, Rust's reqwest, Codex's stream).
UNREACHABLE = re.compile(
    r"fetch failed|ECONNREFUSED|ECONNRESET|ENOTFOUND|EAI_AGAIN|ETIMEDOUT|EHOSTUNREACH|connection refused|"
    r"unable to connect|cannot connect|could not connect|failed to connect|error sending request|"
    r"connection (?:error|failed|closed)|waiting for network|network error|dns error", re.IGNORECASE)


def failure_for_status(status: int | None) -> tuple[TaskFailureCode, bool]:
    """(code, retryable) for an API status; an unknown or missing one is a non-retryable RUNTIME_ERROR."""
    return API_FAILURES.get(status or 0, (TaskFailureCode.RUNTIME_ERROR, False))


def is_unreachable(text: str) -> bool:
    """Whether a runtime's error text says the model API could not be reached (no HTTP answer at all)."""
    return UNREACHABLE.search(text) is not None


def shown_url(url: str | None) -> str | None:
    """A base URL fit for a message: without user, password, query or fragment (where keys may hide)."""
    if not url:
        return None
    try:
        parts = urlsplit(url.strip())
        host = parts.hostname or ""
        netloc = f"[{host}]" if ":" in host else host
        if parts.port:
            netloc += f":{parts.port}"
    except ValueError:
        return None
    if not parts.scheme or not host:
        return None
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def api_failure(status: int | None, unreachable: bool, base_url: str | None) -> tuple[TaskFailureCode, bool, str]:
    """(code, retryable, what to add to the message) for a failed model API call: unreachable (retryable: the
    caller may try again once it is up), else by HTTP status; the message's addition names the base URL."""
    url = shown_url(base_url)
    if status is None and unreachable:
        where = f" at {url}" if url else ""
        return (TaskFailureCode.API_UNREACHABLE, True,
                f" — could not connect to the model API{where}: check the base URL and that it is reachable")
    code, retryable = failure_for_status(status)
    if status is not None and url:
        hint = " (a wrong base URL or model?)" if status == 404 else ""
        return code, retryable, f" — the model API at {url} answered HTTP {status}{hint}"
    return code, retryable, ""
