"""Budgets at the engine: a task reaching its own or its session's limit (tokens, cost, tool calls) is stopped with
``budget.reached`` then ``task.stopped`` reason ``budget_reached`` and its receipt; the session pauses with what it
spent, refuses new tasks until raised, and a raise with ``continue`` starts the next task; the namespace's monthly
budget refuses new tasks once spent; every usage report adds to the namespace's month."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from codesdk.protocol import (
    BUDGET_REACHED_REASON,
    BudgetLimit,
    BudgetLimits,
    BudgetRaised,
    BudgetReached,
    BudgetScope,
    BudgetSpent,
    EventType,
    ExecutedBy,
    Method,
    ModelInput,
    ModelPrice,
    NormalizedEvent,
    PermissionMode,
    PriceTable,
    RuntimeInfo,
    SessionCreated,
    TaskCompleted,
    TaskStarted,
    TaskStopped,
    ToolCallRequested,
    Trace,
    UsageReported,
    canonical_hash,
)
from codesdk.supervisor.engine import (
    BudgetNotPaused,
    BudgetPaused,
    Engine,
    InvalidTaskInput,
    MonthlyBudgetSpent,
    derive_transcript,
    session_events,
)
from codesdk.supervisor.namespaces import NamespaceBudgets
from codesdk.supervisor.store import TaskState
from codesdk.testing.invariants import InvariantError, check_session

from tests.engine.doubles import FakeWorker, FakeWorkers, engine_with_doubles


async def _task(engine: Engine, workers: FakeWorkers, *, session_budget: BudgetLimits | None = None,
                budget: BudgetLimits | None = None, namespace: str = "default") -> tuple[str, str, FakeWorker]:
    session = await engine.create_session(namespace=namespace, budget=session_budget)
    task = await engine.start_task(session.session_id, "x", budget=budget, permission_mode=PermissionMode.YOLO)
    worker = workers.worker(namespace)
    await worker.connection.wait_for(Method.START_TASK)
    return session.session_id, task.task_id, worker


async def _usage(worker: FakeWorker, task_id: str, input_tokens: int, output_tokens: int, *,
                 cost_usd: float | None = None, model: str = "m") -> None:
    await worker.emit(task_id, EventType.USAGE_REPORTED, UsageReported(
        model=model, input_tokens=input_tokens, output_tokens=output_tokens, cost_usd=cost_usd))


async def _call(worker: FakeWorker, task_id: str, call_id: str) -> None:
    tool_input = {"command": "true"}
    await worker.emit(task_id, EventType.TOOL_CALL_REQUESTED, ToolCallRequested(
        tool_call_id=call_id, input_hash=canonical_hash(tool_input), tool_name="Bash", input=tool_input,
        executed_by=ExecutedBy.RUNTIME))


async def _stopped_by_budget(engine: Engine, sid: str, task_id: str) -> BudgetReached:
    record = await engine.wait_task(task_id)
    assert record.state == TaskState.STOPPED, record
    events = await session_events(engine.store, sid)
    check_session(events)
    reached = [e.payload for e in events if e.type == EventType.BUDGET_REACHED]
    assert len(reached) == 1 and isinstance(reached[0], BudgetReached)
    assert events[-1].type == EventType.TASK_STOPPED
    stopped = events[-1].payload
    assert isinstance(stopped, TaskStopped) and stopped.reason == BUDGET_REACHED_REASON
    assert stopped.receipt is not None and stopped.receipt.worker == "confirmed"
    return reached[0]


async def test_a_task_past_its_token_limit_stops_with_budget_reached_and_pauses_its_session(tmp_path: Path) -> None:
    async with engine_with_doubles(tmp_path) as (engine, workers):
        sid, task_id, worker = await _task(engine, workers, budget=BudgetLimits(tokens=100))
        await _usage(worker, task_id, 60, 30)  # 90: under
        await _usage(worker, task_id, 10, 5)  # 105: reached
        reached = await _stopped_by_budget(engine, sid, task_id)
        assert (reached.scope, reached.limit, reached.limit_value, reached.spent.tokens) == (
            BudgetScope.TASK, BudgetLimit.TOKENS, 100, 105)
        (stop,) = await worker.connection.wait_for(Method.STOP)
        assert stop["reason"] == BUDGET_REACHED_REASON
        session = await engine.store.get_session(sid)
        assert session.budget is not None and session.budget.paused == reached
        assert session.budget.spent.tokens == 105
        with pytest.raises(BudgetPaused, match="paused at its budget .*raise it first"):
            await engine.start_task(sid, "more")


async def test_a_session_limit_counts_every_task_of_the_session(tmp_path: Path) -> None:
    async with engine_with_doubles(tmp_path) as (engine, workers):
        sid, first, worker = await _task(engine, workers, session_budget=BudgetLimits(tokens=150))
        await _usage(worker, first, 50, 50)
        await worker.emit(first, EventType.TASK_COMPLETED, TaskCompleted())
        assert (await engine.wait_task(first)).state == TaskState.COMPLETED
        second = (await engine.start_task(sid, "again")).task_id
        await worker.connection.wait_for(Method.START_TASK, 2)
        await _usage(worker, second, 40, 20)  # 160 for the session
        reached = await _stopped_by_budget(engine, sid, second)
        assert (reached.scope, reached.spent.tokens, reached.session_spent.tokens) == (BudgetScope.SESSION, 160, 160)


async def test_a_tool_call_past_the_limit_never_runs(tmp_path: Path) -> None:
    async with engine_with_doubles(tmp_path) as (engine, workers):
        sid, task_id, worker = await _task(engine, workers, budget=BudgetLimits(tool_calls=1))
        await _call(worker, task_id, "call_1")
        await worker.connection.wait_for(Method.SEND_TOOL_APPROVED)
        await _call(worker, task_id, "call_2")
        reached = await _stopped_by_budget(engine, sid, task_id)
        assert (reached.limit, reached.spent.tool_calls, reached.gate.value) == (BudgetLimit.TOOL_CALLS, 1,
                                                                                  "before_request")
        requested = [e.payload.tool_call_id for e in await session_events(engine.store, sid)
                     if e.type == EventType.TOOL_CALL_REQUESTED and isinstance(e.payload, ToolCallRequested)]
        assert requested == ["call_1"]  # the second was never decided, let alone run


async def test_cost_comes_from_the_report_else_from_the_operators_price(tmp_path: Path) -> None:
    prices = PriceTable(models={"priced": ModelPrice(input=1.0, output=2.0)})
    async with engine_with_doubles(tmp_path, prices=prices) as (engine, workers):
        sid, task_id, worker = await _task(engine, workers, budget=BudgetLimits(cost_usd=1.0))
        await _usage(worker, task_id, 100, 100, cost_usd=0.5)  # its own cost: 0.5
        await _usage(worker, task_id, 1_000_000, 0, model="unpriced")  # no price: not counted as cost
        session = await engine.store.get_session(sid)
        assert session.budget is not None and session.budget.spent.unpriced_reports == 1
        await _usage(worker, task_id, 100_000, 200_000, model="priced")  # 0.1 + 0.4 = 0.5: 1.0 in all
        reached = await _stopped_by_budget(engine, sid, task_id)
        assert reached.limit == BudgetLimit.COST_USD and reached.spent.cost_usd == pytest.approx(1.0)


async def test_raising_a_paused_budget_with_continue_starts_the_next_task(tmp_path: Path) -> None:
    async with engine_with_doubles(tmp_path) as (engine, workers):
        sid, task_id, worker = await _task(engine, workers, session_budget=BudgetLimits(tokens=10))
        await _usage(worker, task_id, 10, 1)
        await _stopped_by_budget(engine, sid, task_id)
        with pytest.raises(InvalidTaskInput, match="limits.tokens"):  # still below what was spent
            await engine.raise_budget(sid, BudgetLimits(tokens=11), by="test", go_on=True)
        session, task = await engine.raise_budget(sid, BudgetLimits(tokens=1000), by="test", go_on=True)
        assert session.budget is not None and session.budget.paused is None
        assert session.budget.limits.tokens == 1000
        assert task is not None
        await worker.connection.wait_for(Method.START_TASK, 2)
        await worker.emit(task.task_id, EventType.TASK_COMPLETED, TaskCompleted())
        assert (await engine.wait_task(task.task_id)).state == TaskState.COMPLETED
        events = await session_events(engine.store, sid)
        check_session(events)
        raised = [e for e in events if e.type == EventType.BUDGET_RAISED]
        assert len(raised) == 1 and isinstance(raised[0].payload, BudgetRaised) and raised[0].payload.continued
        started = [e.payload for e in events if e.type == EventType.TASK_STARTED]
        assert isinstance(started[-1], TaskStarted) and started[-1].permission_mode == PermissionMode.YOLO
        with pytest.raises(BudgetNotPaused):
            await engine.raise_budget(sid, BudgetLimits(tokens=2000), by="test")


async def test_a_raise_after_a_tasks_own_limit_refuses_a_session_limit_already_spent(tmp_path: Path) -> None:
    async with engine_with_doubles(tmp_path) as (engine, workers):
        sid, task_id, worker = await _task(engine, workers, budget=BudgetLimits(tokens=10))
        await _usage(worker, task_id, 10, 9)
        assert (await _stopped_by_budget(engine, sid, task_id)).scope == BudgetScope.TASK
        with pytest.raises(InvalidTaskInput, match="limits.tokens.*spent 19"):  # the next task would pause at once
            await engine.raise_budget(sid, BudgetLimits(tokens=5), by="test")
        session = await engine.store.get_session(sid)
        assert session.budget is not None and session.budget.paused is not None and session.budget.limits.empty
        session, _ = await engine.raise_budget(sid, BudgetLimits(tokens=20), by="test")
        assert session.budget is not None and session.budget.paused is None


async def test_the_namespaces_monthly_budget_refuses_new_tasks_once_spent(tmp_path: Path) -> None:
    now = datetime(2026, 12, 15, tzinfo=UTC)
    async with engine_with_doubles(tmp_path, wall_clock=lambda: now) as (engine, workers):
        NamespaceBudgets(tmp_path).set("user:team", 1.0)
        sid, task_id, worker = await _task(engine, workers, namespace="user:team")
        await _usage(worker, task_id, 1, 1, cost_usd=1.25)
        await worker.emit(task_id, EventType.TASK_COMPLETED, TaskCompleted())
        await engine.wait_task(task_id)
        assert (await engine.store.namespace_spend("user:team", "2026-12")).cost_usd == pytest.approx(1.25)
        with pytest.raises(MonthlyBudgetSpent, match="resets at 2027-01-01T00:00:00Z") as refused:
            await engine.start_task(sid, "more")
        assert refused.value.details()["limit_usd"] == 1.0
        assert len(await engine.store.list_tasks(sid)) == 1  # nothing stored for the refused one
        other = await engine.create_session(namespace="user:other")  # another namespace is not bounded by it
        await engine.start_task(other.session_id, "x")


def _stored(seq: int, type_: EventType, payload: object, task_id: str | None = None) -> NormalizedEvent:
    return NormalizedEvent(seq=seq, time=datetime(2026, 1, 1, tzinfo=UTC), type=type_, payload=payload,
                           trace=Trace(session_id="ses_1", task_id=task_id), runtime=RuntimeInfo(name="scripted"))


def test_the_invariants_refuse_a_task_started_in_a_paused_session_and_a_budget_stop_without_its_event() -> None:
    reached = BudgetReached(scope=BudgetScope.TASK, limit=BudgetLimit.TOKENS, limit_value=1,
                            spent=BudgetSpent(tokens=2), task_id="t1", session_spent=BudgetSpent(tokens=2))
    given = ModelInput(input_ref="r", input_hash="h", message_count=1)
    head = [_stored(1, EventType.SESSION_CREATED, SessionCreated(runtime="scripted", namespace="default")),
            _stored(2, EventType.TASK_STARTED, TaskStarted(task_id="t1"), "t1"),
            _stored(3, EventType.MODEL_INPUT, given, "t1")]
    budget_stop = [_stored(4, EventType.BUDGET_REACHED, reached, "t1"),
                   _stored(5, EventType.TASK_STOPPED, TaskStopped(reason=BUDGET_REACHED_REASON), "t1")]
    check_session([*head, *budget_stop])
    with pytest.raises(InvariantError, match="paused at its budget"):
        check_session([*head, *budget_stop, _stored(6, EventType.TASK_STARTED, TaskStarted(task_id="t2"), "t2")])
    raised = _stored(6, EventType.BUDGET_RAISED, BudgetRaised(limits=BudgetLimits(tokens=9), raised_by="u",
                                                               reached=reached))
    check_session([*head, *budget_stop, raised, _stored(7, EventType.TASK_STARTED, TaskStarted(task_id="t2"), "t2")])
    with pytest.raises(InvariantError, match="no budget.reached"):
        check_session([*head, _stored(4, EventType.TASK_STOPPED, TaskStopped(reason=BUDGET_REACHED_REASON), "t1")])
    with pytest.raises(InvariantError, match="not task.stopped with reason budget_reached"):
        check_session([*head, budget_stop[0], _stored(5, EventType.TASK_COMPLETED, TaskCompleted(), "t1")])


def test_the_namespace_budgets_file_is_private_and_validated(tmp_path: Path) -> None:
    budgets = NamespaceBudgets(tmp_path)
    assert budgets.set("user:team", 5) == 5.0
    assert json.loads(budgets.path.read_text()) == {"user:team": {"monthly_usd": 5.0}}
    assert budgets.path.stat().st_mode & 0o777 == 0o600
    with pytest.raises(ValueError, match="monthly budget is a number"):
        budgets.set("user:team", -1)
    assert budgets.set("user:team", None) is None and budgets.get("user:team") is None


async def test_a_budget_stop_cut_short_by_the_supervisors_end_ends_stopped_by_the_next_one(tmp_path: Path) -> None:
    """The supervisor is gone while it stops a task at its budget (budget.reached and the pause stored, the worker
    never ending the task): the next one ends the task task.stopped reason budget_reached, not failed, so the
    session keeps the contract's order and is resumable by a raise."""
    async with engine_with_doubles(tmp_path) as (engine, workers):
        sid, task_id, worker = await _task(engine, workers, budget=BudgetLimits(tokens=1))
        worker.connection.stopped = None  # it acknowledges the stop and never ends the task
        await _usage(worker, task_id, 1, 1)
        await worker.connection.wait_for(Method.STOP)
        await engine.leasing._lost("default")  # noqa: SLF001 - what a killed supervisor leaves in the store
    async with engine_with_doubles(tmp_path) as (engine, workers):
        reached = await _stopped_by_budget_without_a_worker(engine, sid, task_id)
        await engine.raise_budget(sid, BudgetLimits(tokens=100), by="test")
        await engine.start_task(sid, "again")
        check_session(await session_events(engine.store, sid))
    assert reached.limit == BudgetLimit.TOKENS


async def _stopped_by_budget_without_a_worker(engine: Engine, sid: str, task_id: str) -> BudgetReached:
    assert (await engine.store.get_task(task_id)).state == TaskState.STOPPED
    events = await session_events(engine.store, sid)
    check_session(events)
    stopped = events[-1].payload
    assert isinstance(stopped, TaskStopped) and stopped.reason == BUDGET_REACHED_REASON
    assert stopped.receipt is not None and stopped.receipt.worker == "exited"
    (reached,) = [e.payload for e in events if isinstance(e.payload, BudgetReached)]
    return reached


async def test_a_fork_of_a_paused_session_is_paused_as_its_events_say(tmp_path: Path) -> None:
    async with engine_with_doubles(tmp_path) as (engine, workers):
        sid, task_id, worker = await _task(engine, workers, session_budget=BudgetLimits(tokens=5))
        await _usage(worker, task_id, 5, 5)
        await _stopped_by_budget(engine, sid, task_id)
        paused = await engine.fork_session(sid, by="test")
        assert paused.budget is not None and paused.budget.paused is not None
        assert paused.budget.limits.tokens == 5 and paused.budget.spent.tokens == 0
        with pytest.raises(BudgetPaused):
            await engine.start_task(paused.session_id, "more")
        await engine.raise_budget(sid, BudgetLimits(tokens=100), by="test")
        going = await engine.fork_session(sid, by="test")  # the raise is among its events: not paused
        assert going.budget is not None and going.budget.paused is None
        await engine.start_task(going.session_id, "more")
        assert await derive_transcript(engine.store, sid)  # budget events are no turns
        check_session(await session_events(engine.store, going.session_id))


def test_a_monthly_refusal_shows_the_limit_as_set() -> None:
    """A small limit is not rounded away: $0.001, not $0.00."""
    refusal = str(MonthlyBudgetSpent("user:alice", 0.019, 0.001, "2026-12-01T00:00:00Z"))
    assert "spent $0.0190 of its monthly budget of $0.001;" in refusal, refusal
