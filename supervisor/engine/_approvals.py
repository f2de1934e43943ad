"""Durable approvals: a tool call in an interactive task waits for a human's decision, recorded in the store.

The pending approval is a row before anyone is asked, so it can be listed (and decided) from any API client,
survives an API reconnect, and is still listed after a supervisor restart (then as expired: its task's worker
died with the old supervisor). A decision is final and recorded once; no decision within the timeout is a denial
with a recorded reason.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

import trio

from protocol import utc_now

from ..store import ApprovalDecided, ApprovalRecord, EventStore, SessionRecord
from ..tools import ApprovalRequest, Approver, ApproverAnswer

#: Default seconds an approval waits for a human before it expires (and the call is denied).
APPROVAL_TIMEOUT_S = 15 * 60


class ApprovalBroker:
    def __init__(self, store: EventStore, timeout_s: float = APPROVAL_TIMEOUT_S) -> None:
        self.store = store
        self.timeout_s = timeout_s
        self._waiting: dict[str, trio.Event] = {}

    def approver_for(self, session: SessionRecord, task_id: str) -> Approver:
        async def approve(request: ApprovalRequest) -> ApproverAnswer:
            now = utc_now()
            identity = request.identity
            record = await self.store.create_approval(ApprovalRecord(
                approval_id=f"apr_{uuid.uuid4().hex[:16]}", session_id=session.session_id, task_id=task_id,
                namespace=session.namespace, tool_call_id=identity.tool_call_id if identity else "",
                attempt=identity.attempt if identity else 1, tool_name=request.tool_name,
                tool_class=request.tool_class.value, input=dict(request.input), reason=request.reason,
                state="pending", created_at=now, expires_at=now + timedelta(seconds=self.timeout_s)))
            decided = trio.Event()
            self._waiting[record.approval_id] = decided
            try:
                with trio.move_on_after(self.timeout_s):
                    await decided.wait()
            finally:
                self._waiting.pop(record.approval_id, None)
                with trio.CancelScope(shield=True):  # the task ended while waiting: close the approval too
                    final = await self._settle(record.approval_id, f"no decision within {self.timeout_s:.0f} s")
            return ApproverAnswer(allow=final.state == "approved", reason=final.decision_reason or final.state)

        return approve

    async def _settle(self, approval_id: str, why: str) -> ApprovalRecord:
        record = await self.store.get_approval(approval_id)
        if record.state != "pending":
            return record
        try:
            return await self.store.decide_approval(approval_id, "expired", "codesdk", why)
        except ApprovalDecided:
            return await self.store.get_approval(approval_id)

    async def decide(self, approval_id: str, allow: bool, decided_by: str, reason: str) -> ApprovalRecord:
        """Record a human's decision (``ApprovalDecided`` if there already is one) and wake the waiting call."""
        record = await self.store.decide_approval(approval_id, "approved" if allow else "denied", decided_by, reason)
        waiting = self._waiting.get(approval_id)
        if waiting is not None:
            waiting.set()
        return record

    async def expire_orphans(self) -> int:
        """At start-up: approvals left pending by a previous supervisor can never be answered — close them."""
        orphans = await self.store.list_approvals(state="pending")
        for record in orphans:
            await self._settle(record.approval_id, "the supervisor restarted before a decision; the task ended")
        return len(orphans)
