"""Normalized events: the envelope every stored/streamed event has, and one payload model per type.

The supervisor assigns ``seq`` (per session, gap-free) when it stores an event. Workers send the same
``type``/``payload`` shapes without ``seq`` or ``trace`` inside ``runtime.event`` (see ``WorkerEvent``).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import Field, SerializeAsAny, field_validator, model_validator

from ._base import Model
from ._runtime import InteractionMode, PermissionMode
from ._tools import ExecutedBy, ToolCallIdentity
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
    }
)


# --- payloads -------------------------------------------------------------------------------------


class SessionCreated(Model):
    contract_version: str = CONTRACT_VERSION
    runtime: str
    namespace: str
    workspace: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class TaskStarted(Model):
    task_id: str
    prompt_preview: str = ""
    permission_mode: PermissionMode = PermissionMode.ASK
    interaction_mode: InteractionMode = InteractionMode.NON_INTERACTIVE
    runtime_config: dict[str, Any] = Field(default_factory=dict)
    worker_pid: int | None = None


class ModelInput(Model):
    """The compiled input handed to the runtime; the full body lives in the blob store."""

    input_ref: str
    input_hash: str
    message_count: int = Field(ge=0)
    tool_names: tuple[str, ...] = ()
    implicit_sources_ref: str | None = None  # blob: what the runtime would load implicitly, and what we did


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


class ApprovalRequested(ToolCallIdentity):
    """A human is being asked about this call now: stored before anyone is asked, answered once (by
    ``approval_id``) or expired at ``expires_at`` (then denied). The decision follows as a ``user`` (or
    ``codesdk``) evaluation and the call's one approved/denied event."""

    approval_id: str
    tool_name: str
    tool_class: str
    reason: str
    expires_at: datetime
    input_preview: str = ""  # the call's input, clipped; the whole input is on tool.call.requested


class ToolCallApproved(ToolCallIdentity):
    source: PolicySource
    reason: str = ""
    policy_snapshot: dict[str, Any] = Field(default_factory=dict)


class ToolCallDenied(ToolCallIdentity):
    source: PolicySource
    reason: str
    policy_snapshot: dict[str, Any] = Field(default_factory=dict)


class SandboxSummary(Model):
    kind: str = "none"  # none | workspace | subprocess
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
    duration_ms: float | None = None
    replayed: bool = False  # answered from the store without running again


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
    INTERNAL = "INTERNAL"


class TaskFailed(Model):
    code: str  # a TaskFailureCode, or a runtime-specific code
    message: str
    retryable: bool = False
    details: dict[str, Any] = Field(default_factory=dict)


class TaskStopped(Model):
    reason: str = "stop requested"
    requested_by: str | None = None


PAYLOAD_MODELS: dict[EventType, type[Model]] = {
    EventType.SESSION_CREATED: SessionCreated,
    EventType.TASK_STARTED: TaskStarted,
    EventType.MODEL_INPUT: ModelInput,
    EventType.RUNTIME_REQUEST_STARTED: RuntimeRequestStarted,
    EventType.RUNTIME_REQUEST_COMPLETED: RuntimeRequestCompleted,
    EventType.MODEL_OUTPUT_DELTA: ModelOutputDelta,
    EventType.MODEL_OUTPUT_COMPLETED: ModelOutputCompleted,
    EventType.TOOL_CALL_REQUESTED: ToolCallRequested,
    EventType.TOOL_CALL_POLICY_EVALUATED: ToolCallPolicyEvaluated,
    EventType.APPROVAL_REQUESTED: ApprovalRequested,
    EventType.TOOL_CALL_APPROVED: ToolCallApproved,
    EventType.TOOL_CALL_DENIED: ToolCallDenied,
    EventType.TOOL_CALL_STARTED: ToolCallStarted,
    EventType.TOOL_OUTPUT_DELTA: ToolOutputDelta,
    EventType.TOOL_OUTPUT_COMPLETED: ToolOutputCompleted,
    EventType.TOOL_CALL_COMPLETED: ToolCallCompleted,
    EventType.USAGE_REPORTED: UsageReported,
    EventType.TASK_COMPLETED: TaskCompleted,
    EventType.TASK_FAILED: TaskFailed,
    EventType.TASK_STOPPED: TaskStopped,
}


def parse_payload(event_type: EventType | str, payload: Any) -> Model:
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


def _validate_payload_by_type(data: Any) -> Any:
    if isinstance(data, dict) and "type" in data:
        data = dict(data)
        data["payload"] = parse_payload(data["type"], data.get("payload", {}))
    return data


def _require_utc(value: datetime) -> datetime:
    if value.tzinfo is None:
        raise ValueError("time must carry a timezone (UTC)")
    try:
        return value.astimezone(UTC)
    except OverflowError:  # e.g. 0001-01-01T00:00:00+14:00: pydantic would not turn this into a ValidationError
        raise ValueError("time is out of range once normalized to UTC") from None


class WorkerEvent(Model):
    """An event as a worker reports it: no seq, no trace (the supervisor adds both)."""

    type: EventType
    time: datetime = Field(default_factory=utc_now)
    runtime: RuntimeInfo
    payload: SerializeAsAny[Model]
    #: The runtime's own message(s) behind this event, verbatim. The supervisor moves it into the blob
    #: store and stores only ``runtime.raw_ref``; stored events never carry raw payloads inline.
    raw: Any = None

    _by_type = model_validator(mode="before")(_validate_payload_by_type)
    _utc = field_validator("time")(_require_utc)

    @field_validator("type")
    @classmethod
    def _worker_may_send(cls, value: EventType) -> EventType:
        if value not in WORKER_EVENT_TYPES:
            raise ValueError(f"{value} is emitted by the supervisor, not by a worker")
        return value


class NormalizedEvent(Model):
    """A stored event: the unit apps read, page and subscribe to."""

    schema_version: int = SCHEMA_VERSION
    seq: int = Field(ge=1)
    time: datetime
    type: EventType
    trace: Trace
    runtime: RuntimeInfo
    payload: SerializeAsAny[Model]

    _by_type = model_validator(mode="before")(_validate_payload_by_type)
    _utc = field_validator("time")(_require_utc)

    @property
    def is_terminal(self) -> bool:
        return self.type in TERMINAL_EVENT_TYPES


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
