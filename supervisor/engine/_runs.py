"""In-memory state of one task while it runs: its worker, its event ordinal, its tool calls, its end."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import trio

from protocol import ModelInput, RuntimeInfo, StartTaskParams, ToolCallIdentity, Trace

from ..store import SessionRecord
from ..workers import WorkerProcess


@dataclass
class TaskRun:
    task_id: str
    session: SessionRecord
    params: StartTaskParams
    trace: Trace
    runtime: RuntimeInfo
    approver: Any = None
    worker: WorkerProcess | None = None
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
    model_input: ModelInput | None = None  # stored once the worker accepted the task
    input_stored: trio.Event = field(default_factory=trio.Event)
    done: trio.Event = field(default_factory=trio.Event)  # the task's terminal event is stored
    # The worker is finished with the task too (its own terminal arrived, or it exited, or it never had it).
    # A stopped task can keep running in the worker for its stop grace; the session's next task waits.
    released: trio.Event = field(default_factory=trio.Event)

    @property
    def session_id(self) -> str:
        return self.session.session_id

    @property
    def namespace(self) -> str:
        return self.session.namespace
