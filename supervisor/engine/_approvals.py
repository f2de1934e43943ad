"""Approvals: a tool call the policy cannot decide alone waits for a human's decision, recorded in the store.

Every "ask" becomes an approval row before anyone is asked (and an ``approval.requested`` event, so a UI
following the stream sees it), is decided once — by the task's own approver (a terminal, an embedding app) or
over the API by whoever may touch the namespace — and ends as approved, denied or expired. It expires to a denial
after the timeout, and is closed (expired, with the reason) when its task ends first. Pending approvals survive
an API reconnect and are listed after a supervisor restart as expired: their task's worker died with the old one.
"""

from __future__ import annotations

import logging
from datetime import timedelta

import trio

from codesdk.protocol import ApprovalState, utc_now

from ..ids import new_id
from ..store import ApprovalDecided, ApprovalRecord, ApprovalRecords
from ..tools import ApprovalRequest, Approver
from ._runs import TaskRun

log = logging.getLogger("codesdk.supervisor.approvals")

#: Default seconds an approval waits for a human before it expires (and the call is denied).
APPROVAL_TIMEOUT_S = 15 * 60
#: ``decided_by`` of what nobody decided (expiry, a failing approver, the task's end).
BY_CODESDK = "codesdk"
#: ``decided_by`` of the task's own approver.
BY_APPROVER = "approver"


class ApprovalBroker:
    def __init__(self, store: ApprovalRecords, timeout_s: float = APPROVAL_TIMEOUT_S) -> None:
        self.store = store
        self.timeout_s = timeout_s
        self._waiting: dict[str, trio.Event] = {}

    async def open(self, run: TaskRun, request: ApprovalRequest) -> ApprovalRecord:
        """Record the pending approval (before anyone is asked)."""
        now = utc_now()
        identity = request.identity
        return await self.store.create_approval(ApprovalRecord(
            approval_id=new_id("apr"), session_id=run.session_id, task_id=run.task_id,
            namespace=run.namespace, tool_call_id=identity.tool_call_id if identity else "",
            attempt=identity.attempt if identity else 1, tool_name=request.tool_name,
            tool_class=request.tool_class.value, input=dict(request.input), reason=request.reason,
            state=ApprovalState.PENDING, created_at=now, expires_at=now + timedelta(seconds=self.timeout_s)))

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
            with trio.move_on_after(self.timeout_s):
                if run.approver is None:
                    await decided.wait()
                else:
                    await self._ask_approver(run.approver, approval_id, request)
            closed = await self.close(approval_id, f"no decision within {self.timeout_s:.0f} s")
            outcome = closed.state.value
            return closed
        except trio.Cancelled:
            with trio.CancelScope(shield=True):  # the task ended while waiting: close the approval too
                await self.close_for_end(run, approval_id)
            raise
        finally:
            phase.end(outcome)
            self._waiting.pop(approval_id, None)

    async def close_for_end(self, run: TaskRun, approval_id: str) -> ApprovalRecord:
        """The task ended before the approval was decided (at any point after it was opened): close it, saying how
        the task ended."""
        ended = "stopped" if run.stop is not None else (run.terminal_type or "task.ended").removeprefix("task.")
        return await self.close(approval_id, f"the task was {ended} before a decision")

    async def _ask_approver(self, approver: Approver, approval_id: str, request: ApprovalRequest) -> None:
        try:
            answer = await approver(request)
        except Exception as exc:  # the caller's approver broke: deny, never run unapproved
            log.exception("approver failed for %s", approval_id)
            await self.close(approval_id, f"approval failed: {type(exc).__name__}: {exc}", state=ApprovalState.DENIED)
            return
        try:
            decision = _decision(answer.allow)
            await self.store.decide_approval(approval_id, decision, BY_APPROVER, answer.reason or decision.value)
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

    async def decide(self, approval_id: str, allow: bool, decided_by: str, reason: str) -> ApprovalRecord:
        """Record a human's decision (``ApprovalDecided`` if there already is one) and wake the waiting call."""
        record = await self.store.decide_approval(approval_id, _decision(allow), decided_by, reason)
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


def _decision(allow: bool) -> ApprovalState:
    return ApprovalState.APPROVED if allow else ApprovalState.DENIED
