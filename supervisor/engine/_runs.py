"""In-memory state of one task while it runs: its worker, its event ordinal, its tool calls, its end."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import trio

from codesdk.protocol import (
    EventType,
    Model,
    ModelInput,
    RuntimeInfo,
    QuestionReply,
    SendInputParams,
    StartTaskParams,
    ToolCallIdentity,
    Trace,
)

from ..store import PayloadJson, QuestionRecord, SessionRecord
from ..tools import Approver
from ._deadlines import TaskClock
from ._meter import TaskMeter
from ._ports import WorkerLink
from ._stopping import StopInProgress
from ._telemetry import NO_TASK_TELEMETRY, TaskTelemetry

#: Small blobs committed with the events that name them: ref -> (bytes, media type).
Blobs = dict[str, tuple[bytes, str]]


@dataclass(frozen=True, slots=True)
class PendingEvent:
    """An event of a running task on its way to the store. ``runtime``: the run's runtime info as of this
    event when it differs (it names the event's raw message); None: the run's own."""

    type: EventType
    payload: Model | PayloadJson  # PayloadJson: validated by the worker-line decoder, stored as those bytes
    runtime: RuntimeInfo | None = None


@dataclass
class EngineStats:
    """What the engine dropped rather than stored, by reason."""

    late_events: int = 0
    unknown_task_events: int = 0
    ordinal_gaps: int = 0
    duplicate_events: int = 0  # repeated ordinals or tool requests, dropped
    invalid_events: int = 0
    worker_crashes: int = 0


@dataclass
class TaskRun:
    task_id: str
    session: SessionRecord
    params: StartTaskParams
    trace: Trace
    runtime: RuntimeInfo
    approver: Approver | None = None
    #: The request, and the task's own cap on compiled input; compiled into ``params.messages`` once the worker,
    #: and so the runtime's window, is known.
    prompt: str = ""
    max_input_tokens: int | None = None
    #: The session's runtime before this task moves it to ``params.runtime`` (None: no switch).
    switched_from: str | None = None
    #: A stop being carried out (its events are no longer stored; its worker's end is awaited).
    stop: StopInProgress | None = None
    worker: WorkerLink | None = None
    next_n: int = 1
    ended: bool = False  # set (synchronously) before the terminal event is appended
    terminal_type: str | None = None
    late_events: int = 0
    attempts: dict[str, int] = field(default_factory=dict)  # tool_call_id -> attempts seen
    #: (tool_call_id, the runtime's attempt, input_hash) of every request handled: a repeat never runs twice
    requests_seen: set[tuple[str, int, str]] = field(default_factory=set)
    # Runtime-executed calls the policy approved: only these may report tool.call.started/completed.
    approved_runtime_calls: dict[str, ToolCallIdentity] = field(default_factory=dict)
    tools_nursery: trio.Nursery | None = None
    tools_ended: trio.Event = field(default_factory=trio.Event)  # the tools nursery is closed: no call runs
    model_input: ModelInput | None = None  # stored once the worker accepted the task
    input_stored: trio.Event = field(default_factory=trio.Event)
    done: trio.Event = field(default_factory=trio.Event)  # the task's terminal event is stored
    #: Appends of the task's events under way (``RunRecorder``): its end waits for them before it reads which of
    #: its calls are still open.
    appending: int = 0
    appends_settled: trio.lowlevel.ParkingLot = field(default_factory=trio.lowlevel.ParkingLot)
    # The worker is finished with the task too (its own terminal arrived, or it exited, or it never had it).
    # A stopped task can keep running in the worker for its stop grace; the session's next task waits.
    released: trio.Event = field(default_factory=trio.Event)
    #: Its deadlines (``_deadlines``): fed by its events, held while the supervisor holds one of its tool calls.
    clock: TaskClock = field(default_factory=TaskClock)
    #: Its observer (metrics, traces: ``_telemetry``).
    telemetry: TaskTelemetry = NO_TASK_TELEMETRY
    #: Inputs sent to it (``_steering``) whose delivery the worker has not reported yet, in the order sent.
    inputs: dict[str, SendInputParams] = field(default_factory=dict)
    #: Who answers its runtime's questions in-process (a terminal, an embedding app; ``_questions.Answerer``);
    #: None: they are answered over the API. The workers' ids of the questions asked: a repeat is not asked twice.
    answerer: Callable[[QuestionRecord], Awaitable[QuestionReply]] | None = None
    asks_seen: set[str] = field(default_factory=set)
    #: Its budget: limits, what it and its session spent (``_budgets``).
    meter: TaskMeter = field(default_factory=lambda: TaskMeter(task_id=""))

    @property
    def session_id(self) -> str:
        return self.session.session_id

    @property
    def namespace(self) -> str:
        return self.session.namespace


class RunTable:
    """The engine's runs: the active ones, and the last ``keep_recent`` ended ones — so their late events are
    recognised (and counted) rather than "unknown task", and a session's next task can wait for their worker
    to let go of them."""

    def __init__(self, keep_recent: int) -> None:
        self._active: dict[str, TaskRun] = {}
        self._recent: OrderedDict[str, TaskRun] = OrderedDict()
        self._keep_recent = keep_recent

    def add(self, run: TaskRun) -> None:
        self._active[run.task_id] = run

    def discard(self, run: TaskRun) -> None:
        """Forget a run that never started."""
        self._active.pop(run.task_id, None)

    def end(self, run: TaskRun) -> None:
        self._active.pop(run.task_id, None)
        self._recent[run.task_id] = run
        while len(self._recent) > self._keep_recent:
            self._recent.popitem(last=False)

    def active(self, task_id: str) -> TaskRun | None:
        return self._active.get(task_id)

    def find(self, task_id: str) -> TaskRun | None:
        """The run, active or recently ended."""
        return self._active.get(task_id) or self._recent.get(task_id)

    def active_runs(self) -> list[TaskRun]:
        return list(self._active.values())

    def every_run(self) -> list[TaskRun]:
        return [*self._active.values(), *self._recent.values()]

    def active_in(self, session_id: str) -> TaskRun | None:
        return next((r for r in self._active.values() if r.session_id == session_id), None)

    def unreleased_in(self, session_id: str) -> list[TaskRun]:
        """Ended runs of the session that their worker may still be running (a stopped task's grace)."""
        return [r for r in self._recent.values() if r.session_id == session_id and not r.released.is_set()]
