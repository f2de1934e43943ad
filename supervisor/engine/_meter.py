"""One task's budget meter: its own limits and the session's, what each has spent, and which limit is reached.

Pure bookkeeping (no I/O): ``_budgets`` feeds it the task's usage reports and tool calls, stores what it counts and
stops the task when ``reached`` names a limit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from codesdk.protocol import (
    BudgetGate,
    BudgetLimit,
    BudgetLimits,
    BudgetReached,
    BudgetScope,
    BudgetSpent,
    first_reached,
)


@dataclass
class TaskMeter:
    task_id: str
    #: The task's own limits, and the session's (as they were when the task started).
    limits: BudgetLimits = field(default_factory=BudgetLimits)
    session_limits: BudgetLimits = field(default_factory=BudgetLimits)
    #: What the task spent, and what the session spent (its earlier tasks' and this one's).
    spent: BudgetSpent = field(default_factory=BudgetSpent)
    session_spent: BudgetSpent = field(default_factory=BudgetSpent)
    gate: BudgetGate = BudgetGate.AFTER_USAGE
    #: Tool calls counted (a request repeated by the runtime is counted once).
    counted_calls: set[str] = field(default_factory=set)
    #: Set once a limit is reached: the task is being stopped for it.
    reached: BudgetReached | None = None

    @property
    def limited(self) -> bool:
        return not (self.limits.empty and self.session_limits.empty)

    def add(self, spent: BudgetSpent) -> None:
        self.spent = self.spent.plus(spent)
        self.session_spent = self.session_spent.plus(spent)

    def check(self, *, next_tool_call: bool = False, gate: BudgetGate | None = None) -> BudgetReached | None:
        """The limit reached (the task's first, then the session's), as the event that says so; None if none."""
        for scope, limits, spent in ((BudgetScope.TASK, self.limits, self.spent),
                                     (BudgetScope.SESSION, self.session_limits, self.session_spent)):
            limit = first_reached(limits, spent, next_tool_call=next_tool_call)
            if limit is not None:
                return BudgetReached(scope=scope, limit=limit, limit_value=_value(limits, limit), spent=spent,
                                     task_id=self.task_id, session_spent=self.session_spent,
                                     gate=gate or self.gate)
        return None


def _value(limits: BudgetLimits, limit: BudgetLimit) -> float:
    value = getattr(limits, limit.value)
    assert value is not None
    return float(value)
