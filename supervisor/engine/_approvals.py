"""Approvals: a tool call the policy cannot decide alone waits for a human's decision, recorded in the store.

Every "ask" becomes an approval row before anyone is asked (and an ``approval.requested`` event, so a UI
following the stream sees it), is decided once — by the task's own approver (a terminal, an embedding app) or
over the API by whoever may touch the namespace — and ends as approved, denied or expired. It expires to a denial
after the timeout, and is closed (expired, with the reason) when its task ends first. Pending approvals survive
an API reconnect and are listed after a supervisor restart as expired: their task's worker died with the old one.

A decision may reach further than its call (``scope``, and a rule's ``pattern``: the tool flow makes it a grant)
and may edit the call's input: both are checked here against the call asked about (``DecisionRefused``, naming the
field) before the decision is recorded, and kept for the waiting call (``answer_of``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import trio

from codesdk.protocol import ApprovalEscalated, ApprovalState, EventType, GrantPattern, GrantScope, utc_now

from ..ids import new_id
from ..store import ApprovalDecided, ApprovalRecord, ApprovalRecords
from ..tools import ApprovalRequest, Approver, ApproverAnswer, pattern_kinds
from ._audience import (
    APPROVAL_KIND,
    NOBODY_COULD_ANSWER,
    Audience,
    Route,
    RoutingPolicy,
    Unattended,
    await_answer,
    expiry_reason,
    nobody_reason,
    route,
)
from ._runs import PendingEvent, TaskRun

log = logging.getLogger("codesdk.supervisor.approvals")

#: Default seconds an approval waits for a human before it expires (and the call is denied).
APPROVAL_TIMEOUT_S = 15 * 60
#: ``decided_by`` of what nobody decided (expiry, a failing approver, the task's end).
BY_CODESDK = "codesdk"
#: ``decided_by`` of the task's own approver.
BY_APPROVER = "approver"


#: What is wrong with an input for a tool (``ToolRegistry.input_problems``): ``loc``/``msg``/``type`` each.
InputProblems = Callable[[str, Any], list[dict[str, Any]]]
#: Stores a running task's events (``RunRecorder.append``): how an escalation is recorded.
AppendEvents = Callable[[TaskRun, Sequence[PendingEvent]], Awaitable[bool]]


class DecisionRefused(ValueError):
    """A decision that cannot apply to the call asked about; ``field`` names what is wrong (``pattern``, ``input``,
    ``input.path`` …). The approval stays pending."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class _Asked:
    request: ApprovalRequest
    runs_here: bool  # the supervisor runs the call (so it can run it with an edited input)


class ApprovalBroker:
    def __init__(self, store: ApprovalRecords, timeout_s: float = APPROVAL_TIMEOUT_S,
                 input_problems: InputProblems | None = None, *, audience: Audience | None = None,
                 routing: RoutingPolicy | None = None, append: AppendEvents | None = None) -> None:
        self.store = store
        self.timeout_s = timeout_s
        self.input_problems = input_problems
        #: Who can answer (``_audience``), and the operator's routing (None: every approval waits its timeout).
        self.audience = audience or Audience()
        self.routing = routing
        self._append = append
        self._routes: dict[str, Route] = {}
        self._waiting: dict[str, trio.Event] = {}
        self._asked: dict[str, _Asked] = {}
        self._answers: dict[str, ApproverAnswer] = {}

    async def open(self, run: TaskRun, request: ApprovalRequest, *, runs_here: bool = True) -> ApprovalRecord:
        """Record the pending approval (before anyone is asked). ``runs_here``: the supervisor runs the call (an
        approver may edit its input)."""
        own = run.approver is not None
        answerable = own or self.audience.reachable(run.namespace, APPROVAL_KIND)
        if not answerable and self.routing is not None:  # a client that has just started the task, attaching
            answerable = await self.audience.wait_reachable(run.namespace, APPROVAL_KIND, self.routing.attach_grace_s)
        now = utc_now()
        routed = route(self.routing, answerable, self.timeout_s, now, own=own)
        approval_id = new_id("apr")
        self._routes[approval_id] = routed  # before it is listed: a listing shows its routing
        try:
            record = await self._create(run, request, approval_id, routed.timeout_s, now)
        except BaseException:
            self._routes.pop(approval_id, None)
            raise
        self._asked[approval_id] = _Asked(request, runs_here)
        return record

    def route_of(self, approval_id: str) -> Route | None:
        """How a pending approval waiting here was routed when it opened (None: not waiting here)."""
        return self._routes.get(approval_id)

    def answer_of(self, approval_id: str) -> ApproverAnswer | None:
        """The whole decision on an approval decided here (scope, pattern, edited input); taken once."""
        return self._answers.pop(approval_id, None)

    def check(self, approval_id: str, answer: ApproverAnswer) -> None:
        """``DecisionRefused`` when ``answer`` cannot apply to the call asked about: a pattern of a kind the tool's
        input has not, a pattern without scope ``rule`` (or none with it), an edited input on a denial, on a call
        the runtime runs, or that the tool would refuse."""
        if answer.scope is GrantScope.RULE and answer.pattern is None:
            raise DecisionRefused("pattern", "scope 'rule' needs a pattern: {\"kind\": \"path\", \"prefix\": …}, "
                                             "{\"kind\": \"command\", \"argv\": […]} or {\"kind\": \"host\", …}")
        if answer.pattern is not None and answer.scope is not GrantScope.RULE:
            raise DecisionRefused("pattern", f"a pattern goes with scope 'rule', not {answer.scope.value!r}")
        if answer.input is not None and not answer.allow:
            raise DecisionRefused("input", "an edited input goes with an allow; a denial runs nothing")
        asked = self._asked.get(approval_id)
        if asked is None:
            return  # not waiting here: recording the decision says why (already decided, or expired)
        tool = asked.request.tool_name
        if answer.pattern is not None:
            kinds = pattern_kinds(tool)
            if answer.pattern.kind not in kinds:
                takes = f"it takes a {' or '.join(sorted(kinds))} pattern" if kinds else \
                    "no pattern applies to it: decide with scope 'task' or 'session'"
                raise DecisionRefused("pattern", f"a {answer.pattern.kind} pattern cannot match calls of {tool}; "
                                                 f"{takes}")
        if answer.input is not None:
            if not asked.runs_here:
                raise DecisionRefused("input", f"{tool} is run by the runtime itself, which cannot be given an "
                                               "edited input; allow or deny it as asked")
            problems = self.input_problems(tool, dict(answer.input)) if self.input_problems else []
            if problems:
                first = problems[0]
                loc = str(first.get("loc") or "")
                raise DecisionRefused(f"input.{loc}" if loc and loc != "<input>" else "input",
                                      f"the edited input is not valid for {tool}: {first.get('msg')}")

    async def _create(self, run: TaskRun, request: ApprovalRequest, approval_id: str, timeout_s: float,
                      now: datetime) -> ApprovalRecord:
        identity = request.identity
        return await self.store.create_approval(ApprovalRecord(
            approval_id=approval_id, session_id=run.session_id, task_id=run.task_id,
            namespace=run.namespace, tool_call_id=identity.tool_call_id if identity else "",
            attempt=identity.attempt if identity else 1, tool_name=request.tool_name,
            tool_class=request.tool_class.value, input=dict(request.input), reason=request.reason,
            state=ApprovalState.PENDING, created_at=now, expires_at=now + timedelta(seconds=timeout_s)))

    async def wait(self, run: TaskRun, record: ApprovalRecord, request: ApprovalRequest) -> ApprovalRecord:
        """The approval once decided: by the task's approver if it has one, else over the API (``decide``); by
        expiry after the timeout. When the task ends first, the approval is closed with that reason."""
        approval_id = record.approval_id
        decided = trio.Event()
        self._waiting[approval_id] = decided
        phase = run.telemetry.approval_wait(request.tool_name)
        outcome = "cancelled"
        try:
            # The approval has been listed (and streamed as ``approval.requested``) since ``open``: a decision
            # made before the line above found nobody to wake. Looked up only now, so none falls in between.
            current = await self.store.get_approval(approval_id)
            if current.state != ApprovalState.PENDING:
                outcome = current.state.value
                return current
            routed = self._routes.get(approval_id) or route(None, True, self.timeout_s, record.created_at)
            if routed.fallback is Unattended.DENY and self.routing is not None:
                closed = await self.close(approval_id, nobody_reason(run.namespace, APPROVAL_KIND, self.routing),
                                          state=ApprovalState.DENIED)
                outcome = closed.state.value
                return closed
            if run.approver is None:
                routed = await await_answer(self.audience, run.namespace, APPROVAL_KIND, routed, decided,
                                            answerable=lambda: self._answerable(record),
                                            escalate=lambda: self._escalate(run, record))
            else:
                with trio.move_on_after(routed.timeout_s):
                    await self._ask_approver(run.approver, approval_id, request)
            why = expiry_reason(f"no decision within {routed.timeout_s:.0f} s", routed, self.audience,
                                run.namespace, APPROVAL_KIND, self.routing)
            closed = await self.close(approval_id, why)
            outcome = closed.state.value
            return closed
        except trio.Cancelled:
            with trio.CancelScope(shield=True):  # the task ended while waiting: close the approval too
                await self.close_for_end(run, approval_id)
            raise
        finally:
            phase.end(outcome)
            self._waiting.pop(approval_id, None)
            self._asked.pop(approval_id, None)
            self._routes.pop(approval_id, None)

    async def _answerable(self, record: ApprovalRecord) -> Route:
        """Someone can answer an approval nobody could when it opened: its whole timeout, from when it opened."""
        routed = route(self.routing, True, self.timeout_s, record.created_at)
        await self.store.extend_approval(record.approval_id,
                                         record.created_at + timedelta(seconds=routed.timeout_s))
        self._routes[record.approval_id] = routed  # after the store: a listing never shows the old deadline
        return routed

    async def _escalate(self, run: TaskRun, record: ApprovalRecord) -> None:
        """Record ``approval.escalated`` (once: its wait calls this once) if the approval is still pending."""
        if self._append is None:
            return
        record = await self.store.get_approval(record.approval_id)  # its deadline as it is now (it may have moved)
        if record.state != ApprovalState.PENDING:
            return
        escalated = ApprovalEscalated(approval_id=record.approval_id, tool_call_id=record.tool_call_id,
                                      tool_name=record.tool_name, expires_at=record.expires_at,
                                      pending_s=max(0.0, (utc_now() - record.created_at).total_seconds()))
        await self._append(run, [PendingEvent(EventType.APPROVAL_ESCALATED, escalated)])

    async def close_for_end(self, run: TaskRun, approval_id: str) -> ApprovalRecord:
        """The task ended before the approval was decided (at any point after it was opened): close it, saying how
        the task ended."""
        ended = "stopped" if run.stop is not None else (run.terminal_type or "task.ended").removeprefix("task.")
        self._asked.pop(approval_id, None)
        self._answers.pop(approval_id, None)
        self._routes.pop(approval_id, None)
        return await self.close(approval_id, f"the task was {ended} before a decision")

    async def _ask_approver(self, approver: Approver, approval_id: str, request: ApprovalRequest) -> None:
        try:
            answer = await approver(request)
        except Exception as exc:  # the caller's approver broke: deny, never run unapproved
            log.exception("approver failed for %s", approval_id)
            await self.close(approval_id, f"approval failed: {type(exc).__name__}: {exc}", state=ApprovalState.DENIED)
            return
        try:
            self.check(approval_id, answer)
        except DecisionRefused as exc:  # the caller's approver answered what cannot be: deny, never guess
            await self.close(approval_id, f"approval failed: {exc.field}: {exc}", state=ApprovalState.DENIED)
            return
        try:
            decision = _decision(answer.allow)
            await self.store.decide_approval(approval_id, decision, BY_APPROVER, answer.reason or decision.value)
            self._answers[approval_id] = answer
        except ApprovalDecided:
            pass  # decided over the API meanwhile: the first decision stands

    async def close(self, approval_id: str, why: str, state: ApprovalState = ApprovalState.EXPIRED) -> ApprovalRecord:
        """Decide a still-pending approval as nobody's decision (``BY_CODESDK``); the final record either way."""
        record = await self.store.get_approval(approval_id)
        if record.state != ApprovalState.PENDING:
            return record
        try:
            return await self.store.decide_approval(approval_id, state, BY_CODESDK, why)
        except ApprovalDecided:
            return await self.store.get_approval(approval_id)

    async def decide(self, approval_id: str, allow: bool, decided_by: str, reason: str, *,
                     scope: GrantScope = GrantScope.ONCE, pattern: GrantPattern | None = None,
                     input: Mapping[str, Any] | None = None) -> ApprovalRecord:
        """Record a human's decision (``ApprovalDecided`` if there already is one; ``DecisionRefused`` if it cannot
        apply to the call, see ``check``) and wake the waiting call."""
        answer = ApproverAnswer(allow=allow, reason=reason, scope=scope, pattern=pattern, input=input)
        self.check(approval_id, answer)
        record = await self.store.decide_approval(approval_id, _decision(allow), decided_by, reason)
        self._answers[approval_id] = answer
        waiting = self._waiting.get(approval_id)
        if waiting is not None:
            waiting.set()
        return record

    async def expire_orphans(self, namespace: str) -> int:
        """Approvals left pending in a namespace taken over from a supervisor that is gone (or at start-up) can
        never be answered — close them."""
        orphans = await self.store.list_approvals(state=ApprovalState.PENDING, namespaces=[namespace])
        for record in orphans:
            await self.close(record.approval_id, "the supervisor restarted before a decision; the task ended")
        return len(orphans)


def unattended(record: ApprovalRecord) -> bool:
    """Denied because nobody could answer it (``--unattended deny``): unanswered, not an approver's failure."""
    return record.decided_by == BY_CODESDK and (record.decision_reason or "").startswith(NOBODY_COULD_ANSWER)


def _decision(allow: bool) -> ApprovalState:
    return ApprovalState.APPROVED if allow else ApprovalState.DENIED
