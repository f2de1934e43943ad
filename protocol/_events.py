"""Normalized events: the envelope every stored/streamed event has, and one payload model per type.

The supervisor assigns ``seq`` (per session, gap-free) when it stores an event. Workers send the same
``type``/``payload`` shapes without ``seq`` or ``trace`` inside ``runtime.event`` (see ``WorkerEvent``).

Events are typed by ``type``: each type has its own envelope class (``ModelOutputDeltaEvent``,
``ModelOutputDeltaWorkerEvent`` …) whose ``payload`` is that type's model, and ``AnyEvent`` /
``AnyWorkerEvent`` are their unions, discriminated by ``type`` (narrow with ``event.type == EventType.X``,
``match`` or ``isinstance``). ``NormalizedEvent`` and ``WorkerEvent`` are the bases: constructing, validating
or ``model_construct``-ing one of them yields the class of its ``type``, and a field annotated with a base
validates as the discriminated union — pydantic-core picks the class by the tag, no Python per event.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any, Literal, Self, TypeAlias, TypeVar, cast, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    PlainSerializer,
    SerializeAsAny,
    TypeAdapter,
    field_validator,
)
from pydantic_core import CoreSchema, core_schema

from ._base import Model
from ._budgets import BudgetRaised, BudgetReached
from ._canonical import is_hash
from ._context import ContextReport, InterruptedCall, ResumeMode
from ._questions import QuestionAnswered, QuestionEscalated, QuestionRequested
from ._grants import GrantCreated, GrantRevoked
from ._receipt import StopReceipt
from ._runtime import InteractionMode, IsolationLevel, PermissionMode
from ._steering import ModelInputAppended
from ._tools import ExecutedBy, ToolCallIdentity, ToolClass
from ._versions import CONTRACT_VERSION, SCHEMA_VERSION


class EventType(StrEnum):
    SESSION_CREATED = "session.created"
    TASK_STARTED = "task.started"
    MODEL_INPUT = "model.input"
    RUNTIME_REQUEST_STARTED = "runtime.request.started"
    RUNTIME_REQUEST_COMPLETED = "runtime.request.completed"
    MODEL_OUTPUT_DELTA = "model.output.delta"
    MODEL_OUTPUT_COMPLETED = "model.output.completed"
    TOOL_CALL_REQUESTED = "tool.call.requested"
    TOOL_CALL_POLICY_EVALUATED = "tool.call.policy_evaluated"
    APPROVAL_REQUESTED = "approval.requested"
    TOOL_CALL_APPROVED = "tool.call.approved"
    TOOL_CALL_DENIED = "tool.call.denied"
    TOOL_CALL_STARTED = "tool.call.started"
    TOOL_OUTPUT_DELTA = "tool.output.delta"
    TOOL_OUTPUT_COMPLETED = "tool.output.completed"
    TOOL_CALL_COMPLETED = "tool.call.completed"
    USAGE_REPORTED = "usage.reported"
    TASK_COMPLETED = "task.completed"
    TASK_FAILED = "task.failed"
    TASK_STOPPED = "task.stopped"
    MODEL_INPUT_APPENDED = "model.input.appended"
    QUESTION_REQUESTED = "question.requested"
    QUESTION_ANSWERED = "question.answered"
    BUDGET_REACHED = "budget.reached"
    BUDGET_RAISED = "budget.raised"
    GRANT_CREATED = "grant.created"
    GRANT_REVOKED = "grant.revoked"
    APPROVAL_ESCALATED = "approval.escalated"
    QUESTION_ESCALATED = "question.escalated"


TERMINAL_EVENT_TYPES = frozenset({EventType.TASK_COMPLETED, EventType.TASK_FAILED, EventType.TASK_STOPPED})

#: Types a worker may send in ``runtime.event``. The rest are the supervisor's to emit.
WORKER_EVENT_TYPES = frozenset(
    {
        EventType.RUNTIME_REQUEST_STARTED,
        EventType.RUNTIME_REQUEST_COMPLETED,
        EventType.MODEL_OUTPUT_DELTA,
        EventType.MODEL_OUTPUT_COMPLETED,
        EventType.TOOL_CALL_REQUESTED,
        EventType.TOOL_CALL_POLICY_EVALUATED,
        EventType.TOOL_CALL_STARTED,
        EventType.TOOL_OUTPUT_DELTA,
        EventType.TOOL_OUTPUT_COMPLETED,
        EventType.TOOL_CALL_COMPLETED,
        EventType.USAGE_REPORTED,
        EventType.TASK_COMPLETED,
        EventType.TASK_FAILED,
        EventType.TASK_STOPPED,
        EventType.MODEL_INPUT_APPENDED,
        EventType.QUESTION_REQUESTED,  # the runtime's question: the supervisor records it and asks
    }
)


# --- payloads -------------------------------------------------------------------------------------


class ForkPoint(Model):
    """Where a forked session came from: its events up to ``seq`` are copies of that session's."""

    session_id: str
    seq: int = Field(ge=1)


class SessionCreated(Model):
    contract_version: str = CONTRACT_VERSION
    runtime: str
    namespace: str
    workspace: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    title: str | None = None
    #: A fork's origin: the events after this one, up to ``forked_from.seq``, are copied from that session.
    forked_from: ForkPoint | None = None


class TaskStarted(Model):
    task_id: str
    prompt_preview: str = ""
    permission_mode: PermissionMode = PermissionMode.ASK
    interaction_mode: InteractionMode = InteractionMode.NON_INTERACTIVE
    runtime_config: dict[str, Any] = Field(default_factory=dict)
    worker_pid: int | None = None
    #: The task's deadlines in seconds (None: none): wall clock from its start, and the longest the runtime may
    #: stay silent (time the supervisor holds one of its tool calls does not count). Stored so that a supervisor
    #: started again can tell a task that had passed its deadline.
    timeout_s: float | None = None
    idle_timeout_s: float | None = None


class ModelInput(Model):
    """The compiled input handed to the runtime; the full body lives in the blob store."""

    input_ref: str
    input_hash: str
    message_count: int = Field(ge=0)
    tool_names: tuple[str, ...] = ()
    implicit_sources_ref: str | None = None  # blob: what the runtime would load implicitly, and what we did
    #: How the runtime got the session's earlier turns (None: stored before CodeSDK recorded it).
    resume: ResumeMode | None = None
    #: sha256 of exactly what the runtime was sent: the prompt (native, new) or the reconstruction (reconstructed).
    sent_hash: str | None = None
    #: The runtime the session ran on before this task moved it (a runtime switch, by reconstruction).
    switched_from: str | None = None
    #: Tool calls of the transcript that never finished, answered as interrupted in what was compiled.
    interrupted_calls: tuple[InterruptedCall, ...] = ()
    #: The context budget: what was left out of the compiled transcript to fit it, with sizes.
    context: ContextReport | None = None
    #: The whole transcript (blob) when ``context`` left part of it out: the next task compiles from it.
    transcript_ref: str | None = None
    #: Where the runtime ran: its namespace's HOME, one of the session's own (ephemeral), or the operator's (shared)
    #: (None: stored before CodeSDK recorded it).
    isolation: IsolationLevel | None = None
    #: Inputs the session's previous task could not deliver (``model.input.appended`` ``queued``), opening this
    #: task's prompt: their ``input_id``s, in order.
    carried_inputs: tuple[str, ...] = ()


class RuntimeRequestStarted(Model):
    request_id: str
    model: str | None = None


class RuntimeRequestCompleted(Model):
    request_id: str
    stop_reason: str | None = None
    duration_ms: float | None = None


class BlockKind(StrEnum):
    TEXT = "text"
    CODE = "code"
    THINKING = "thinking"


class ModelOutputDelta(Model):
    """A piece of one output block. All deltas of a block share ``block_id``; ``index`` counts from 0."""

    block_id: str
    kind: BlockKind = BlockKind.TEXT
    delta: str
    index: int = Field(default=0, ge=0)
    language: str | None = None


class ModelOutputCompleted(Model):
    """One finished output block: the concatenation of its deltas."""

    block_id: str
    kind: BlockKind = BlockKind.TEXT
    text: str
    language: str | None = None


class ToolCallRequested(ToolCallIdentity):
    tool_name: str
    input: dict[str, Any] | None = None  # absent when the input is large; then input_ref
    input_ref: str | None = None
    executed_by: ExecutedBy = ExecutedBy.SUPERVISOR


class PolicySource(StrEnum):
    RUNTIME = "runtime"
    CODESDK = "codesdk"
    USER = "user"


class PolicyDecision(StrEnum):
    ALLOW = "allow"
    DENY = "deny"
    ASK = "ask"
    ABSTAIN = "abstain"


class ToolCallPolicyEvaluated(ToolCallIdentity):
    source: PolicySource
    decision: PolicyDecision
    reason: str = ""
    rule: str | None = None
    policy_snapshot: dict[str, Any] = Field(default_factory=dict)
    approval_id: str | None = None  # the answered approval, on a ``user`` evaluation
    #: The grant that decided (a ``user`` evaluation with rule ``grant.<scope>``), or the grant this answer created.
    grant_id: str | None = None
    #: The approver edited the call's input before allowing it: the hash of the input the call runs with (this
    #: event's ``input_hash`` is the original's; the call's later events carry this one), and that input (inline
    #: when small, else ``edited_input_ref``, a blob).
    edited_input_hash: str | None = None
    edited_input: dict[str, Any] | None = None
    edited_input_ref: str | None = None


class ApprovalState(StrEnum):
    """Where one ``approval.requested`` stands: pending until decided once (approved / denied) or expired."""

    PENDING = "pending"
    APPROVED = "approved"
    DENIED = "denied"
    EXPIRED = "expired"


class ApprovalRequested(ToolCallIdentity):
    """A human is being asked about this call now: stored before anyone is asked, answered once (by
    ``approval_id``) or expired at ``expires_at`` (then denied). The decision follows as a ``user`` (or
    ``codesdk``) evaluation and the call's one approved/denied event."""

    approval_id: str
    tool_name: str
    tool_class: ToolClass
    reason: str
    expires_at: datetime
    input_preview: str = ""  # the call's input, clipped; the whole input is on tool.call.requested


class ApprovalEscalated(Model):
    """An approval still pending ``pending_s`` after it was asked (``serve --escalate-after``): recorded once,
    between its ``approval.requested`` and its decision, so that a second target (a webhook subscribed to
    ``approval.escalated``) is told. It changes nothing about the approval: it still expires at ``expires_at``."""

    approval_id: str
    tool_call_id: str
    tool_name: str
    pending_s: float = Field(ge=0, le=1e9, allow_inf_nan=False)  # finite: JSON has no infinity
    expires_at: datetime


class ToolCallApproved(ToolCallIdentity):
    source: PolicySource
    reason: str = ""
    policy_snapshot: dict[str, Any] = Field(default_factory=dict)


class ToolCallDenied(ToolCallIdentity):
    source: PolicySource
    reason: str
    policy_snapshot: dict[str, Any] = Field(default_factory=dict)


class SandboxKind(StrEnum):
    """How a tool call was confined."""

    NONE = "none"  # not at all (a pure supervisor tool, or a runtime's own)
    WORKSPACE = "workspace"  # paths confined to the session workspace, in the supervisor
    SUBPROCESS = "subprocess"  # a sandboxed child process (workspace.exec)


class SandboxSummary(Model):
    kind: SandboxKind = SandboxKind.NONE
    network: bool = False
    time_limit_s: float | None = None
    memory_limit_mb: int | None = None
    workspace: str | None = None


class ToolCallStarted(ToolCallIdentity):
    tool_name: str
    executed_by: ExecutedBy = ExecutedBy.SUPERVISOR
    execution_env: str = "supervisor"
    sandbox: SandboxSummary = Field(default_factory=SandboxSummary)


class ToolOutputDelta(ToolCallIdentity):
    stream: Literal["stdout", "stderr"] = "stdout"
    delta: str


class ToolOutputCompleted(ToolCallIdentity):
    stdout_bytes: int = Field(default=0, ge=0)
    stderr_bytes: int = Field(default=0, ge=0)


class CallCutShort(StrEnum):
    """How a call that had started was ended by its task's end rather than by finishing (``is_error`` is true)."""

    CANCELLED = "cancelled"  # the task was stopped: the call's run was cut short with it
    INTERRUPTED = "interrupted"  # the task ended otherwise (the runtime failed or ended, the supervisor went away)
    WORKER_GONE = "worker_gone"  # the worker running the task died


class ToolCallCompleted(ToolCallIdentity):
    tool_name: str
    is_error: bool = False
    executed_by: ExecutedBy = ExecutedBy.SUPERVISOR
    execution_env: str = "supervisor"
    policy_snapshot: dict[str, Any] = Field(default_factory=dict)
    sandbox: SandboxSummary = Field(default_factory=SandboxSummary)
    result_ref: str | None = None
    result_preview: str = ""
    result_hash: str | None = None
    #: A blob the supervisor's tool stored besides its result (``http.fetch``'s response body), which the session's
    #: readers may download; the result names it too. Never a runtime's to set.
    output_ref: str | None = None
    duration_ms: float | None = None
    replayed: bool = False  # answered from the store without running again
    #: Set when the supervisor ended the call because its task ended first (the call's own result never came).
    cut_short: CallCutShort | None = None


class UsageReported(Model):
    model: str | None = None
    input_tokens: int = Field(default=0, ge=0)
    output_tokens: int = Field(default=0, ge=0)
    cache_read_tokens: int = Field(default=0, ge=0)
    cache_write_tokens: int = Field(default=0, ge=0)
    reasoning_tokens: int = Field(default=0, ge=0)
    cost_usd: float | None = Field(default=None, ge=0)


class TaskCompleted(Model):
    stop_reason: str = "end_turn"
    result_preview: str = ""


class TaskFailureCode(StrEnum):
    """``task.failed`` codes. The first group is CodeSDK's own; the second is what runtimes report, named once
    here so adapters and apps share the spelling. A runtime may still send a code of its own (a plain string)."""

    WORKER_CRASHED = "WORKER_CRASHED"
    WORKER_UNAVAILABLE = "WORKER_UNAVAILABLE"
    RUNTIME_ERROR = "RUNTIME_ERROR"
    RUNTIME_CRASHED = "RUNTIME_CRASHED"  # the runtime's own process died under the task (retryable)
    RUNTIME_UNAVAILABLE = "RUNTIME_UNAVAILABLE"
    AUTH_REQUIRED = "AUTH_REQUIRED"
    PROTOCOL_ERROR = "PROTOCOL_ERROR"
    TIMEOUT = "TIMEOUT"
    SUPERVISOR_RESTARTED = "SUPERVISOR_RESTARTED"
    QUOTA_EXCEEDED = "QUOTA_EXCEEDED"  # the session or namespace reached a stored-data quota (details name it)
    #: the task passed its deadline (``timeout_s`` or ``idle_timeout_s``, details name which): stopped, with the
    #: stop's receipt in ``details.receipt``; not retryable as it was
    TASK_TIMEOUT = "TASK_TIMEOUT"
    INTERNAL = "INTERNAL"
    # reported by runtimes (the model API's answer, or the scripted runtime's scenario)
    INVALID_SCENARIO = "INVALID_SCENARIO"  # scripted runtime: the scenario is missing or malformed
    INVALID_RUNTIME_CONFIG = "INVALID_RUNTIME_CONFIG"  # the runtime refused the task's runtime_config (caller's)
    UNSAFE_WORKSPACE = "UNSAFE_WORKSPACE"  # the workspace holds configuration the runtime would obey (caller's)
    INVALID_REQUEST = "INVALID_REQUEST"  # the model API refused the request as malformed (HTTP 400)
    CONTEXT_TOO_LARGE = "CONTEXT_TOO_LARGE"  # the request exceeds the model's context (HTTP 413)
    RATE_LIMITED = "RATE_LIMITED"  # HTTP 429 (retryable)
    OVERLOADED = "OVERLOADED"  # HTTP 529 (retryable)
    API_ERROR = "API_ERROR"  # the model API failed (HTTP 5xx, retryable)
    API_UNREACHABLE = "API_UNREACHABLE"  # no connection to the model API's base URL (retryable; message names it)


_FAILURE_CODES = frozenset(TaskFailureCode)


class TaskFailed(Model):
    #: The TaskFailureCode member when the code is one of them, else the runtime's own code as it sent it.
    code: TaskFailureCode | str
    message: str
    retryable: bool = False
    details: dict[str, Any] = Field(default_factory=dict)

    @field_validator("code", mode="before")
    @classmethod
    def _known_code(cls, value: object) -> object:
        # a smart union would keep "RATE_LIMITED" a str: the member is the typed value. (Not ``union_mode=
        # "left_to_right"``: hypothesis' ``builds`` cannot generate from that metadata.)
        return TaskFailureCode(value) if isinstance(value, str) and value in _FAILURE_CODES else value


class TaskStopped(Model):
    reason: str = "stop requested"
    requested_by: str | None = None
    #: What the stop did and verified (``StopReceipt``); None for a stop nobody waited on (supervisor shutdown).
    receipt: StopReceipt | None = None


def parse_payload(event_type: EventType | str, payload: object) -> Model:
    """Validate a payload against its type's model (pydantic ValidationError on mismatch)."""
    model = PAYLOAD_MODELS[EventType(event_type)]
    if isinstance(payload, model):
        return payload
    if isinstance(payload, Model):
        payload = payload.model_dump(mode="json")
    return model.model_validate(payload)


# --- envelope -------------------------------------------------------------------------------------


def utc_now() -> datetime:
    return datetime.now(UTC)


class Trace(Model):
    session_id: str
    task_id: str | None = None
    request_id: str | None = None
    client_id: str | None = None
    user_id: str | None = None


class RuntimeInfo(Model):
    name: str
    model: str | None = None
    runtime_session_id: str | None = None
    raw_ref: str | None = None


def _require_utc(value: datetime) -> datetime:
    if value.tzinfo is None:
        raise ValueError("time must carry a timezone (UTC)")
    try:
        return value.astimezone(UTC)
    except OverflowError:  # e.g. 0001-01-01T00:00:00+14:00: pydantic would not turn this into a ValidationError
        raise ValueError("time is out of range once normalized to UTC") from None


class _TypedByTag(Model):
    """Base of an envelope family (NormalizedEvent, WorkerEvent): an instance's class is the one for its ``type``.

    Each subclass names its ``type`` as a ``Literal`` and its ``payload`` model. The family's base validates as
    the union of its subclasses discriminated by ``type``, and ``Base(...)`` / ``Base.model_construct(...)``
    build the subclass, so an event object has its precise class however it was made (a validated wire line, a
    stored row, a constructor call, the store's trusted fast path).
    """

    # Built on first use: a base's schema is the union of subclasses that do not exist yet when it is created.
    model_config = ConfigDict(defer_build=True)

    @classmethod
    def _narrow(cls, event_type: object) -> type[Self]:
        family = _FAMILIES.get(cls)
        if family is None or not isinstance(event_type, str):
            return cls
        return cast(type[Self], family[0].get(event_type, cls))

    def __init__(self, /, **data: Any) -> None:
        narrowed = type(self)._narrow(data.get("type"))
        if narrowed is not type(self):
            # Base(type=X, ...) becomes X's class before it is validated (the classes share one layout), so it is
            # validated by X's schema. Done here, not in __new__: pydantic-core calls a class's __new__ for every
            # instance it validates, and this hook is for Python callers only. An unknown or supervisor-only type
            # keeps the base, whose validator then refuses it.
            object.__setattr__(self, "__class__", narrowed)
        super().__init__(**data)

    # What pydantic's RootModel does too: not a "custom init" that validation of these classes would call.
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

    @classmethod
    def model_construct(cls, _fields_set: set[str] | None = None, **values: Any) -> Self:  # type: ignore[override]
        narrowed = cls._narrow(values.get("type"))
        if narrowed is not cls:
            return cast(Self, narrowed.model_construct(_fields_set, **values))
        return cast(Self, super().model_construct(_fields_set, **values))

    @classmethod
    def __get_pydantic_core_schema__(cls, source: type[BaseModel], handler: GetCoreSchemaHandler, /) -> CoreSchema:
        family = _FAMILIES.get(source)
        return handler(source) if family is None else handler.generate_schema(family[1])


#: Each envelope family's base -> (its classes by type, its discriminated union); filled in below the classes.
_FAMILIES: dict[type[BaseModel], tuple[Mapping[str, type[_TypedByTag]], object]] = {}


class WorkerEvent(_TypedByTag):
    """An event as a worker reports it: no seq, no trace (the supervisor adds both).

    ``WorkerEvent(type=..., ...)`` builds the class of that type (``ModelOutputDeltaWorkerEvent`` …); the types
    only the supervisor emits are refused."""

    type: EventType
    time: datetime = Field(default_factory=utc_now)
    runtime: RuntimeInfo
    payload: SerializeAsAny[Model]
    #: The runtime's own message(s) behind this event, verbatim. The supervisor moves it into the blob
    #: store and stores only ``runtime.raw_ref``; stored events never carry raw payloads inline.
    raw: Any = None

    _utc = field_validator("time")(_require_utc)


class NormalizedEvent(_TypedByTag):
    """A stored event: the unit apps read, page and subscribe to.

    ``NormalizedEvent(type=..., ...)`` and ``NormalizedEvent.model_validate(...)`` give the class of that type
    (``ToolCallRequestedEvent`` …)."""

    schema_version: int = SCHEMA_VERSION
    seq: int = Field(ge=1)
    time: datetime
    type: EventType
    trace: Trace
    runtime: RuntimeInfo
    payload: SerializeAsAny[Model]

    _utc = field_validator("time")(_require_utc)

    @property
    def is_terminal(self) -> bool:
        return self.type in TERMINAL_EVENT_TYPES


# --- one envelope class per type ------------------------------------------------------------------
# (written out, not generated: the checker sees each type's payload)

_T = TypeVar("_T")
#: An envelope's ``type``: a Literal of one EventType for validation and the checker, written out as its text
#: (pydantic-core serializes a Literal enum member several times slower than it calls ``str`` on it).
_Tag: TypeAlias = Annotated[_T, PlainSerializer(str, return_type=str, when_used="json")]


class SessionCreatedEvent(NormalizedEvent):
    type: _Tag[Literal[EventType.SESSION_CREATED]] = EventType.SESSION_CREATED
    payload: SessionCreated


class TaskStartedEvent(NormalizedEvent):
    type: _Tag[Literal[EventType.TASK_STARTED]] = EventType.TASK_STARTED
    payload: TaskStarted


class ModelInputEvent(NormalizedEvent):
    type: _Tag[Literal[EventType.MODEL_INPUT]] = EventType.MODEL_INPUT
    payload: ModelInput


class RuntimeRequestStartedEvent(NormalizedEvent):
    type: _Tag[Literal[EventType.RUNTIME_REQUEST_STARTED]] = EventType.RUNTIME_REQUEST_STARTED
    payload: RuntimeRequestStarted


class RuntimeRequestCompletedEvent(NormalizedEvent):
    type: _Tag[Literal[EventType.RUNTIME_REQUEST_COMPLETED]] = EventType.RUNTIME_REQUEST_COMPLETED
    payload: RuntimeRequestCompleted


class ModelOutputDeltaEvent(NormalizedEvent):
    type: _Tag[Literal[EventType.MODEL_OUTPUT_DELTA]] = EventType.MODEL_OUTPUT_DELTA
    payload: ModelOutputDelta


class ModelOutputCompletedEvent(NormalizedEvent):
    type: _Tag[Literal[EventType.MODEL_OUTPUT_COMPLETED]] = EventType.MODEL_OUTPUT_COMPLETED
    payload: ModelOutputCompleted


class ToolCallRequestedEvent(NormalizedEvent):
    type: _Tag[Literal[EventType.TOOL_CALL_REQUESTED]] = EventType.TOOL_CALL_REQUESTED
    payload: ToolCallRequested


class ToolCallPolicyEvaluatedEvent(NormalizedEvent):
    type: _Tag[Literal[EventType.TOOL_CALL_POLICY_EVALUATED]] = EventType.TOOL_CALL_POLICY_EVALUATED
    payload: ToolCallPolicyEvaluated


class ApprovalRequestedEvent(NormalizedEvent):
    type: _Tag[Literal[EventType.APPROVAL_REQUESTED]] = EventType.APPROVAL_REQUESTED
    payload: ApprovalRequested


class ToolCallApprovedEvent(NormalizedEvent):
    type: _Tag[Literal[EventType.TOOL_CALL_APPROVED]] = EventType.TOOL_CALL_APPROVED
    payload: ToolCallApproved


class ToolCallDeniedEvent(NormalizedEvent):
    type: _Tag[Literal[EventType.TOOL_CALL_DENIED]] = EventType.TOOL_CALL_DENIED
    payload: ToolCallDenied


class ToolCallStartedEvent(NormalizedEvent):
    type: _Tag[Literal[EventType.TOOL_CALL_STARTED]] = EventType.TOOL_CALL_STARTED
    payload: ToolCallStarted


class ToolOutputDeltaEvent(NormalizedEvent):
    type: _Tag[Literal[EventType.TOOL_OUTPUT_DELTA]] = EventType.TOOL_OUTPUT_DELTA
    payload: ToolOutputDelta


class ToolOutputCompletedEvent(NormalizedEvent):
    type: _Tag[Literal[EventType.TOOL_OUTPUT_COMPLETED]] = EventType.TOOL_OUTPUT_COMPLETED
    payload: ToolOutputCompleted


class ToolCallCompletedEvent(NormalizedEvent):
    type: _Tag[Literal[EventType.TOOL_CALL_COMPLETED]] = EventType.TOOL_CALL_COMPLETED
    payload: ToolCallCompleted


class UsageReportedEvent(NormalizedEvent):
    type: _Tag[Literal[EventType.USAGE_REPORTED]] = EventType.USAGE_REPORTED
    payload: UsageReported = Field(default_factory=UsageReported)


class TaskCompletedEvent(NormalizedEvent):
    type: _Tag[Literal[EventType.TASK_COMPLETED]] = EventType.TASK_COMPLETED
    payload: TaskCompleted = Field(default_factory=TaskCompleted)


class TaskFailedEvent(NormalizedEvent):
    type: _Tag[Literal[EventType.TASK_FAILED]] = EventType.TASK_FAILED
    payload: TaskFailed


class TaskStoppedEvent(NormalizedEvent):
    type: _Tag[Literal[EventType.TASK_STOPPED]] = EventType.TASK_STOPPED
    payload: TaskStopped = Field(default_factory=TaskStopped)


class ModelInputAppendedEvent(NormalizedEvent):
    type: _Tag[Literal[EventType.MODEL_INPUT_APPENDED]] = EventType.MODEL_INPUT_APPENDED
    payload: ModelInputAppended


class QuestionRequestedEvent(NormalizedEvent):
    type: _Tag[Literal[EventType.QUESTION_REQUESTED]] = EventType.QUESTION_REQUESTED
    payload: QuestionRequested


class QuestionAnsweredEvent(NormalizedEvent):
    type: _Tag[Literal[EventType.QUESTION_ANSWERED]] = EventType.QUESTION_ANSWERED
    payload: QuestionAnswered


class ApprovalEscalatedEvent(NormalizedEvent):
    type: _Tag[Literal[EventType.APPROVAL_ESCALATED]] = EventType.APPROVAL_ESCALATED
    payload: ApprovalEscalated


class QuestionEscalatedEvent(NormalizedEvent):
    type: _Tag[Literal[EventType.QUESTION_ESCALATED]] = EventType.QUESTION_ESCALATED
    payload: QuestionEscalated


class QuestionRequestedWorkerEvent(WorkerEvent):
    type: _Tag[Literal[EventType.QUESTION_REQUESTED]] = EventType.QUESTION_REQUESTED
    payload: QuestionRequested


class BudgetReachedEvent(NormalizedEvent):
    type: _Tag[Literal[EventType.BUDGET_REACHED]] = EventType.BUDGET_REACHED
    payload: BudgetReached


class BudgetRaisedEvent(NormalizedEvent):
    type: _Tag[Literal[EventType.BUDGET_RAISED]] = EventType.BUDGET_RAISED
    payload: BudgetRaised
class GrantCreatedEvent(NormalizedEvent):
    type: _Tag[Literal[EventType.GRANT_CREATED]] = EventType.GRANT_CREATED
    payload: GrantCreated


class GrantRevokedEvent(NormalizedEvent):
    type: _Tag[Literal[EventType.GRANT_REVOKED]] = EventType.GRANT_REVOKED
    payload: GrantRevoked


class RuntimeRequestStartedWorkerEvent(WorkerEvent):
    type: _Tag[Literal[EventType.RUNTIME_REQUEST_STARTED]] = EventType.RUNTIME_REQUEST_STARTED
    payload: RuntimeRequestStarted


class RuntimeRequestCompletedWorkerEvent(WorkerEvent):
    type: _Tag[Literal[EventType.RUNTIME_REQUEST_COMPLETED]] = EventType.RUNTIME_REQUEST_COMPLETED
    payload: RuntimeRequestCompleted


class ModelOutputDeltaWorkerEvent(WorkerEvent):
    type: _Tag[Literal[EventType.MODEL_OUTPUT_DELTA]] = EventType.MODEL_OUTPUT_DELTA
    payload: ModelOutputDelta


class ModelOutputCompletedWorkerEvent(WorkerEvent):
    type: _Tag[Literal[EventType.MODEL_OUTPUT_COMPLETED]] = EventType.MODEL_OUTPUT_COMPLETED
    payload: ModelOutputCompleted


class ToolCallRequestedWorkerEvent(WorkerEvent):
    type: _Tag[Literal[EventType.TOOL_CALL_REQUESTED]] = EventType.TOOL_CALL_REQUESTED
    payload: ToolCallRequested


class ToolCallPolicyEvaluatedWorkerEvent(WorkerEvent):
    type: _Tag[Literal[EventType.TOOL_CALL_POLICY_EVALUATED]] = EventType.TOOL_CALL_POLICY_EVALUATED
    payload: ToolCallPolicyEvaluated


class ToolCallStartedWorkerEvent(WorkerEvent):
    type: _Tag[Literal[EventType.TOOL_CALL_STARTED]] = EventType.TOOL_CALL_STARTED
    payload: ToolCallStarted


class ToolOutputDeltaWorkerEvent(WorkerEvent):
    type: _Tag[Literal[EventType.TOOL_OUTPUT_DELTA]] = EventType.TOOL_OUTPUT_DELTA
    payload: ToolOutputDelta


class ToolOutputCompletedWorkerEvent(WorkerEvent):
    type: _Tag[Literal[EventType.TOOL_OUTPUT_COMPLETED]] = EventType.TOOL_OUTPUT_COMPLETED
    payload: ToolOutputCompleted


class ToolCallCompletedWorkerEvent(WorkerEvent):
    type: _Tag[Literal[EventType.TOOL_CALL_COMPLETED]] = EventType.TOOL_CALL_COMPLETED
    payload: ToolCallCompleted


class UsageReportedWorkerEvent(WorkerEvent):
    type: _Tag[Literal[EventType.USAGE_REPORTED]] = EventType.USAGE_REPORTED
    payload: UsageReported = Field(default_factory=UsageReported)


class TaskCompletedWorkerEvent(WorkerEvent):
    type: _Tag[Literal[EventType.TASK_COMPLETED]] = EventType.TASK_COMPLETED
    payload: TaskCompleted = Field(default_factory=TaskCompleted)


class TaskFailedWorkerEvent(WorkerEvent):
    type: _Tag[Literal[EventType.TASK_FAILED]] = EventType.TASK_FAILED
    payload: TaskFailed


class TaskStoppedWorkerEvent(WorkerEvent):
    type: _Tag[Literal[EventType.TASK_STOPPED]] = EventType.TASK_STOPPED
    payload: TaskStopped = Field(default_factory=TaskStopped)


class ModelInputAppendedWorkerEvent(WorkerEvent):
    type: _Tag[Literal[EventType.MODEL_INPUT_APPENDED]] = EventType.MODEL_INPUT_APPENDED
    payload: ModelInputAppended


EventUnion: TypeAlias = (
    SessionCreatedEvent | TaskStartedEvent | ModelInputEvent | RuntimeRequestStartedEvent
    | RuntimeRequestCompletedEvent | ModelOutputDeltaEvent | ModelOutputCompletedEvent | ToolCallRequestedEvent
    | ToolCallPolicyEvaluatedEvent | ApprovalRequestedEvent | ToolCallApprovedEvent | ToolCallDeniedEvent
    | ToolCallStartedEvent | ToolOutputDeltaEvent | ToolOutputCompletedEvent | ToolCallCompletedEvent
    | UsageReportedEvent | TaskCompletedEvent | TaskFailedEvent | TaskStoppedEvent
    | ModelInputAppendedEvent
    | QuestionRequestedEvent | QuestionAnsweredEvent
    | BudgetReachedEvent | BudgetRaisedEvent
    | GrantCreatedEvent | GrantRevokedEvent
    | ApprovalEscalatedEvent | QuestionEscalatedEvent
)
WorkerEventUnion: TypeAlias = (
    RuntimeRequestStartedWorkerEvent | RuntimeRequestCompletedWorkerEvent | ModelOutputDeltaWorkerEvent
    | ModelOutputCompletedWorkerEvent | ToolCallRequestedWorkerEvent | ToolCallPolicyEvaluatedWorkerEvent
    | ToolCallStartedWorkerEvent | ToolOutputDeltaWorkerEvent | ToolOutputCompletedWorkerEvent
    | ToolCallCompletedWorkerEvent | UsageReportedWorkerEvent | TaskCompletedWorkerEvent | TaskFailedWorkerEvent
    | TaskStoppedWorkerEvent | ModelInputAppendedWorkerEvent | QuestionRequestedWorkerEvent
)

@dataclass(frozen=True, slots=True)
class _ByType:
    """Validates a union of envelope classes as a union tagged by ``type``: one lookup in pydantic-core picks
    the class (``Discriminator("type")`` would do the same but drops a custom error)."""

    error_type: str | None = None
    error_message: str | None = None

    def __get_pydantic_core_schema__(self, source: object, handler: GetCoreSchemaHandler) -> CoreSchema:
        choices: dict[Hashable, CoreSchema] = {
            cls.model_fields["type"].default.value: handler.generate_schema(cls) for cls in get_args(source)}
        return core_schema.tagged_union_schema(choices, "type", custom_error_type=self.error_type,
                                               custom_error_message=self.error_message)


#: A stored event, typed by ``type`` (annotate fields with it; validation picks the class by the tag).
AnyEvent: TypeAlias = Annotated[EventUnion, _ByType()]
#: A ``runtime.event``'s event, typed by ``type``; a supervisor-only type is refused.
AnyWorkerEvent: TypeAlias = Annotated[WorkerEventUnion, _ByType(
    "worker_event_type",
    "type must be an event type a worker may send (runtime.request.*, model.output.*, tool.call.requested, "
    "tool.call.policy_evaluated, tool.call.started|completed, tool.output.*, usage.reported, "
    "task.completed|failed|stopped, model.input.appended, question.requested); the others are emitted by the "
    "supervisor, not by a worker")]


#: The envelope class of each type (a subclass's ``type`` defaults to its tag).
EVENT_MODELS: Mapping[EventType, type[NormalizedEvent]] = {
    cls.model_fields["type"].default: cls for cls in get_args(EventUnion)}
WORKER_EVENT_MODELS: Mapping[EventType, type[WorkerEvent]] = {
    cls.model_fields["type"].default: cls for cls in get_args(WorkerEventUnion)}
assert set(EVENT_MODELS) == set(EventType) and set(WORKER_EVENT_MODELS) == WORKER_EVENT_TYPES
#: The payload model of each type, as its envelope class declares it.
PAYLOAD_MODELS: Mapping[EventType, type[Model]] = {
    event_type: cast(type[Model], cls.model_fields["payload"].annotation) for event_type, cls in EVENT_MODELS.items()}
assert all(isinstance(model, type) and issubclass(model, Model) for model in PAYLOAD_MODELS.values())
_FAMILIES.update({
    NormalizedEvent: ({t.value: cls for t, cls in EVENT_MODELS.items()}, AnyEvent),
    WorkerEvent: ({t.value: cls for t, cls in WORKER_EVENT_MODELS.items()}, AnyWorkerEvent),
})

# Built on first use, like the models (``Model``'s ``defer_build``): a worker never parses stored events.
_ANY_EVENT: TypeAdapter[EventUnion] = TypeAdapter(AnyEvent, config=ConfigDict(defer_build=True))
_ANY_WORKER_EVENT: TypeAdapter[WorkerEventUnion] = TypeAdapter(AnyWorkerEvent, config=ConfigDict(defer_build=True))


def parse_event(obj: object) -> EventUnion:
    """A stored event from its JSON-compatible form, as the class of its type (ValidationError if invalid)."""
    return _ANY_EVENT.validate_python(obj)


def parse_event_json(data: str | bytes) -> EventUnion:
    """A stored event from JSON text, validated in pydantic-core (not a strict decoder: trusted input only)."""
    return _ANY_EVENT.validate_json(data)


def parse_worker_event(obj: object) -> WorkerEventUnion:
    """A worker's event from its JSON-compatible form, as the class of its type (ValidationError if invalid)."""
    return _ANY_WORKER_EVENT.validate_python(obj)


def named_blobs(event: NormalizedEvent) -> tuple[str, ...]:
    """The blobs an event names, in the contract's own ref fields: the payload's ``*_ref`` fields,
    ``runtime.raw_ref`` and a failure's ``details.stderr_tail_ref``. These are set by the supervisor alone, so they
    are what the event's session may read back (``GET /v1/sessions/{id}/blobs/{ref}``, its support bundle). A ref
    inside a free-form value (a tool's input, a policy snapshot) is not followed: whoever wrote it could name any
    blob."""
    payload = event.payload
    refs = [getattr(payload, name) for name in type(payload).model_fields if name.endswith("_ref")]
    refs.append(event.runtime.raw_ref)
    if isinstance(payload, TaskFailed):
        refs.append(payload.details.get("stderr_tail_ref"))
    return tuple(dict.fromkeys(ref for ref in refs if isinstance(ref, str) and is_hash(ref)))


# --- upcasting old schema versions ----------------------------------------------------------------

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]


class UpcasterRegistry:
    """Turns stored event dicts of older schema versions into the current shape, one version at a time.

    Register ``from_version -> function`` that returns the dict at ``from_version + 1``.
    """

    def __init__(self, current: int = SCHEMA_VERSION) -> None:
        self.current = current
        self._steps: dict[int, Upcaster] = {}

    def register(self, from_version: int) -> Callable[[Upcaster], Upcaster]:
        if from_version >= self.current:
            raise ValueError(f"upcaster from {from_version} is not older than current {self.current}")

        def decorate(function: Upcaster) -> Upcaster:
            self._steps[from_version] = function
            return function

        return decorate

    def upcast(self, raw: dict[str, Any]) -> dict[str, Any]:
        version = int(raw.get("schema_version", 1))
        if version > self.current:
            raise ValueError(
                f"event has schema_version {version}, newer than this build knows ({self.current}); upgrade codesdk"
            )
        while version < self.current:
            step = self._steps.get(version)
            if step is None:
                raise ValueError(f"no upcaster registered from schema_version {version}")
            raw = step(dict(raw))
            version += 1
            raw["schema_version"] = version
        return raw

    def load(self, raw: dict[str, Any]) -> NormalizedEvent:
        return NormalizedEvent.model_validate(self.upcast(raw))


#: The registry the store uses to read old rows.
upcasters = UpcasterRegistry()
