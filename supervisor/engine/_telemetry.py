"""What of a task's life the engine tells its observers — metrics and traces (``supervisor.observe``): its start,
each event of its worker, its tool calls and approval waits, its end. The engine calls these few hooks and knows
nothing of what is behind them; with no observer they cost a call that returns (``NO_TASK_TELEMETRY``)."""

from __future__ import annotations

from typing import Protocol

from codesdk.protocol import TraceParent


class Phase(Protocol):
    """A timed part of a task (a tool call, an approval wait), from its making to its ``end``."""

    def end(self, outcome: str) -> None:
        """It ended, so (``ok``, ``cancelled``, ``error``; an approval: its decision). Only the first call counts."""


class TaskTelemetry(Protocol):
    """One task's observer, made when the task is admitted."""

    def worker_event(self, event_type: str) -> None:
        """An event of the task's worker arrived (its first one, its model requests' starts and ends ...)."""

    def tool_call(self, tool_name: str, tool_class: str) -> Phase:
        """A call the supervisor runs for the task, from its request to its result (or denial)."""

    def approval_wait(self, tool_name: str) -> Phase:
        """A call waiting for a person's decision; ``outcome`` is how it was decided."""

    def store_commit(self, events: int) -> Phase:
        """A batch of the task's events on its way to the store, from its submission to its commit."""

    def ended(self, outcome: str, code: str) -> None:
        """The task's terminal event is about to be stored: ``completed``, ``failed`` (``code``: its failure code,
        ``OTHER`` for a runtime's own) or ``stopped``."""


class Telemetry(Protocol):
    def task(self, *, task_id: str, session_id: str, namespace: str, runtime: str, request_id: str | None,
             client_id: str | None, parent: TraceParent | None) -> TaskTelemetry:
        """The observer of a task just admitted (``parent``: the caller's W3C trace, which the task joins)."""


class _NoPhase:
    def end(self, outcome: str) -> None:
        return None


class _NoTaskTelemetry:
    def worker_event(self, event_type: str) -> None:
        return None

    def tool_call(self, tool_name: str, tool_class: str) -> Phase:
        return _NO_PHASE

    def approval_wait(self, tool_name: str) -> Phase:
        return _NO_PHASE

    def store_commit(self, events: int) -> Phase:
        return _NO_PHASE

    def ended(self, outcome: str, code: str) -> None:
        return None


_NO_PHASE = _NoPhase()
NO_TASK_TELEMETRY: TaskTelemetry = _NoTaskTelemetry()


class Observers:
    """The engine's observers, added as the service starts (its metrics, its tracer): each task gets one observer of
    its own from each; with none, ``NO_TASK_TELEMETRY``, and with one, that one's alone."""

    def __init__(self) -> None:
        self._all: list[Telemetry] = []

    def add(self, telemetry: Telemetry) -> None:
        self._all.append(telemetry)

    def task(self, *, task_id: str, session_id: str, namespace: str, runtime: str, request_id: str | None,
             client_id: str | None, parent: TraceParent | None) -> TaskTelemetry:
        each = [t.task(task_id=task_id, session_id=session_id, namespace=namespace, runtime=runtime,
                       request_id=request_id, client_id=client_id, parent=parent) for t in self._all]
        if not each:
            return NO_TASK_TELEMETRY
        return each[0] if len(each) == 1 else _EveryTask(each)


class _EveryPhase:
    __slots__ = ("_phases",)

    def __init__(self, phases: list[Phase]) -> None:
        self._phases = phases

    def end(self, outcome: str) -> None:
        for phase in self._phases:
            phase.end(outcome)


class _EveryTask:
    __slots__ = ("_each",)

    def __init__(self, each: list[TaskTelemetry]) -> None:
        self._each = each

    def worker_event(self, event_type: str) -> None:
        for one in self._each:
            one.worker_event(event_type)

    def tool_call(self, tool_name: str, tool_class: str) -> Phase:
        return _EveryPhase([one.tool_call(tool_name, tool_class) for one in self._each])

    def approval_wait(self, tool_name: str) -> Phase:
        return _EveryPhase([one.approval_wait(tool_name) for one in self._each])

    def store_commit(self, events: int) -> Phase:
        return _EveryPhase([one.store_commit(events) for one in self._each])

    def ended(self, outcome: str, code: str) -> None:
        for one in self._each:
            one.ended(outcome, code)
