"""Pending tool calls of one task: a runtime waits, the supervisor's answer wakes it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import trio

from codesdk.protocol import GrantScope, canonical_hash

from .base import UnknownToolCall


@dataclass(frozen=True)
class ToolOutcome:
    """The supervisor's answer to one tool call: a result (maybe an error) or a denial."""

    result: Any = None
    is_error: bool = False
    denied: bool = False
    approved: bool = False  # a runtime-executed call may go ahead (no result: the runtime produces it)
    reason: str | None = None
    #: How far the approval reaches: a runtime with a native notion of it is told (e.g. "accept for session").
    scope: GrantScope = GrantScope.ONCE


class PendingToolCalls:
    """Tool calls that were requested and not yet answered. Each call is answered at most once."""

    def __init__(self) -> None:
        self._waiting: dict[str, trio.Event] = {}
        self._answers: dict[str, ToolOutcome] = {}

    def expect(self, tool_call_id: str) -> None:
        if tool_call_id in self._waiting or tool_call_id in self._answers:
            raise ValueError(f"tool call {tool_call_id!r} is already known in this task")
        self._waiting[tool_call_id] = trio.Event()

    def answer(self, tool_call_id: str, outcome: ToolOutcome) -> None:
        event = self._waiting.get(tool_call_id)
        if event is None or event.is_set():
            raise UnknownToolCall(f"no pending tool call {tool_call_id!r}")
        self._answers[tool_call_id] = outcome
        event.set()

    async def wait(self, tool_call_id: str) -> ToolOutcome:
        await self._waiting[tool_call_id].wait()
        del self._waiting[tool_call_id]
        return self._answers[tool_call_id]

    def pending(self) -> list[str]:
        return [call for call, event in self._waiting.items() if not event.is_set()]


class AnswersToolCalls:
    """The inbound half of a task handle whose runtime waits on ``PendingToolCalls`` (``self.tools``): each of the
    supervisor's answers wakes the call it names (``UnknownToolCall`` if none waits)."""

    tools: PendingToolCalls

    def send_tool_result(self, tool_call_id: str, result: Any, is_error: bool = False) -> None:
        self.tools.answer(tool_call_id, ToolOutcome(result=result, is_error=is_error))

    def send_tool_denied(self, tool_call_id: str, reason: str) -> None:
        self.tools.answer(tool_call_id, ToolOutcome(denied=True, reason=reason))

    def send_tool_approved(self, tool_call_id: str, reason: str, scope: GrantScope = GrantScope.ONCE) -> None:
        self.tools.answer(tool_call_id, ToolOutcome(approved=True, reason=reason, scope=scope))


def call_identity(call_id: str, tool_input: dict[str, Any]) -> dict[str, Any]:
    """The identity fields of a runtime's call in its tool events: its id (ours is the runtime's) and input hash."""
    return {"tool_call_id": call_id, "runtime_tool_call_id": call_id, "input_hash": canonical_hash(tool_input)}
