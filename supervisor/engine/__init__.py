"""The task engine: sessions, tasks, events, tool calls — the invariants of the contract live here.

Layering, lowest first (no module imports one below it in this list): ``_transcript`` (a session's messages),
``_errors`` (refusals and their HTTP answers), ``_telemetry`` (what observers of tasks are told), ``_deadlines`` (a task's deadlines and their watch), ``_ports`` (what the engine needs of workers: the test seam),
``_compile`` (a task's input from the transcript, fitted to the runtime's budget), ``_runs`` (a running task's
state, the run table), ``_recorder`` (a run's appends), ``_batch`` (a worker's batch on its way to the store),
``_audience`` (who can answer approvals and questions; the operator's fallback), ``_approvals``, ``_grants`` (a session's grants, from its events), ``_questions`` (a runtime's questions to its
user), ``_toolport`` / ``_toolflow`` (one tool call, through its port), ``_steering`` (users' inputs into running
tasks), ``_meter`` (a task's budget meter), ``_ending`` (a task's one end), ``_budgets`` (budgets: counting,
pausing, raising), ``_intake`` (events from workers), ``_leasing`` (which namespaces this supervisor runs),
``_lifecycle`` (forks' cuts, default workspaces), ``_requests`` (requests to a worker outside tasks), ``_engine``
(sessions and tasks).
"""

from ..tools import ApprovalRequest, Approver, ApproverAnswer
from ._deadlines import (
    SERVICE_IDLE_TIMEOUT_MAX_S,
    SERVICE_IDLE_TIMEOUT_S,
    SERVICE_TIMEOUT_MAX_S,
    SERVICE_TIMEOUT_S,
    DeadlineLimits,
)
from ._requests import WorkerEnvironment
from ._approvals import DecisionRefused
from ._audience import (
    APPROVAL_KIND,
    QUESTION_KIND,
    SERVICE_UNATTENDED,
    SERVICE_UNATTENDED_WAIT_S,
    Audience,
    Route,
    RoutingPolicy,
    Unattended,
    WebhookSource,
)
from ._grants import GrantAlreadyRevoked, GrantBook, GrantEntry, UnknownGrant, read_grants
from ._engine import DISK_RESERVE_BYTES, Engine, EngineConfig
from ._errors import (
    ERROR_STATUS,
    ApproverRequired,
    BudgetNotPaused,
    BudgetPaused,
    EngineError,
    ErrorStatus,
    ForkInsideTask,
    ForkPastEnd,
    InsufficientSpace,
    NamespaceDiskFull,
    InvalidTaskInput,
    IsolationRefused,
    MonthlyBudgetSpent,
    NamespaceElsewhere,
    NamespaceUnavailable,
    RuntimeUnavailable,
    SessionBusy,
    TaskNotActive,
    UnknownRuntime,
    WorkspaceMissing,
    WorkspaceRefused,
    error_status,
)
from ._ports import PoolWorkers, RequestChannel, WorkerEvents, WorkerExit, WorkerLink, Workers, WorkersFactory
from ._runs import EngineStats
from ._telemetry import Phase, TaskTelemetry, Telemetry
from ._transcript import derive_transcript, session_events
from ._questions import QUESTION_TIMEOUT_S, Answerer, InvalidAnswer, QuestionFallback, QuestionPolicy

__all__ = [
    "DISK_RESERVE_BYTES", "ERROR_STATUS", "ApprovalRequest", "Approver", "ApproverAnswer", "ApproverRequired", "DeadlineLimits",
    "Engine", "WorkerEnvironment", "SERVICE_IDLE_TIMEOUT_MAX_S", "SERVICE_IDLE_TIMEOUT_S", "SERVICE_TIMEOUT_MAX_S", "SERVICE_TIMEOUT_S", "EngineConfig",
    "EngineError", "EngineStats", "Phase", "TaskTelemetry", "Telemetry", "ErrorStatus", "ForkInsideTask", "ForkPastEnd", "InsufficientSpace", "NamespaceDiskFull", "InvalidTaskInput", "IsolationRefused", "NamespaceElsewhere", "NamespaceUnavailable",
    "PoolWorkers", "RequestChannel", "RuntimeUnavailable", "SessionBusy", "TaskNotActive", "UnknownRuntime", "WorkerEvents",
    "WorkerExit", "WorkerLink", "Workers", "WorkersFactory", "WorkspaceMissing", "WorkspaceRefused", "derive_transcript", "error_status",
    "session_events", "QUESTION_TIMEOUT_S", "Answerer", "InvalidAnswer", "QuestionFallback", "QuestionPolicy",
    "APPROVAL_KIND", "QUESTION_KIND", "SERVICE_UNATTENDED", "SERVICE_UNATTENDED_WAIT_S", "Audience", "Route", "RoutingPolicy", "Unattended",
    "WebhookSource",
    "BudgetNotPaused", "BudgetPaused", "MonthlyBudgetSpent", "DecisionRefused", "GrantAlreadyRevoked", "GrantBook", "GrantEntry", "UnknownGrant", "read_grants",
]
