"""Per-tenant limits on what is stored and run: the limits, the rule, and the refusal.

Backend-neutral: a recorder reads the session's ``Usage`` inside the transaction that would add to it and asks
``Quotas`` whether that may go on, so two concurrent writes can never both slip under a limit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ._errors import StoreError


@dataclass(frozen=True, slots=True)
class Usage:
    """What a session and its namespace have stored."""

    namespace: str
    session_events: int
    session_bytes: int
    namespace_events: int
    namespace_bytes: int


@dataclass(frozen=True)
class Quotas:
    """Per-tenant limits on what is stored and run (None: no limit). Set with ``codesdk-supervisor serve`` flags;
    defaults in docs/operations.md. A session's or namespace's usage counts its events and their bytes: event
    bodies, the small blobs committed with them and the blob files they name."""

    session_events: int | None = 2_000_000
    session_bytes: int | None = 2 << 30
    namespace_events: int | None = 20_000_000
    namespace_bytes: int | None = 20 << 30
    #: tasks pending or running at once in one namespace
    namespace_tasks: int | None = 32
    #: sessions in one namespace (each has a workspace directory and a session.created event)
    namespace_sessions: int | None = 100_000

    def __post_init__(self) -> None:
        for name in QUOTA_FLAGS:
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"quota {name} must be >= 1 (or None: no limit), not {value}")

    def check_append(self, usage: Usage, session_id: str, events: int, size: int) -> None:
        """Raise ``QuotaExceeded`` if storing ``events`` events of ``size`` bytes passes a limit."""
        for name, used, adding in (("session_events", usage.session_events, events),
                                   ("session_bytes", usage.session_bytes, size),
                                   ("namespace_events", usage.namespace_events, events),
                                   ("namespace_bytes", usage.namespace_bytes, size)):
            limit = getattr(self, name)
            if limit is not None and used + adding > limit:
                raise QuotaExceeded(name, limit, used, adding, session_id, usage.namespace)

    def check_new_session(self, namespace: str, sessions: int, events: int, stored_bytes: int) -> None:
        """Raise ``QuotaExceeded`` if the namespace may not have another session: it has as many as it may, or is
        at its stored-events or stored-bytes limit (a session's ``session.created``, with its metadata, is stored
        too)."""
        if self.namespace_sessions is not None and sessions >= self.namespace_sessions:
            raise QuotaExceeded("namespace_sessions", self.namespace_sessions, sessions, 1, "", namespace,
                                starting=True)
        for name, used in (("namespace_events", events), ("namespace_bytes", stored_bytes)):
            limit = getattr(self, name)
            if limit is not None and used >= limit:
                raise QuotaExceeded(name, limit, used, 0, "", namespace, starting=True, new_session=True)

    def check_admission(self, usage: Usage, session_id: str, count_active_tasks: Callable[[str], int]) -> None:
        """Raise ``QuotaExceeded`` if a new task may not start in the session: it or its namespace is at a stored-
        data limit, or the namespace runs as many tasks as it may. ``count_active_tasks(namespace)`` is asked only
        when the task limit is set (before the task is inserted, in the same transaction)."""
        for name, used in (("session_events", usage.session_events), ("session_bytes", usage.session_bytes),
                           ("namespace_events", usage.namespace_events), ("namespace_bytes", usage.namespace_bytes)):
            limit = getattr(self, name)
            if limit is not None and used >= limit:
                raise QuotaExceeded(name, limit, used, 0, session_id, usage.namespace, starting=True)
        if self.namespace_tasks is not None:
            running = count_active_tasks(usage.namespace)
            if running >= self.namespace_tasks:
                raise QuotaExceeded("namespace_tasks", self.namespace_tasks, running, 1, session_id, usage.namespace,
                                    starting=True)


#: The ``codesdk-supervisor serve`` flag that sets each quota, and what it counts.
QUOTA_FLAGS: dict[str, tuple[str, str]] = {
    "session_events": ("--max-session-events", "events stored per session"),
    "session_bytes": ("--max-session-bytes", "bytes stored per session"),
    "namespace_events": ("--max-namespace-events", "events stored per namespace"),
    "namespace_bytes": ("--max-namespace-bytes", "bytes stored per namespace"),
    "namespace_tasks": ("--max-tasks-per-namespace", "tasks running at once per namespace"),
    "namespace_sessions": ("--max-sessions-per-namespace", "sessions per namespace"),
}


class QuotaExceeded(StoreError):
    """A session or namespace is at one of its ``Quotas``; nothing was stored. ``code`` is the API's error code."""

    def __init__(self, quota: str, limit: int, used: int, adding: int, session_id: str, namespace: str, *,
                 starting: bool = False, new_session: bool = False) -> None:
        self.quota = quota
        self.limit = limit
        self.used = used
        self.session_id = session_id
        self.namespace = namespace
        flag, what = QUOTA_FLAGS[quota]
        scope, _, unit = quota.partition("_")
        whose = f"session {session_id}" if scope == "session" else f"namespace {namespace!r}"
        if quota == "namespace_sessions":
            self.code = "too_many_sessions"
            situation = f"{whose} already has {used:,} sessions, its limit of {limit:,} {what}"
            advice = "reuse an existing session (or have old ones removed)"
        elif quota == "namespace_tasks":
            self.code = "too_many_tasks"
            situation = f"{whose} already has {used} tasks pending or running, its limit of {limit:,} {what}"
            advice = "wait for one to end (or stop one)"
        else:
            self.code = f"{scope}_quota_exceeded"
            situation = (f"{whose} has {used:,} {unit} stored, at its limit of {limit:,} {what}" if starting else
                         f"{whose} has {used:,} {unit} stored and the task's next {adding:,} would pass its limit of "
                         f"{limit:,} {what}")
            advice = "start a new session" if scope == "session" else "use another namespace"
        self.flag = flag
        verdict = ("no new session may be created" if new_session or quota == "namespace_sessions" else
                   "no new task may start" if starting else "the task was stopped")
        super().__init__(f"{situation}: {verdict}. To go on, {advice}, or have the operator raise the limit "
                         f"(`codesdk-supervisor serve {flag} N`)")

    def details(self) -> dict[str, Any]:
        return {"quota": self.quota, "limit": self.limit, "used": self.used, "flag": self.flag,
                "namespace": self.namespace}
