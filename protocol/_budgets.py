"""Budgets that pause instead of killing: limits on what a task or a session may spend, what was spent, and the
events of a budget reached (the task ends ``task.stopped`` with reason ``budget_reached``, the session pauses) and
raised (the session may go on).

Tokens are counted as ``input_tokens + output_tokens`` of each ``usage.reported`` (what the runtime reports; cached
reads and writes are not counted as tokens — they are priced in the cost). Cost is the runtime's own ``cost_usd``
where it reports one, else the operator's price for the model (``PriceTable``); usage with neither is counted in
``unpriced_reports`` and cannot reach a cost limit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime
from enum import StrEnum

from pydantic import Field, ValidationError, field_validator

from ._base import Model

#: The stop reason of a task ended at a budget (``task.stopped.reason``).
BUDGET_REACHED_REASON = "budget_reached"
#: The largest limit taken: stored as JSON numbers, exact up to 2^53.
MAX_LIMIT = 2**53


class BudgetGate(StrEnum):
    """Where a runtime lets the supervisor check a budget (``RuntimeCapabilities.budget_gate``)."""

    #: Before each model request after the first: the runtime's next request waits for the supervisor's answer to
    #: its tool calls, and the usage of its earlier requests is reported by then.
    BEFORE_REQUEST = "before_request"
    #: Only once usage is reported (at a turn's end, or per request after the fact): a limit may be overrun by what
    #: the requests since the last report spent. Tool-call limits are still checked before each call runs.
    AFTER_USAGE = "after_usage"


class BudgetLimit(StrEnum):
    """Which limit a budget reached."""

    TOKENS = "tokens"
    COST_USD = "cost_usd"
    TOOL_CALLS = "tool_calls"


class BudgetScope(StrEnum):
    TASK = "task"
    SESSION = "session"


class BudgetLimits(Model):
    """Limits (None: no limit of that kind). Reached when what was spent is at or above the limit; a tool-call limit
    of N lets N calls run and stops the task at the next one."""

    tokens: int | None = Field(default=None, ge=0, le=MAX_LIMIT)
    """Input plus output tokens, as the runtime reports them."""
    cost_usd: float | None = Field(default=None, ge=0, le=MAX_LIMIT)
    """NaN and infinities are refused by the bounds."""
    tool_calls: int | None = Field(default=None, ge=0, le=MAX_LIMIT)

    @property
    def empty(self) -> bool:
        return self.tokens is None and self.cost_usd is None and self.tool_calls is None

    def merged(self, other: BudgetLimits) -> BudgetLimits:
        """These limits with ``other``'s set ones in their place."""
        return self.model_copy(update={k: v for k, v in other.model_dump().items() if v is not None})


class BudgetSpent(Model):
    """What a task or a session spent."""

    tokens: int = Field(default=0, ge=0)
    cost_usd: float = Field(default=0.0, ge=0, le=MAX_LIMIT)
    tool_calls: int = Field(default=0, ge=0)
    #: Usage reports that carried no cost and whose model has no price: their cost is not in ``cost_usd``.
    unpriced_reports: int = Field(default=0, ge=0)

    def plus(self, other: BudgetSpent) -> BudgetSpent:
        return BudgetSpent(tokens=self.tokens + other.tokens, cost_usd=self.cost_usd + other.cost_usd,
                           tool_calls=self.tool_calls + other.tool_calls,
                           unpriced_reports=self.unpriced_reports + other.unpriced_reports)

    def amount(self, limit: BudgetLimit) -> float:
        return float(getattr(self, limit.value))


def first_reached(limits: BudgetLimits, spent: BudgetSpent, *, next_tool_call: bool = False) -> BudgetLimit | None:
    """The first of ``limits`` that ``spent`` has reached (tokens, cost, tool calls), or None. Tool calls count only
    when one more is about to run (``next_tool_call``): N calls may run under a limit of N."""
    if limits.tokens is not None and spent.tokens >= limits.tokens:
        return BudgetLimit.TOKENS
    if limits.cost_usd is not None and spent.cost_usd >= limits.cost_usd:
        return BudgetLimit.COST_USD
    if next_tool_call and limits.tool_calls is not None and spent.tool_calls >= limits.tool_calls:
        return BudgetLimit.TOOL_CALLS
    return None


class ModelPrice(Model):
    """USD per million tokens of one model."""

    input: float = Field(ge=0, le=1e6, allow_inf_nan=False)
    output: float = Field(ge=0, le=1e6, allow_inf_nan=False)
    #: Cached input read (default: the input price).
    cached_input: float | None = Field(default=None, ge=0, le=1e6, allow_inf_nan=False)
    #: Input written to the cache (default: the input price).
    cache_write: float | None = Field(default=None, ge=0, le=1e6, allow_inf_nan=False)

    def cost_usd(self, *, input_tokens: int, output_tokens: int, cache_read_tokens: int = 0,
                 cache_write_tokens: int = 0) -> float:
        cached = self.input if self.cached_input is None else self.cached_input
        written = self.input if self.cache_write is None else self.cache_write
        micro = (input_tokens * self.input + output_tokens * self.output + cache_read_tokens * cached
                 + cache_write_tokens * written)
        return micro / 1_000_000


class PriceTable(Model):
    """The operator's prices by model name (``serve --price-table FILE``: ``{"models": {"<model>": {"input": 3,
    "output": 15, "cached_input": 0.3}}}``, USD per million tokens)."""

    models: dict[str, ModelPrice] = Field(default_factory=dict)

    @field_validator("models")
    @classmethod
    def _named(cls, value: Mapping[str, ModelPrice]) -> Mapping[str, ModelPrice]:
        for name in value:
            if not name or name != name.strip() or len(name) > 200:
                raise ValueError(f"model name {name!r} must be 1 to 200 characters without surrounding spaces")
        return value

    def price(self, model: str | None) -> ModelPrice | None:
        return None if model is None else self.models.get(model)


class PriceTableError(ValueError):
    """A price table that cannot be used; the message names the place and what to write there."""


def parse_price_table(text: str | bytes, source: str = "the price table") -> PriceTable:
    """A price table from its JSON text (``PriceTable``), or ``PriceTableError`` naming the first field at fault."""
    try:
        return PriceTable.model_validate_json(text)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the top level"
        raise PriceTableError(
            f"{source}: {where}: {first['msg']} (expected {{\"models\": {{\"<model>\": {{\"input\": USD, "
            f"\"output\": USD, \"cached_input\": USD, \"cache_write\": USD}}}}}}, USD per million tokens; "
            f"{exc.error_count()} problem(s) in all)") from None


def usage_spent(*, model: str | None, input_tokens: int, output_tokens: int, cache_read_tokens: int = 0,
                cache_write_tokens: int = 0, cost_usd: float | None, prices: PriceTable) -> BudgetSpent:
    """What one usage report spent: its tokens, and its own cost or else its model's price's."""
    tokens = input_tokens + output_tokens
    if cost_usd is not None and math.isfinite(cost_usd):
        return BudgetSpent(tokens=tokens, cost_usd=cost_usd)
    price = prices.price(model)
    if price is None:
        return BudgetSpent(tokens=tokens, unpriced_reports=1)
    return BudgetSpent(tokens=tokens, cost_usd=price.cost_usd(
        input_tokens=input_tokens, output_tokens=output_tokens, cache_read_tokens=cache_read_tokens,
        cache_write_tokens=cache_write_tokens))


class BudgetReached(Model):
    """A limit was reached: the task stops (``task.stopped``, reason ``budget_reached``) and its session pauses until
    the budget is raised (``POST /v1/sessions/{id}/budget/raise``)."""

    scope: BudgetScope
    limit: BudgetLimit
    limit_value: float = Field(ge=0, le=MAX_LIMIT)
    #: What the scope (the task, or the session) spent when the limit was reached.
    spent: BudgetSpent
    task_id: str
    #: What the session spent in all, at that moment.
    session_spent: BudgetSpent
    #: Where the check was made (the runtime's ``budget_gate``): before a model request, or after a usage report.
    gate: BudgetGate = BudgetGate.AFTER_USAGE


class BudgetRaised(Model):
    """The session's paused budget was raised: tasks may start in it again."""

    limits: BudgetLimits
    """The session's limits from now on."""
    raised_by: str
    #: What had been reached (the pause this raise ends).
    reached: BudgetReached
    #: A task is started next to go on with the work (``continue``).
    continued: bool = False


class SessionBudget(Model):
    """A session's budget as stored with it: its limits, what it spent, and whether it is paused."""

    limits: BudgetLimits = Field(default_factory=BudgetLimits)
    spent: BudgetSpent = Field(default_factory=BudgetSpent)
    #: Set while the session is paused at a budget: what was reached. A new task is refused (409) until raised.
    paused: BudgetReached | None = None
    paused_at: datetime | None = None
