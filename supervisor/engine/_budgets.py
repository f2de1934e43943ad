"""Budgets that pause instead of killing: each task's usage and tool calls counted against its limits and its
session's, the task stopped (``budget.reached``, then ``task.stopped`` reason ``budget_reached`` with its receipt)
and the session paused when one is reached; a raise lets the session go on. Every usage report also adds to its
namespace's spend of the month, which the operator's monthly budget is checked against when a task starts.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

import trio

from codesdk.protocol import (
    BUDGET_REACHED_REASON,
    BudgetGate,
    BudgetLimits,
    BudgetReached,
    BudgetSpent,
    EventType,
    PriceTable,
    SessionBudget,
    ToolCallRequested,
    UsageReported,
    usage_spent,
)

from ..namespaces import NamespaceBudgetError, NamespaceBudgets, month_of, next_month_start
from ..store import Recorder, SessionRecord, StoreError
from ._errors import BudgetPaused, MonthlyBudgetSpent, NamespaceUnavailable
from ._meter import TaskMeter
from ._recorder import RunRecorder
from ._runs import PendingEvent, TaskRun
from ._stopping import StopInProgress

log = logging.getLogger("codesdk.supervisor.engine")

#: Starts carrying out a stop the engine set on the run (``Engine._carry_out_stop``, in its nursery).
StartStop = Callable[[TaskRun], None]


def describe(reached: BudgetReached) -> str:
    """One line: which limit of which scope, and what was spent of it."""
    spent = reached.spent.amount(reached.limit)
    shown = (f"${spent:.4f} of ${reached.limit_value:.4f}" if reached.limit.value == "cost_usd"
             else f"{spent:.0f} of {reached.limit_value:.0f}")
    return f"the {reached.scope.value}'s {reached.limit.value} limit: {shown} spent"


class Budgets:
    """The engine's budget keeper (one per engine)."""

    def __init__(self, store: Recorder, recorder: RunRecorder, prices: PriceTable, namespaces: NamespaceBudgets,
                 wall_clock: Callable[[], datetime], start_stop: StartStop | None = None) -> None:
        self._store = store
        self._recorder = recorder
        self.prices = prices
        self.namespaces = namespaces
        self._clock = wall_clock
        self.start_stop = start_stop

    # -- admission ------------------------------------------------------------------------------

    async def admit(self, session: SessionRecord, task_id: str, limits: BudgetLimits | None,
                    gate: BudgetGate = BudgetGate.AFTER_USAGE) -> TaskMeter:
        """The task's meter; ``BudgetPaused`` if its session is paused at its budget, ``MonthlyBudgetSpent`` if its
        namespace spent its monthly budget (nothing is stored either way)."""
        budget = session.budget or SessionBudget()
        if budget.paused is not None:
            raise BudgetPaused(session.session_id, describe(budget.paused))
        await self.check_monthly(session.namespace)
        return TaskMeter(task_id=task_id, limits=limits or BudgetLimits(), session_limits=budget.limits,
                         session_spent=budget.spent, gate=gate)

    async def check_monthly(self, namespace: str) -> None:
        try:
            limit = await trio.to_thread.run_sync(self.namespaces.get, namespace)
        except NamespaceBudgetError as exc:  # the operator's file is broken: refuse, saying which
            raise NamespaceUnavailable(str(exc)) from exc
        if limit is None:
            return
        now = self._clock()
        spent = await self._store.namespace_spend(namespace, month_of(now))
        if spent.cost_usd >= limit:
            raise MonthlyBudgetSpent(namespace, round(spent.cost_usd, 6), limit,
                                     next_month_start(now).isoformat().replace("+00:00", "Z"))

    # -- counting -------------------------------------------------------------------------------

    async def usage(self, run: TaskRun, report: UsageReported) -> None:
        """Count a usage report (stored already): the session's spent and the namespace's month; stop the task if it
        reached a limit."""
        spent = usage_spent(model=report.model, input_tokens=report.input_tokens, output_tokens=report.output_tokens,
                            cache_read_tokens=report.cache_read_tokens, cache_write_tokens=report.cache_write_tokens,
                            cost_usd=report.cost_usd, prices=self.prices)
        meter = run.meter
        meter.add(spent)
        if spent.unpriced_reports and (meter.limits.cost_usd is not None or meter.session_limits.cost_usd is not None):
            log.warning("task %s: usage of model %r has no cost and no price (serve --price-table): its cost is not "
                        "counted against the task's cost limit", run.task_id, report.model)
        await self._spend(run, spent, month_of(self._clock()))
        if meter.reached is None and (reached := meter.check(gate=BudgetGate.AFTER_USAGE)) is not None:
            await self.stop(run, reached)

    async def tool_call(self, run: TaskRun, request: ToolCallRequested) -> bool:
        """Before a tool call is decided (the runtime's next request waits for it): False, and the task is being
        stopped, when a limit is reached — the call never runs; else it is counted."""
        meter = run.meter
        if meter.reached is not None:
            return False
        if request.tool_call_id in meter.counted_calls:
            return True
        reached = meter.check(next_tool_call=True, gate=BudgetGate.BEFORE_REQUEST)
        if reached is not None:
            await self.stop(run, reached)
            return False
        meter.counted_calls.add(request.tool_call_id)
        meter.add(BudgetSpent(tool_calls=1))
        await self._spend(run, BudgetSpent(tool_calls=1), None)
        return True

    async def _spend(self, run: TaskRun, spent: BudgetSpent, month: str | None) -> None:
        def change(budget: SessionBudget | None) -> SessionBudget:
            budget = budget or SessionBudget()
            return budget.model_copy(update={"spent": budget.spent.plus(spent)})

        try:
            await self._store.change_budget(run.session_id, change,
                                            spend=None if month is None else (run.namespace, month, spent))
        except StoreError as exc:  # the count is kept in the run; the stored one lags until the next
            log.error("task %s: its spend could not be stored: %s", run.task_id, exc)

    # -- reaching -------------------------------------------------------------------------------

    async def stop(self, run: TaskRun, reached: BudgetReached) -> None:
        """``budget.reached``, the session paused, and the task stopped through the stop's own path (its receipt;
        ``task.stopped`` reason ``budget_reached``)."""
        if run.ended or run.stop is not None or run.meter.reached is not None:
            return
        run.meter.reached = reached
        # The stop is set first: from here nothing more of the task is stored but these, and no other stop starts.
        run.stop = StopInProgress(reason=BUDGET_REACHED_REASON, requested_by="supervisor")
        log.info("task %s: %s; stopping it", run.task_id, describe(reached))
        now = self._clock()

        def pause(budget: SessionBudget | None) -> SessionBudget:
            budget = budget or SessionBudget()
            return budget.model_copy(update={"paused": reached, "paused_at": now})

        # One commit: the event and the pause it makes are stored together or not at all.
        await self._recorder.append(run, [PendingEvent(EventType.BUDGET_REACHED, reached)], budget_change=pause)
        if self.start_stop is not None:
            self.start_stop(run)


