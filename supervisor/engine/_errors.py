"""What the engine refuses, typed by whose move it is, and the one table that says how each is answered.

Every refusal is an ``EngineError``: nothing was stored, and the message says what to do instead. Its
subclass names the reason, so the API and the CLI map them by type, never by message text. The caller's
move: ``InvalidTaskInput``, ``WorkspaceRefused``, ``UnknownRuntime``, ``ApproverRequired``, ``IsolationRefused``.
Wait and retry (or stop something): ``SessionBusy``, ``TaskNotActive``. Ask another supervisor:
``NamespaceElsewhere``. The service's side: ``NamespaceUnavailable``, ``RuntimeUnavailable``. Refusals raised below
the engine keep their own types and are listed here too: ``QuotaExceeded`` (an operator's limit), ``InvalidNamespace`` and the store's
unknown session/task.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ..namespaces import InvalidNamespace
from ..store import Fenced, Holder, QuotaExceeded, UnknownSession, UnknownTask
from ..store import SessionBusy as StoredSessionBusy


class EngineError(Exception):
    """A request the engine refuses; the message says what to do instead."""


class TaskNotActive(EngineError):
    """The task has ended (or never ran here): there is nothing to stop."""


class InvalidTaskInput(EngineError):
    """The caller's input for a task cannot be stored (nothing was)."""


class WorkspaceRefused(EngineError):
    """The session's workspace may not be used: it would expose the data dir or the whole file system, or it
    cannot be handed to the namespace's own uid."""


class WorkspaceMissing(WorkspaceRefused):
    """The session's workspace is not on this host: removed, or the session's namespace moved here from another
    supervisor whose files this host does not share. The operator's to fix (shared storage), or the caller's (a new
    session)."""


class NamespaceUnavailable(EngineError):
    """The namespace's worker cannot be started now (start failures, quarantine, shutting down)."""


class NamespaceElsewhere(EngineError):
    """Another supervisor sharing the store runs the namespace (it holds the namespace's lease): the request goes
    to that supervisor, whose API ``holder`` names."""

    def __init__(self, namespace: str, holder: Holder) -> None:
        self.namespace = namespace
        self.holder = holder
        where = ", ".join(holder.api) or "its API (it has not announced where yet: retry in a moment)"
        super().__init__(f"namespace {namespace!r} runs on another supervisor ({holder.supervisor_id}); send this "
                         f"request to {where}")

    def details(self) -> dict[str, Any]:
        return {"namespace": self.namespace, "supervisor": self.holder.to_json_obj()}


class UnknownRuntime(EngineError):
    """The namespace's worker does not host a runtime of that name."""


class RuntimeUnavailable(EngineError):
    """The namespace's worker could not answer for the runtime (it failed the request, or took too long)."""


class InsufficientSpace(EngineError):
    """The service is short of disk space: the file system of its data dir, or of the session's workspace, has less
    free than the reserve a task needs (``EngineConfig.disk_reserve_bytes``). The operator's to fix: free space."""


class NamespaceDiskFull(EngineError):
    """The namespace's own disk quota is full, so not even a new session's workspace fits. The tenant's to fix:
    delete files from its workspaces (or ask the operator for a larger quota)."""


class IsolationRefused(EngineError):
    """The session's isolation level may not be used here: ``shared`` (the operator's own HOME) is for a
    single-user service only. The caller's to change: another level, or the operator's setup."""


class ApproverRequired(EngineError):
    """An interactive task needs someone to ask: an approver, or approvals decided over the API."""


class SessionBusy(EngineError, StoredSessionBusy):
    """The session already has an active task. Also the store's ``SessionBusy``: the same refusal, whether the
    engine saw the running task or the store's transaction did."""

    def __init__(self, session_id: str, active_task_id: str, *, then: str = "wait for it to end or stop it first",
                 ) -> None:
        self.session_id = session_id
        self.active_task_id = active_task_id
        Exception.__init__(self, f"session {session_id} already has an active task ({active_task_id}); {then}")


class ForkInsideTask(EngineError):
    """A fork's cut falls inside a task: its events are copied whole or not at all."""

    def __init__(self, session_id: str, at_seq: int, task_id: str, started_seq: int, ended_seq: int | None) -> None:
        self.session_id = session_id
        self.at_seq = at_seq
        self.task_id = task_id
        self.started_seq = started_seq
        self.ended_seq = ended_seq
        after = f" or at {ended_seq}, where it ended" if ended_seq is not None else " (it is still running)"
        super().__init__(f"seq {at_seq} of session {session_id} falls inside task {task_id} (its events begin at "
                         f"seq {started_seq}): fork at {started_seq - 1}, before it{after}")

    def details(self) -> dict[str, Any]:
        return {"task_id": self.task_id, "started_seq": self.started_seq, "ended_seq": self.ended_seq,
                "fork_before": self.started_seq - 1}


class ForkPastEnd(EngineError):
    """A fork's cut lies past the session's newest event."""


class BudgetPaused(EngineError):
    """The session is paused at its budget: a new task starts only once the budget is raised."""

    def __init__(self, session_id: str, detail: str) -> None:
        self.session_id = session_id
        super().__init__(f"session {session_id} is paused at its budget ({detail}); raise it first "
                         f"(POST /v1/sessions/{session_id}/budget/raise, or `codesdk budget {session_id} --raise`)")


class BudgetNotPaused(EngineError):
    """A raise of a budget that is not paused: there is nothing to raise (change its limits instead)."""


class MonthlyBudgetSpent(EngineError):
    """The namespace spent its monthly budget (the operator's): no new task until the month ends or it is raised."""

    def __init__(self, namespace: str, spent_usd: float, limit_usd: float, resets_at: str) -> None:
        self.namespace, self.spent_usd, self.limit_usd, self.resets_at = namespace, spent_usd, limit_usd, resets_at
        super().__init__(f"namespace {namespace!r} spent ${spent_usd:.4f} of its monthly budget of ${limit_usd:g}; "
                         f"new tasks are refused until it resets at {resets_at} (UTC), or the operator raises it "
                         f"(`codesdk-supervisor namespace budget {namespace} --monthly-usd N`)")

    def details(self) -> dict[str, Any]:
        return {"namespace": self.namespace, "spent_usd": self.spent_usd, "limit_usd": self.limit_usd,
                "resets_at": self.resets_at}


class ErrorStatus(NamedTuple):
    """How the HTTP API answers a refusal."""

    status: int
    code: str
    #: Seconds for a ``Retry-After`` header: the refusal passes by itself soon (None: no header).
    retry_after_s: int | None = None


#: The HTTP answer to each refusal. A class not listed takes its nearest listed base's (``error_status``).
ERROR_STATUS: dict[type[Exception], ErrorStatus] = {
    EngineError: ErrorStatus(409, "conflict"),
    TaskNotActive: ErrorStatus(409, "task_not_active"),
    InvalidTaskInput: ErrorStatus(422, "invalid_request"),
    WorkspaceRefused: ErrorStatus(409, "workspace_refused"),
    WorkspaceMissing: ErrorStatus(409, "workspace_missing"),
    NamespaceUnavailable: ErrorStatus(503, "namespace_failing"),
    NamespaceElsewhere: ErrorStatus(421, "namespace_elsewhere"),
    UnknownRuntime: ErrorStatus(404, "unknown_runtime"),
    RuntimeUnavailable: ErrorStatus(503, "runtime_unavailable"),
    InsufficientSpace: ErrorStatus(503, "insufficient_space"),
    NamespaceDiskFull: ErrorStatus(429, "namespace_disk_full"),  # a quota, like the namespace's others
    ApproverRequired: ErrorStatus(422, "approver_required"),
    IsolationRefused: ErrorStatus(409, "isolation_refused"),
    ForkInsideTask: ErrorStatus(422, "fork_inside_task"),
    ForkPastEnd: ErrorStatus(422, "fork_past_end"),
    BudgetPaused: ErrorStatus(409, "budget_paused"),
    BudgetNotPaused: ErrorStatus(409, "budget_not_paused"),
    MonthlyBudgetSpent: ErrorStatus(402, "monthly_budget_spent"),
    SessionBusy: ErrorStatus(409, "session_busy"),
    StoredSessionBusy: ErrorStatus(409, "session_busy"),
    QuotaExceeded: ErrorStatus(429, "quota_exceeded"),  # answered with the exception's own code
    InvalidNamespace: ErrorStatus(422, "invalid_namespace"),
    UnknownSession: ErrorStatus(404, "session_not_found"),
    UnknownTask: ErrorStatus(404, "task_not_found"),
    # the namespace moved to another supervisor while this one was paused: asked again, it says where it is
    Fenced: ErrorStatus(503, "namespace_moved", retry_after_s=1),
}


def error_status(exc: BaseException) -> ErrorStatus | None:
    """The answer to ``exc`` (its most specific listed class's), or None if it is no refusal: a fault."""
    for cls in type(exc).__mro__:
        found = ERROR_STATUS.get(cls)
        if found is None:
            continue
        if isinstance(exc, QuotaExceeded):  # which quota: the code names it; a full namespace empties soon
            return found._replace(code=exc.code, retry_after_s=1 if exc.code == "too_many_tasks" else None)
        return found
    return None
