"""The invariants of CodeSDK's event contract, as checks usable on any event stream.

Two kinds of stream:

- a worker's ``runtime.event`` notifications (``check_worker_events``): per-task ordinals ``n`` from 1 without
  gaps, exactly one terminal event per task and nothing after it, tool-call identities whose ``input_hash`` is the
  hash of their input, times in UTC that do not run backwards within a task (docs/protocol.md §4, §5, §7);
- a session's stored events, as the store, the API and the client return them (``check_session``): ``seq`` from 1
  without gaps, the current schema version, one active task at a time, and per task (``check_task``) one
  ``task.started`` first, one terminal event last, and the tool-call graph — requested, then at most one decision,
  then started/completed only after an approval, and once the task has ended every started call completed
  exactly once; each question asked is answered exactly once; budgets: a ``budget.reached`` is followed by exactly
  one ``task.stopped`` with reason ``budget_reached`` (its task's end), and no task starts in a session paused at
  its budget before a ``budget.raised`` (a session-wide event, between tasks) — a budget stop leaves the session
  resumable; grants (``_grant_problems``): a call decided by a grant names one created earlier in the session
  (after a fork's copies), not revoked before, and for a ``task`` grant of the same task; a grant is revoked at
  most once; an input an approver edited is the one the call's later events carry; and an approval or question
  is escalated (``approval.escalated`` / ``question.escalated``) at most once, only while pending: after it was
  asked, before its decision or answer.

Each check raises ``InvariantError`` (an ``AssertionError``) naming every broken rule it found, with the events
involved, so a failing test says what is wrong rather than only that something is.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import timedelta

from codesdk.protocol import (
    BUDGET_REACHED_REASON,
    ApprovalEscalated,
    ApprovalRequested,
    QuestionEscalated,
    SCHEMA_VERSION,
    TERMINAL_EVENT_TYPES,
    EventType,
    GrantCreated,
    GrantRevoked,
    GrantScope,
    InputDelivery,
    ModelInputAppended,
    NormalizedEvent,
    QuestionAnswered,
    QuestionRequested,
    RuntimeEventParams,
    SessionCreated,
    TaskStopped,
    ToolCallIdentity,
    ToolCallPolicyEvaluated,
    ToolCallRequested,
    canonical_hash,
)

__all__ = ["InvariantError", "check_session", "check_task", "check_worker_events"]


class InvariantError(AssertionError):
    """Events that break the contract. ``problems`` lists each broken rule."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = list(problems)


#: Where each tool-call event may come in a call's life (stored events).
_TOOL_ORDER = {
    EventType.TOOL_CALL_REQUESTED: 0,
    EventType.TOOL_CALL_POLICY_EVALUATED: 1,
    EventType.APPROVAL_REQUESTED: 1,  # between the "ask" and the user's evaluation
    EventType.TOOL_CALL_APPROVED: 2,
    EventType.TOOL_CALL_DENIED: 2,
    EventType.TOOL_CALL_STARTED: 3,
    EventType.TOOL_OUTPUT_DELTA: 4,
    EventType.TOOL_OUTPUT_COMPLETED: 5,
    EventType.TOOL_CALL_COMPLETED: 6,
}
#: What a worker may report of a call after requesting it (the decision is the driver's, not an event).
_WORKER_TOOL_ORDER = {
    EventType.TOOL_CALL_REQUESTED: 0,
    EventType.TOOL_CALL_POLICY_EVALUATED: 1,
    EventType.TOOL_CALL_STARTED: 2,
    EventType.TOOL_OUTPUT_DELTA: 3,
    EventType.TOOL_OUTPUT_COMPLETED: 4,
    EventType.TOOL_CALL_COMPLETED: 5,
}


def check_worker_events(events: Iterable[RuntimeEventParams], *, ended: bool = True) -> None:
    """The rules a worker's event stream keeps (docs/protocol.md §5). ``ended``: every task in it must have ended
    (false for a stream cut short on purpose, e.g. by a crash)."""
    by_task: defaultdict[str, list[RuntimeEventParams]] = defaultdict(list)
    for params in events:
        by_task[params.task_id].append(params)
    problems: list[str] = []
    for task_id, task_events in by_task.items():
        problems += _worker_task_problems(task_id, task_events, ended)
    if problems:
        raise InvariantError(problems)


def _worker_task_problems(task_id: str, events: list[RuntimeEventParams], ended: bool) -> list[str]:
    problems: list[str] = []
    ordinals = [e.n for e in events]
    if ordinals != list(range(1, len(events) + 1)):
        problems.append(f"task {task_id!r}: n must run 1, 2, 3 … without gaps or repeats; got {_runs(ordinals)}")
    types = [e.event.type for e in events]
    terminals = [i for i, t in enumerate(types) if t in TERMINAL_EVENT_TYPES]
    if len(terminals) > 1:
        problems.append(f"task {task_id!r}: {len(terminals)} terminal events "
                        f"({', '.join(types[i].value for i in terminals)}); exactly one is allowed")
    if terminals and terminals[0] != len(types) - 1:
        after = ", ".join(t.value for t in types[terminals[0] + 1:][:5])
        problems.append(f"task {task_id!r}: events after its terminal event ({after})")
    if ended and not terminals:
        problems.append(f"task {task_id!r}: no terminal event (task.completed, task.failed or task.stopped)")
    for previous, event in itertools.pairwise(events):
        if event.event.time < previous.event.time - _CLOCK_SLACK:
            problems.append(f"task {task_id!r}: event n={event.n} is timed {event.event.time.isoformat()}, before "
                            f"n={previous.n} ({previous.event.time.isoformat()})")
            break
    problems += _tool_problems(task_id, [(e.event.type, e.event.payload) for e in events], _WORKER_TOOL_ORDER)
    for event in events:
        payload = event.event.payload
        if isinstance(payload, ToolCallRequested) and payload.input is not None \
                and payload.input_hash != canonical_hash(payload.input):
            problems.append(f"task {task_id!r}: tool call {payload.tool_call_id!r} has input_hash "
                            f"{payload.input_hash}, but its input hashes to {canonical_hash(payload.input)}")
    return problems


#: A worker's clock may be read by several threads: times that go back by less than this are not a fault.
_CLOCK_SLACK = timedelta(milliseconds=1)


def check_session(events: Sequence[NormalizedEvent]) -> None:
    """The rules a session's stored events keep: gap-free ``seq`` from 1, ``session.created`` first, the current
    schema version, one active task at a time, and each task's own rules (``check_task``)."""
    problems: list[str] = []
    seqs = [e.seq for e in events]
    if seqs != list(range(1, len(events) + 1)):
        problems.append(f"seq must run 1, 2, 3 … without gaps; got {_runs(seqs)}")
    if not events or events[0].type != EventType.SESSION_CREATED:
        problems.append("the first event must be session.created")
    if old := sorted({e.schema_version for e in events if e.schema_version != SCHEMA_VERSION}):
        problems.append(f"events of schema version {old} (current: {SCHEMA_VERSION}); stored events are read "
                        "upcast to the current version")
    by_task: defaultdict[str, list[NormalizedEvent]] = defaultdict(list)
    active: str | None = None
    paused_at: int | None = None  # the seq of a budget.reached no budget.raised has answered yet
    problems += _grant_problems(events)
    for event in events[1:]:
        task_id = event.trace.task_id
        if event.type in _SESSION_LEVEL:  # a grant revoked over the API, between or during tasks
            continue
        if event.type == EventType.BUDGET_RAISED:  # session-wide: between tasks, answering a budget.reached
            if active is not None:
                problems.append(f"budget.raised (seq={event.seq}) while task {active!r} was active: a budget is "
                                "raised once its stopped task has ended")
            if paused_at is None:
                problems.append(f"budget.raised (seq={event.seq}) with no budget.reached before it to answer")
            paused_at = None
            continue
        if not task_id:
            problems.append(f"event seq={event.seq} ({event.type.value}) belongs to no task")
            continue
        by_task[task_id].append(event)
        if event.type == EventType.BUDGET_REACHED:
            paused_at = event.seq
        if event.type == EventType.TASK_STARTED:
            if paused_at is not None:
                problems.append(f"task {task_id!r} started (seq={event.seq}) while the session was paused at its "
                                f"budget (budget.reached seq={paused_at}, no budget.raised since)")
            if active is not None:
                problems.append(f"task {task_id!r} started (seq={event.seq}) while {active!r} was still active: "
                                "one active task per session")
            active = task_id
        elif task_id != active:
            problems.append(f"event seq={event.seq} ({event.type.value}) of task {task_id!r} is outside that task's "
                            "lifetime")
        if event.type in TERMINAL_EVENT_TYPES and task_id == active:
            active = None
    for task_events in by_task.values():
        try:
            check_task(task_events)
        except InvariantError as exc:
            problems += exc.problems
    problems += _input_problems(events)
    if problems:
        raise InvariantError(problems)


def _input_problems(events: Sequence[NormalizedEvent]) -> list[str]:
    """Steering: each ``model.input.appended`` lies inside its task (a ``queued`` one with the task's end: nothing
    but its terminal event and other ends after it), its ``input_id`` is the session's only one by that id, and a
    queued input is carried by the session's next task that compiles an input (``model.input.carried_inputs``)."""
    problems: list[str] = []
    seen: dict[str, int] = {}
    owed: list[str] = []
    for index, event in enumerate(events):
        payload = event.payload
        if event.type == EventType.MODEL_INPUT and owed:
            carried = list(getattr(payload, "carried_inputs", ()))
            if carried != owed:
                problems.append(f"task {event.trace.task_id!r} carries inputs {carried}, not {owed}: the inputs its "
                                "session's last task queued open its prompt, in order")
            owed = []
        if not isinstance(payload, ModelInputAppended):
            continue
        if payload.input_id in seen:
            problems.append(f"input {payload.input_id!r} appended twice (seq={seen[payload.input_id]} and "
                            f"{event.seq}): an input is reported once")
        seen[payload.input_id] = event.seq
        if payload.delivery == InputDelivery.QUEUED:
            owed.append(payload.input_id)
            rest = [e.type for e in events[index + 1:] if e.trace.task_id == event.trace.task_id]
            if not rest or rest[-1] not in TERMINAL_EVENT_TYPES or not all(
                    t in (EventType.MODEL_INPUT_APPENDED, EventType.TOOL_CALL_COMPLETED) for t in rest[:-1]):
                problems.append(f"input {payload.input_id!r} (seq={event.seq}) is queued but not stored with its "
                                "task's end: an input the runtime never took is recorded as the task ends")
    return problems


def check_task(events: Sequence[NormalizedEvent]) -> None:
    """The rules one task's stored events keep: ``task.started`` first, then ``model.input`` (once the runtime
    took the task), at most one terminal event and nothing after it, and the tool-call graph (an ended task leaves
    no call open: each started call has exactly one ``tool.call.completed``)."""
    if not events:
        return
    task_id = events[0].trace.task_id or "?"
    types = [e.type for e in events]
    problems: list[str] = []
    if types[0] != EventType.TASK_STARTED:
        problems.append(f"task {task_id!r}: its first event is {types[0].value}, not task.started")
    # model.input follows once the runtime accepted the task; a task refused before that ends right away.
    if len(types) > 1 and types[1] != EventType.MODEL_INPUT \
            and not (len(types) == 2 and types[1] in TERMINAL_EVENT_TYPES):
        problems.append(f"task {task_id!r}: its second event is {types[1].value}, not model.input")
    if types.count(EventType.MODEL_INPUT) > 1:
        problems.append(f"task {task_id!r}: more than one model.input")
    terminals = [t for t in types if t in TERMINAL_EVENT_TYPES]
    if len(terminals) > 1:
        problems.append(f"task {task_id!r}: more than one terminal event: {[t.value for t in terminals]}")
    if terminals and types[-1] not in TERMINAL_EVENT_TYPES:
        problems.append(f"task {task_id!r}: events follow its terminal event")
    problems += _tool_problems(task_id, [(e.type, e.payload) for e in events], _TOOL_ORDER, ended=bool(terminals))
    problems += _question_problems(task_id, events, ended=bool(terminals))
    problems += _budget_problems(task_id, events)
    problems += _edit_problems(task_id, [(e.type, e.payload) for e in events])
    problems += _escalation_problems(task_id, events)
    if problems:
        raise InvariantError(problems)


def _escalation_problems(task_id: str, events: Sequence[NormalizedEvent]) -> list[str]:
    """An escalation names a request of its task asked before it and not yet settled (no decision of the
    approval's call, no answer to the question), and comes at most once per request."""
    asked: dict[str, tuple[str, int]] = {}  # approval id -> its call (id, attempt), while pending
    settled: set[str] = set()  # approvals decided, questions answered
    questions: set[str] = set()
    escalated: set[str] = set()
    problems: list[str] = []
    for event in events:
        payload = event.payload
        if isinstance(payload, ApprovalRequested) and event.type == EventType.APPROVAL_REQUESTED:
            asked[payload.approval_id] = (payload.tool_call_id, payload.attempt)
        elif event.type in (EventType.TOOL_CALL_APPROVED, EventType.TOOL_CALL_DENIED) \
                and isinstance(payload, ToolCallIdentity):
            settled |= {a for a, call in asked.items() if call == (payload.tool_call_id, payload.attempt)}
        elif isinstance(payload, QuestionRequested):
            questions.add(payload.question_id)
        elif isinstance(payload, QuestionAnswered):
            settled.add(payload.question_id)
        elif isinstance(payload, (ApprovalEscalated, QuestionEscalated)):
            what, known = (("approval", payload.approval_id in asked) if isinstance(payload, ApprovalEscalated)
                           else ("question", payload.question_id in questions))
            key = payload.approval_id if isinstance(payload, ApprovalEscalated) else payload.question_id
            where = f"task {task_id!r}: {event.type.value} seq={event.seq} of {what} {key!r}"
            if not known:
                problems.append(f"{where}: no such {what} was asked before it in the task")
            elif key in settled:
                problems.append(f"{where}: it was already settled; only a pending {what} is escalated")
            if key in escalated:
                problems.append(f"{where}: escalated again; a {what} is escalated at most once")
            escalated.add(key)
    return problems


def _question_problems(task_id: str, events: Sequence[NormalizedEvent], *, ended: bool) -> list[str]:
    """Each ``question.requested`` has exactly one ``question.answered`` after it (once its task has ended, every
    question has its answer), and nothing answers a question that was not asked."""
    asked: dict[str, int] = {}
    answers: defaultdict[str, int] = defaultdict(int)
    problems: list[str] = []
    for event in events:
        payload = event.payload
        if isinstance(payload, QuestionRequested):
            if payload.question_id in asked:
                problems.append(f"task {task_id!r}: question {payload.question_id!r} asked twice")
            asked[payload.question_id] = event.seq
        elif isinstance(payload, QuestionAnswered):
            if payload.question_id not in asked:
                problems.append(f"task {task_id!r}: question {payload.question_id!r} answered (seq={event.seq}) "
                                "but never asked before")
            answers[payload.question_id] += 1
    for question_id, count in answers.items():
        if count > 1:
            problems.append(f"task {task_id!r}: question {question_id!r} answered {count} times; exactly one "
                            "answer per question")
    if ended:
        unanswered = [q for q in asked if not answers[q]]
        if unanswered:
            problems.append(f"task {task_id!r}: question(s) {unanswered} never answered, yet the task ended: its "
                            "end closes them with a question.answered")
    return problems


def _budget_problems(task_id: str, events: Sequence[NormalizedEvent]) -> list[str]:
    """A budget reached ends its task: one ``budget.reached``, then (once the task ends) ``task.stopped`` with reason
    ``budget_reached``; and that reason only after a ``budget.reached``."""
    reached = [i for i, e in enumerate(events) if e.type == EventType.BUDGET_REACHED]
    last = events[-1]
    by_budget = last.type == EventType.TASK_STOPPED and isinstance(last.payload, TaskStopped) \
        and last.payload.reason == BUDGET_REACHED_REASON
    problems = []
    if len(reached) > 1:
        problems.append(f"task {task_id!r}: more than one budget.reached ({len(reached)})")
    if reached and last.type in TERMINAL_EVENT_TYPES and not by_budget:
        problems.append(f"task {task_id!r}: budget.reached is followed by {last.type.value}, not task.stopped with "
                        f"reason {BUDGET_REACHED_REASON}")
    if by_budget and not reached:
        problems.append(f"task {task_id!r}: task.stopped with reason {BUDGET_REACHED_REASON} but no budget.reached")
    return problems


def _tool_problems(task_id: str, events: Sequence[tuple[EventType, object]], order: dict[EventType, int],
                   *, ended: bool = False) -> list[str]:
    """The tool-call graph: per call (id and attempt) one request first, its events in ``order``, at most one
    decision, and nothing run without an approval (where decisions are in the stream)."""
    calls: defaultdict[tuple[str, int], list[EventType]] = defaultdict(list)
    for event_type, payload in events:
        if event_type in order and isinstance(payload, ToolCallIdentity):
            calls[(payload.tool_call_id, payload.attempt)].append(event_type)
    problems: list[str] = []
    for (call_id, attempt), seen in calls.items():
        name = f"task {task_id!r}: tool call {call_id!r} (attempt {attempt})"
        ranks = [order[t] for t in seen]
        if seen[0] != EventType.TOOL_CALL_REQUESTED or seen.count(EventType.TOOL_CALL_REQUESTED) != 1:
            problems.append(f"{name} must begin with exactly one tool.call.requested: {[t.value for t in seen]}")
        elif ranks != sorted(ranks):
            problems.append(f"{name} is out of order: {[t.value for t in seen]}")
        if EventType.TOOL_CALL_APPROVED not in order:
            continue  # a worker's stream: the decisions are the driver's requests, not events
        decisions = [t for t in seen if t in (EventType.TOOL_CALL_APPROVED, EventType.TOOL_CALL_DENIED)]
        if len(decisions) > 1:
            problems.append(f"{name} has more than one decision: {[t.value for t in decisions]}")
        ran = EventType.TOOL_CALL_STARTED in seen or EventType.TOOL_CALL_COMPLETED in seen
        if ran and decisions != [EventType.TOOL_CALL_APPROVED]:
            problems.append(f"{name} ran without an approval")
        if EventType.TOOL_CALL_COMPLETED in seen and EventType.TOOL_CALL_STARTED not in seen:
            problems.append(f"{name} completed without having started")
        if (completed := seen.count(EventType.TOOL_CALL_COMPLETED)) > 1:
            problems.append(f"{name} completed {completed} times; a call completes exactly once")
        if ended and EventType.TOOL_CALL_STARTED in seen and not completed:
            problems.append(f"{name} started and never completed, yet its task ended: a call cut short by its "
                            "task's end is completed with is_error and cut_short")
    return problems


#: Events stored in a session outside its tasks' lifetimes.
_SESSION_LEVEL = frozenset({EventType.GRANT_REVOKED})


def _grant_problems(events: Sequence[NormalizedEvent]) -> list[str]:
    """Grants decide only while they exist: a ``grant.<scope>`` evaluation names a grant created before it in this
    session (a fork's copies of its parent's are history, not grants), not revoked before it, of the same tool, and
    for a ``task`` grant of the same task; a revocation names a grant of the session, once."""
    problems: list[str] = []
    forked_at = 0
    if events and isinstance(events[0].payload, SessionCreated) and events[0].payload.forked_from is not None:
        forked_at = events[0].payload.forked_from.seq
    created: dict[str, tuple[GrantCreated, str | None]] = {}
    revoked: set[str] = set()
    requested: dict[tuple[str | None, str, int], str] = {}
    for event in events:
        payload = event.payload
        if event.seq <= forked_at:
            continue
        if isinstance(payload, ToolCallRequested) and event.type == EventType.TOOL_CALL_REQUESTED:
            requested[(event.trace.task_id, payload.tool_call_id, payload.attempt)] = payload.tool_name
        elif isinstance(payload, GrantCreated):
            created[payload.grant_id] = (payload, event.trace.task_id)
        elif isinstance(payload, GrantRevoked):
            if payload.grant_id not in created:
                problems.append(f"grant.revoked seq={event.seq} names grant {payload.grant_id!r}, which the session "
                                "never created")
            elif payload.grant_id in revoked:
                problems.append(f"grant {payload.grant_id!r} is revoked twice (again at seq={event.seq})")
            revoked.add(payload.grant_id)
        elif isinstance(payload, ToolCallPolicyEvaluated) and (payload.rule or "").startswith("grant."):
            where = f"tool call {payload.tool_call_id!r} decided at seq={event.seq} by {payload.rule}"
            grant = created.get(payload.grant_id or "")
            if grant is None:
                problems.append(f"{where} names grant {payload.grant_id!r}, not created earlier in this session")
                continue
            if payload.grant_id in revoked:
                problems.append(f"{where} names grant {payload.grant_id!r}, revoked before it")
            made, _ = grant
            if made.scope is GrantScope.TASK and made.task_id != event.trace.task_id:
                problems.append(f"{where} names task grant {made.grant_id!r} of task {made.task_id!r}, not its own "
                                f"({event.trace.task_id!r})")
            tool = requested.get((event.trace.task_id, payload.tool_call_id, payload.attempt))
            if tool is not None and tool != made.tool_name:
                problems.append(f"{where} names grant {made.grant_id!r} of tool {made.tool_name!r}, not {tool!r}")
    return problems


def _edit_problems(task_id: str, events: Sequence[tuple[EventType, object]]) -> list[str]:
    """An input an approver edited: the call's events up to the answer carry the original's hash, those after it
    the edited input's (and an edited input, when inline, hashes to it)."""
    problems: list[str] = []
    expected: dict[tuple[str, int], str] = {}
    for event_type, payload in events:
        if not isinstance(payload, ToolCallIdentity):
            continue
        key = (payload.tool_call_id, payload.attempt)
        if key in expected and payload.input_hash != expected[key]:
            problems.append(f"task {task_id!r}: tool call {key[0]!r} (attempt {key[1]}): {event_type.value} carries "
                            f"input_hash {payload.input_hash}, not the edited input's {expected[key]}")
        if isinstance(payload, ToolCallPolicyEvaluated) and payload.edited_input_hash is not None:
            expected[key] = payload.edited_input_hash
            if payload.edited_input is not None and canonical_hash(payload.edited_input) != payload.edited_input_hash:
                problems.append(f"task {task_id!r}: tool call {key[0]!r}: its edited input does not hash to "
                                f"edited_input_hash {payload.edited_input_hash}")
    return problems


def _runs(numbers: Sequence[int], shown: int = 12) -> str:
    """``numbers`` in short: the first few, and where they first break the 1, 2, 3 … run."""
    broken = next((i for i, n in enumerate(numbers) if n != i + 1), None)
    head = ", ".join(map(str, numbers[:shown])) + (" …" if len(numbers) > shown else "")
    return head if broken is None else f"{head} (first off at position {broken + 1}: {numbers[broken]})"
