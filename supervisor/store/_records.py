"""Values going into and coming out of the store: drafts, session/task records, task updates."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import Field

from codesdk.protocol import (
    PAYLOAD_MODELS,
    ApprovalState,
    EventType,
    ForkPoint,
    IsolationLevel,
    Model,
    RuntimeInfo,
    SessionBudget,
    Trace,
    WorkerEvent,
)
from codesdk.protocol.api import TERMINAL_STATES as TERMINAL_STATES
from codesdk.protocol.api import TaskState as TaskState


#: Allowed state changes. A terminal state is final: the task has exactly one end.
TRANSITIONS: Mapping[TaskState, frozenset[TaskState]] = {
    TaskState.PENDING: frozenset({TaskState.RUNNING, *TERMINAL_STATES}),
    TaskState.RUNNING: TERMINAL_STATES,
    TaskState.COMPLETED: frozenset(),
    TaskState.FAILED: frozenset(),
    TaskState.STOPPED: frozenset(),
}


@dataclass(frozen=True, slots=True)
class PayloadJson:
    """A payload a decoder has already validated against its event type's model, as the JSON that model gives
    (``to_json(payload, exclude_none=True)``, byte for byte): stored as it is, without building the model, which
    ``model()`` builds only for whoever asks. Only the supervisor's own decoder makes these."""

    type: EventType
    json: bytes

    def model(self) -> Model:
        return PAYLOAD_MODELS[self.type].model_validate_json(self.json)


@dataclass(frozen=True, slots=True)
class EventDraft:
    """An event before the store gives it a ``seq``.

    ``payload`` may be the payload model or a plain dict; it is validated against ``type`` by ``append``
    before anything is written. ``trace`` defaults to ``Trace(session_id=<the append's session>)``;
    ``time`` defaults to the moment ``append`` is called.
    """

    type: EventType | str
    runtime: RuntimeInfo
    payload: Model | PayloadJson | Mapping[str, Any] = field(default_factory=dict)
    trace: Trace | None = None
    time: datetime | None = None

    @classmethod
    def from_worker_event(cls, event: WorkerEvent, trace: Trace) -> EventDraft:
        """The draft for a ``runtime.event`` a worker sent (the supervisor supplies the trace)."""
        return cls(type=event.type, runtime=event.runtime, payload=event.payload, trace=trace, time=event.time)


@dataclass(frozen=True, slots=True)
class RequestClaim:
    """What the store says of an API request's idempotency key (``EventStore.claim_request``)."""

    #: "claimed": this request is the key's first and runs (``token`` finishes or releases it); "answered": the
    #: key's first request was answered (``status``, ``answer``); "mismatch": the key was used for another request;
    #: "running": the key's first request is still being answered.
    outcome: str
    token: str = ""
    status: int = 0
    answer: str = ""


@dataclass(frozen=True, slots=True)
class TaskUpdate:
    """Changes to the task ``task_id``. ``None`` leaves a field as it is.

    Entering a terminal state sets ``ended_at`` (now, unless given) and ``terminal_type`` (the matching
    ``task.*`` event type, unless given); entering RUNNING sets ``started_at``.
    """

    task_id: str
    state: TaskState | None = None
    worker_pid: int | None = None
    terminal_type: str | None = None
    error: Mapping[str, Any] | None = None
    ended_at: datetime | None = None
    metadata: Mapping[str, Any] | None = None


class SessionRecord(Model):
    session_id: str
    runtime: str
    namespace: str
    workspace: str | None = None
    created_at: datetime
    metadata: dict[str, Any] = Field(default_factory=dict)
    runtime_session_id: str | None = None
    last_seq: int = Field(default=0, ge=0)
    title: str | None = None
    archived_at: datetime | None = None
    forked_from: ForkPoint | None = None
    #: Where its runtime's HOME is: the namespace's (namespaced), one of its own (ephemeral), the operator's (shared).
    isolation: IsolationLevel = IsolationLevel.NAMESPACED
    #: Its task pending or running (read with the row; None when idle).
    active_task_id: str | None = None
    #: Its budget: limits, what it spent, whether it is paused (None: it never had one nor spent anything).
    budget: SessionBudget | None = None


class TaskRecord(Model):
    task_id: str
    session_id: str
    state: TaskState
    runtime: str
    created_at: datetime
    started_at: datetime | None = None
    ended_at: datetime | None = None
    worker_pid: int | None = None
    terminal_type: str | None = None
    error: dict[str, Any] | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class ApprovalRecord(Model):
    """A tool call waiting for (or decided by) a human. Pending ones survive a restart of the supervisor."""

    approval_id: str
    session_id: str
    task_id: str
    namespace: str
    tool_call_id: str
    attempt: int
    tool_name: str
    tool_class: str
    input: dict[str, Any] = Field(default_factory=dict)
    reason: str
    state: ApprovalState
    created_at: datetime
    expires_at: datetime
    decided_at: datetime | None = None
    decided_by: str | None = None
    decision_reason: str | None = None


class BlobInfo(Model):
    ref: str
    size: int = Field(ge=0)
    media_type: str
    created_at: datetime | None = None
