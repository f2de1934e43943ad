"""The one place the service's own records become the API's typed answers (``codesdk.protocol.api``): the store's
rows and the pool's status never reach the wire as they are, so a change to either cannot change the API."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from codesdk.protocol import (
    BlockKind,
    EventType,
    ModelOutputCompleted,
    TaskCompleted,
    ToolCallRequested,
    UsageReported,
    api,
)

from ..engine import Audience, GrantEntry, Route, WorkerEnvironment
from ..namespaces import EnvEntry
from ..store import ApprovalRecord, QuestionRecord, DroppedSession, EventLogReader, SessionRecord, TaskRecord
from ..store import AttemptRecord, DeliveryRecord, WebhookRecord


def session_answer(record: SessionRecord) -> api.Session:
    state = (api.SessionState.ARCHIVED if record.archived_at is not None
             else api.SessionState.BUSY if record.active_task_id is not None else api.SessionState.IDLE)
    return api.Session(session_id=record.session_id, runtime=record.runtime, namespace=record.namespace,
                       workspace=record.workspace, created_at=record.created_at, metadata=record.metadata,
                       runtime_session_id=record.runtime_session_id, last_seq=record.last_seq, title=record.title,
                       state=state, active_task_id=record.active_task_id, archived_at=record.archived_at,
                       forked_from=record.forked_from, isolation=record.isolation, budget=record.budget)


def budget_answer(record: SessionRecord) -> api.SessionBudgetView:
    budget = record.budget
    if budget is None:
        return api.SessionBudgetView(session_id=record.session_id)
    return api.SessionBudgetView(session_id=record.session_id, limits=budget.limits, spent=budget.spent,
                                 paused=budget.paused, paused_at=budget.paused_at,
                                 raise_pending=budget.paused is not None)


def deleted_answer(dropped: DroppedSession, workspace_removed: bool) -> api.DeletedSession:
    return api.DeletedSession(session_id=dropped.session.session_id, events=dropped.events,
                              stored_bytes=dropped.stored_bytes, blobs=len(dropped.blobs),
                              workspace_removed=workspace_removed)


def task_answer(record: TaskRecord, result: api.TaskResult | None = None) -> api.Task:
    return api.Task(task_id=record.task_id, session_id=record.session_id, state=api.TaskState(record.state),
                    runtime=record.runtime, created_at=record.created_at, started_at=record.started_at,
                    ended_at=record.ended_at, worker_pid=record.worker_pid, terminal_type=record.terminal_type,
                    error=record.error, metadata=record.metadata, result=result)


#: The events a task's result is made of (read filtered in SQL: its deltas are never decoded).
_RESULT_TYPES = (EventType.MODEL_OUTPUT_COMPLETED, EventType.USAGE_REPORTED, EventType.TOOL_CALL_REQUESTED,
                 EventType.TASK_COMPLETED)
_PAGE = 1000


async def task_result(store: EventLogReader, record: TaskRecord) -> api.TaskResult | None:
    """What an ended task came to (None while it runs): its final answer (the text and code blocks after its last
    tool call), its tool calls, the sums of its usage reports, its stop reason and duration."""
    if not record.state.is_terminal:
        return None
    output: list[api.OutputBlock] = []
    usage: dict[str, Any] = {"reports": 0}
    costs: list[float] = []
    tool_calls = 0
    stop_reason = None
    after = 0
    while True:
        page = await store.read_types(record.session_id, _RESULT_TYPES, after_seq=after, limit=_PAGE,
                                      task_id=record.task_id)
        for event in page:
            payload = event.payload
            if isinstance(payload, ModelOutputCompleted) and payload.kind != BlockKind.THINKING:
                output.append(api.OutputBlock(kind=payload.kind, text=payload.text, language=payload.language))
            elif isinstance(payload, ToolCallRequested):
                tool_calls += 1
                output.clear()  # what came before a tool call was not the answer
            elif isinstance(payload, UsageReported):
                usage["reports"] += 1
                for field in _TOKENS:
                    usage[field] = usage.get(field, 0) + getattr(payload, field)
                if payload.cost_usd is not None:
                    costs.append(payload.cost_usd)
            elif isinstance(payload, TaskCompleted):
                stop_reason = payload.stop_reason
        if len(page) < _PAGE:
            break
        after = page[-1].seq
    duration = None
    if record.started_at is not None and record.ended_at is not None:
        duration = max(0.0, (record.ended_at - record.started_at).total_seconds() * 1000)
    return api.TaskResult(stop_reason=stop_reason, output=tuple(output), text="".join(b.text for b in output),
                          tool_calls=tool_calls, usage=api.Usage(**usage, cost_usd=sum(costs) if costs else None),
                          duration_ms=duration)


_TOKENS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "reasoning_tokens")


def routing_answer(audience: Audience, namespace: str, kind: str, route: Route | None) -> api.Routing:
    """Who could answer a pending request now (``route``: how it was routed when it opened, if it waits here)."""
    streams, webhook = audience.streams(namespace), audience.webhook_takes(namespace, kind)
    consoles, own = audience.consoles(namespace), route is not None and route.own
    return api.Routing(answerable=own or streams > 0 or consoles > 0 or webhook, streams=streams, consoles=consoles,
                       webhook=webhook,
                       fallback=api.UnattendedFallback(route.fallback.value) if route and route.fallback else None,
                       escalates_at=route.escalates_at if route is not None else None)


def question_answer(record: QuestionRecord, routing: api.Routing | None = None) -> api.AskedQuestion:
    request = record.request
    return api.AskedQuestion(question_id=record.question_id, session_id=record.session_id, task_id=record.task_id,
                             namespace=record.namespace, source=request.source, message=request.message,
                             origin=request.origin, questions=request.questions, state=record.state,
                             created_at=record.created_at, expires_at=record.expires_at,
                             answered_at=record.answered_at, answered_via=record.answered_via,
                             answered_by=record.answered_by, answers=record.answers, reason=record.reason,
                             routing=routing)


def approval_answer(record: ApprovalRecord, routing: api.Routing | None = None) -> api.Approval:
    return api.Approval(approval_id=record.approval_id, session_id=record.session_id, task_id=record.task_id,
                        namespace=record.namespace, tool_call_id=record.tool_call_id, attempt=record.attempt,
                        tool_name=record.tool_name, tool_class=record.tool_class, input=record.input,
                        reason=record.reason, state=record.state, created_at=record.created_at,
                        expires_at=record.expires_at, decided_at=record.decided_at, decided_by=record.decided_by,
                        decision_reason=record.decision_reason, routing=routing)


def grant_answer(session_id: str, entry: GrantEntry) -> api.Grant:
    created, revoked = entry.created, entry.revoked
    return api.Grant(grant_id=created.grant_id, session_id=session_id, scope=created.scope, decision=created.decision,
                     tool_name=created.tool_name, pattern=created.pattern, approval_id=created.approval_id,
                     tool_call_id=created.tool_call_id, task_id=created.task_id, created_by=created.created_by,
                     created_at=entry.created_at, created_seq=entry.created_seq,
                     state=api.GrantState.ACTIVE if revoked is None else api.GrantState.REVOKED,
                     revoked_at=entry.revoked_at, revoked_by=revoked.revoked_by if revoked else None,
                     revoke_reason=(revoked.reason or None) if revoked else None)


def worker_answer(status: Mapping[str, object]) -> api.WorkerState:
    """One row of ``WorkerPool.status()``."""
    return api.WorkerState.model_validate(status)


def env_answer(namespace: str, entries: Sequence[EnvEntry]) -> api.EnvList:
    return api.EnvList(namespace=namespace, variables=tuple(
        api.EnvVariable(name=entry.name, fingerprint=entry.fingerprint) for entry in entries))


def runtime_env_answer(namespace: str, seen: WorkerEnvironment) -> api.RuntimeEnvView:
    return api.RuntimeEnvView(namespace=namespace, env=seen.env, worker_pid=seen.pid, uid=seen.uid, gid=seen.gid,
                              cwd=seen.cwd, workspace=seen.workspace, runtimes=seen.runtimes)


def webhook_answer(record: WebhookRecord) -> api.Webhook:
    """A webhook without its secrets (shown once, when made or rotated)."""
    return api.Webhook(id=record.webhook_id, url=record.url, kinds=record.kinds, namespace=record.namespace,
                       description=record.description, created_at=record.created_at, disabled=record.disabled)


def delivery_answer(record: DeliveryRecord, attempts: Sequence[AttemptRecord] | None = None) -> api.Delivery:
    """A delivery: its count of attempts, or (``attempts`` given) the attempts themselves."""
    tried: int | tuple[api.DeliveryAttempt, ...] = record.attempts if attempts is None else tuple(
        api.DeliveryAttempt(at=a.at, status=a.status, error=a.error, duration_ms=a.duration_ms) for a in attempts)
    return api.Delivery(id=record.delivery_id, webhook_id=record.webhook_id, kind=record.kind,
                        namespace=record.namespace, session_id=record.session_id, task_id=record.task_id,
                        state=record.state, attempts=tried, next_attempt_at=record.next_attempt_at,
                        last_error=record.last_error, created_at=record.created_at,
                        delivered_at=record.delivered_at)
