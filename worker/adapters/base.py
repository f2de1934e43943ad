"""The duplex runtime-adapter interface every runtime (scripted, claude, codex, ACP, ...) implements.

An adapter describes a runtime (capabilities, availability, auth) and opens tasks. A task handle is
duplex: events flow out through ``TaskIO.emit``; tool results, denials and stop flow in through the
handle's methods. The worker, not the adapter, emits the one terminal event from ``run()``'s outcome.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from codesdk.protocol import (
    AuthState,
    AuthStatus,
    EnsureLoginResult,
    ErrorCode,
    GrantScope,
    EventType,
    ExitStatus,
    InputDelivery,
    Model,
    ResumeMode,
    RuntimeCapabilities,
    SendInputParams,
    StartTaskParams,
    TaskCompleted,
    TaskFailed,
    TaskFailureCode,
    TaskStopped,
    runtime_prompt,
    sha256_hex,
)

from .._failure import RpcFailure
from ._questions import QuestionAnswer as QuestionAnswer  # the question half of a handle, re-exported
from ._questions import UnknownQuestion as UnknownQuestion


class StartTaskRefused(RpcFailure):
    """The adapter can't start this task: answered with this JSON-RPC error. Its ``data`` is ``null`` unless
    given (the wire answer since protocol 1.0)."""

    def __init__(self, code: ErrorCode | int, message: str, data: Any = None) -> None:
        super().__init__(code, message, data)


class UnknownToolCall(LookupError):
    """A tool result/denial named a call that isn't waiting for one."""


class RuntimeCrashed(Exception):
    """The runtime's own process died while a task needed it. Raised from ``run()`` (also inside exception
    groups), the worker ends the task with ``task.failed RUNTIME_CRASHED`` (retryable), the exit status, and the
    process's stderr tail (``details.stderr_tail``, which the supervisor moves into a blob)."""

    def __init__(self, runtime: str, pid: int | None, status: ExitStatus, stderr_tail: str = "") -> None:
        self.runtime = runtime
        self.pid = pid
        self.status = status
        self.stderr_tail = stderr_tail
        super().__init__(f"{runtime} (pid {pid}) {status.describe()} while the task was running")

    def outcome(self) -> TaskOutcome:
        details: dict[str, Any] = {"pid": self.pid, **self.status.to_json_obj()}
        if self.stderr_tail:
            details["stderr_tail"] = self.stderr_tail
        return TaskOutcome.failure(TaskFailureCode.RUNTIME_CRASHED, str(self), retryable=True, **details)


class TaskIO(Protocol):
    """What the worker gives a task to talk back with."""

    async def emit(self, event_type: EventType, payload: Model | dict[str, Any], raw: Any = None) -> None:
        """Send one event (backpressured); ``raw`` is the runtime's own message behind it, kept as a blob.
        Raises TaskEnded after the task's terminal event."""

    async def flush(self) -> None:
        """Wait until everything emitted so far has been written to the wire."""

    async def write_raw(self, data: bytes) -> None:
        """Write bytes on the protocol stream as they are (fault injection only)."""

    def set_runtime_session_id(self, runtime_session_id: str) -> None:
        """Record the runtime's own session id; later events carry it."""

    def set_model(self, model: str) -> None:
        """Record the model in use; later events carry it."""


@dataclass(frozen=True)
class TaskOutcome:
    """How ``TaskHandle.run`` ended. Exactly one of completed/failed/stopped."""

    completed: TaskCompleted | None = None
    failed: TaskFailed | None = None
    stopped: TaskStopped | None = None

    @classmethod
    def stop(cls, reason: str) -> TaskOutcome:
        return cls(stopped=TaskStopped(reason=reason, requested_by="supervisor"))

    @classmethod
    def success(cls, stop_reason: str = "end_turn", result_preview: str = "") -> TaskOutcome:
        return cls(completed=TaskCompleted(stop_reason=stop_reason, result_preview=result_preview))

    @classmethod
    def failure(cls, code: TaskFailureCode | str, message: str, retryable: bool = False, **details: Any) -> TaskOutcome:
        return cls(failed=TaskFailed(code=code, message=message, retryable=retryable, details=details))


class TaskHandle(ABC):
    """One running task inside a runtime."""

    @abstractmethod
    async def run(self) -> TaskOutcome:
        """Drive the runtime until it completes or fails. Cancelled by the worker on forced stop."""

    @abstractmethod
    def send_tool_result(self, tool_call_id: str, result: Any, is_error: bool = False) -> None:
        """Deliver a tool result. Raises UnknownToolCall if no such call is pending."""

    @abstractmethod
    def send_tool_denied(self, tool_call_id: str, reason: str) -> None:
        """Deliver a denial. Raises UnknownToolCall if no such call is pending."""

    def send_tool_approved(self, tool_call_id: str, reason: str, scope: GrantScope = GrantScope.ONCE) -> None:
        """Approve a call the runtime executes itself (``executed_by: runtime``); ``scope``: how far the
        approver's answer reaches, for a runtime with a native notion of it. Raises UnknownToolCall."""
        raise UnknownToolCall(f"this runtime has no runtime-executed call {tool_call_id!r} waiting")

    def send_input(self, params: SendInputParams) -> InputDelivery:
        """A user's input while the task runs: taken into the running turn (``MID_TURN``, reported with
        ``model.input.appended`` once the runtime has it) or left for the next turn (``QUEUED``: the supervisor
        carries it into the session's next task). A runtime without steering queues it (the default)."""
        return InputDelivery.QUEUED
    def send_answer(self, question_id: str, answer: QuestionAnswer) -> None:
        """Deliver the answer to one of the runtime's questions (``question.requested``). Raises UnknownQuestion."""
        raise UnknownQuestion(f"this runtime has no question {question_id!r} waiting")

    @abstractmethod
    def stop(self, reason: str | None) -> None:
        """Ask the runtime to stop (cooperative; the worker cancels ``run`` after a grace period)."""

    #: Seconds the worker waits after ``stop`` before cancelling ``run`` by force.
    stop_grace_s: float = 2.0

    #: What the runtime loads on its own and what the adapter did with it (see StartTaskResult).
    implicit_sources: dict[str, Any] | None = None

    #: How the runtime gets the session's earlier turns, and the sha256 of exactly what it is sent (see
    #: ``RuntimeInput``); reported in StartTaskResult and recorded with model.input.
    resume: ResumeMode | None = None
    sent_hash: str | None = None


#: A test's answer to "does the runtime still have this session?" in place of the adapter's own look (a replay
#: answers as its recording says: the runtime's stored sessions are not part of it).
stored_stand_in: ContextVar[Callable[[str], bool | None] | None] = ContextVar("codesdk_stored_stand_in",
                                                                              default=None)


@dataclass(frozen=True)
class RuntimeInput:
    """What a prompt-only runtime (one that keeps its own conversation) is sent for a task, and how: its stored
    session taken up again and the new prompt (``resume_id`` set), or a new session whose first prompt is the
    session's transcript compiled by CodeSDK (``protocol.runtime_prompt``)."""

    mode: ResumeMode
    text: str
    resume_id: str | None

    @classmethod
    def plan(cls, params: StartTaskParams, stored: Callable[[str], bool | None]) -> RuntimeInput:
        """``stored(runtime_session_id)``: whether the runtime still has that session in this namespace (None:
        it cannot be told without asking the runtime, which is then asked to take it up)."""
        session_id = params.session.runtime_session_id
        stored = stored_stand_in.get() or stored
        resumable = bool(session_id) and stored(session_id or "") is not False
        mode, text = runtime_prompt(params.messages, resumable=resumable)
        return cls(mode, text, session_id if mode == ResumeMode.NATIVE else None)

    @classmethod
    def rebuilt(cls, params: StartTaskParams) -> RuntimeInput:
        """The input for a new runtime session: the runtime turned out not to have its own any more."""
        mode, text = runtime_prompt(params.messages, resumable=False)
        return cls(mode, text, None)

    @property
    def sent_hash(self) -> str:
        return sha256_hex(self.text.encode())

    def apply(self, handle: TaskHandle) -> None:
        handle.resume, handle.sent_hash = self.mode, self.sent_hash


@dataclass
class Availability:
    available: bool = True
    reason: str | None = None


class RuntimeAdapter(ABC):
    """A runtime the worker can host."""

    name: str

    @abstractmethod
    def capabilities(self) -> RuntimeCapabilities: ...

    def availability(self) -> Availability:
        """Whether the runtime can run here at all (binary present, ...). Cheap; no network."""
        return Availability()

    @abstractmethod
    async def auth_status(self) -> AuthStatus: ...

    async def ensure_login(self) -> EnsureLoginResult:
        """Logged in, or the steps an operator has to take (no browser, no prompt: the worker has no user)."""
        status = await self.auth_status()
        ok = status.state in (AuthState.AUTHENTICATED, AuthState.NOT_REQUIRED)
        login = self.login_command()
        return EnsureLoginResult(status=status, logged_in=ok, instructions="" if ok else status.message,
                                 login_command=tuple(login) if login else None)

    def login_command(self) -> list[str] | None:
        """argv of the runtime's own interactive login (it prints a URL and reads a code; it must not open a
        browser by itself when BROWSER=true), run by ``codesdk auth login`` with the namespace's environment
        as the namespace's user. None: nothing to log in to."""
        return None

    def implicit_sources(self, cwd: Path) -> dict[str, Any]:
        """What the runtime would load on its own with this worker's environment, working in ``cwd``, and what
        CodeSDK does with each (``policy``; ``found``: kind, path, used, sha256). Recorded with each task and shown
        by the runtime-env view. Blocking file work."""
        return {"policy": f"the {self.name} runtime loads nothing implicitly", "found": []}

    @abstractmethod
    def start_task(self, params: StartTaskParams, io: TaskIO) -> TaskHandle:
        """Validate and prepare a task (no waiting). Raise StartTaskRefused to refuse it."""


@dataclass
class AdapterRegistry:
    adapters: dict[str, RuntimeAdapter] = field(default_factory=dict)

    def add(self, adapter: RuntimeAdapter) -> None:
        self.adapters[adapter.name] = adapter

    def get(self, name: str) -> RuntimeAdapter | None:
        return self.adapters.get(name)
