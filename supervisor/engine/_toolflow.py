"""One tool call attempt, from request to result: replay check, policy, execution, answer to the worker.

The events of an attempt always read requested -> policy_evaluated* -> approved|denied -> started -> completed.
A call with a side effect (a write, a command) has its decision and tool.call.started durable before it runs;
a read-only call (``ToolClass.READ_ONLY``) runs first and its whole record is stored in one commit after it (a
read has nothing that must be durable before it runs); a call that asks a human stores its request first.
Nothing is stored or run once the task has ended (the port's ``append`` refuses and the task's tool nursery is
cancelled). The flow reaches the engine only through its ``ToolFlowPort``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import trio

from codesdk.protocol import (
    ApprovalRequested,
    GrantCreated,
    GrantDecision,
    GrantScope,
    ApprovalState,
    EventType,
    ExecutedBy,
    InteractionMode,
    Model,
    PolicyDecision,
    PolicySource,
    Rpc,
    SandboxSummary,
    SendToolApprovedParams,
    SendToolDeniedParams,
    SendToolResultParams,
    ToolClass,
    ToolCallApproved,
    ToolCallCompleted,
    ToolCallDenied,
    ToolCallIdentity,
    ToolCallPolicyEvaluated,
    ToolCallRequested,
    ToolCallStarted,
    ToolOutputCompleted,
    ToolOutputDelta,
    canonical_json,
    sha256_hex,
)

from ..ids import new_id
from ..store import INLINE_BLOB_MAX, ApprovalRecord
from ..tools import (
    RULES,
    ApprovalNeeded,
    ApproverAnswer,
    PolicyOutcome,
    PolicyPayload,
    PolicyRequest,
    ToolContext,
    ToolRegistry,
    ToolResult,
    complete,
    evaluate,
    evaluation_payloads,
    is_replay_safe,
    policy_payloads,
    runtime_tool_spec,
)
from ._approvals import BY_CODESDK, unattended
from ._runs import EngineStats, PendingEvent, TaskRun
from ._telemetry import Phase
from ._toolport import ToolAnswer, ToolFlowPort

log = logging.getLogger("codesdk.supervisor.tools")

Tooling = ToolRegistry

#: Characters of a tool result kept inline in tool.call.completed (the full result is a blob).
PREVIEW_CHARS = 500
#: Tool inputs larger than this (canonical JSON bytes) are stored as a blob and referenced.
INLINE_INPUT_MAX_BYTES = 16 * 1024
#: The rest of an attempt once its decision is stored, to run in the task's tool nursery.
Rest = Callable[[], Awaitable[None]]
#: A tool result at most this big (characters of its strings and keys, and JSON values) is canonicalized on the
#: event loop; a bigger one in a worker thread. Canonical JSON (rfc8785, pure Python) costs about 20 µs per KiB of
#: source-like text and about 2 µs per JSON value, so a typical small result (a short read, a write's summary, an
#: error) takes well under the 0.2 ms the thread hop costs. The thread only keeps the loop going for work longer
#: than the GIL's switch interval (5 ms; the work holds the GIL throughout): within these bounds even text that is
#: all escapes (about 0.5 µs per character, some 4 ms at the bound) stays under that, so running inline does not
#: hold the loop longer than the thread would have.
INLINE_CANONICAL_MAX_CHARS = 8 * 1024
INLINE_CANONICAL_MAX_VALUES = 64


def _is_small_json(value: Any) -> bool:
    """Whether ``value`` has at most ``INLINE_CANONICAL_MAX_VALUES`` JSON values and ``INLINE_CANONICAL_MAX_CHARS``
    characters of strings and keys. Gives up as soon as either is passed, so it costs little for a big result."""
    chars, values, todo = 0, 1, [value]
    while todo:
        item = todo.pop()
        if isinstance(item, str):
            chars += len(item)
        elif isinstance(item, (dict, list, tuple)):
            values += len(item)
            if values > INLINE_CANONICAL_MAX_VALUES:
                return False
            if isinstance(item, dict):
                chars += sum(len(key) for key in item if isinstance(key, str))
                todo.extend(item.values())
            else:
                todo.extend(item)
        if chars > INLINE_CANONICAL_MAX_CHARS:
            return False
    return True


async def _canonical_result(content: Any) -> bytes:
    """The canonical JSON of a tool result: inline when small (see ``INLINE_CANONICAL_MAX_CHARS``), else in a
    worker thread so a big result does not stall the event loop."""
    if _is_small_json(content):
        return canonical_json(content)
    return await trio.to_thread.run_sync(canonical_json, content)


def _preview(content: Any) -> str:
    text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
    return text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 1] + "…"


class ToolFlow:
    """Tool calls of running tasks. Remembers the session's completed calls so a replayed safe one is answered
    from the store."""

    def __init__(self, port: ToolFlowPort, stats: EngineStats) -> None:
        self._port = port
        self._stats = stats
        # (session_id, runtime_tool_call_id, tool_name, input_hash) -> completed payload, for replays
        self._completed: dict[tuple[str, str | None, str, str], ToolCallCompleted] = {}
        self._indexed_sessions: set[str] = set()

    async def requested(self, run: TaskRun, requested: ToolCallRequested) -> None:
        """A runtime's ``tool.call.requested``, handled in its worker's order. A repeat of a request already
        handled is dropped (counted); a new one gets our attempt number and input hash. Where nobody is asked,
        the request and its decision are stored here, in one commit (a read-only call is run here too, and
        stored with its result in that commit); the rest of the call runs in the task's tool nursery.
        ``CanonicalizationError`` if the input cannot be stored.

        While the supervisor holds the call (until its answer is sent) the task's idle clock does not run."""
        spec = self._port.tools.spec(requested.tool_name)
        phase = run.telemetry.tool_call(requested.tool_name, spec.tool_class.value if spec else "unknown")
        rest: Rest | None = None
        handed = False  # to the rest of the call, which ends the phase
        try:
            with run.clock.hold():
                rest = await self._requested(run, requested)
            if rest is not None and run.tools_nursery is not None:
                run.tools_nursery.start_soon(_held, run, rest, phase)
                handed = True
        finally:
            if not handed:
                phase.end("ok" if rest is None else "cancelled")

    async def _requested(self, run: TaskRun, requested: ToolCallRequested) -> Rest | None:
        """The rest of the call to run in the task's tool nursery, or None when nothing is left to do."""
        stamped = await self._stamp(run, requested)
        if stamped is None:
            return None
        requested, tool_input = stamped
        if requested.executed_by == ExecutedBy.SUPERVISOR and \
                run.params.interaction_mode != InteractionMode.INTERACTIVE:
            return await self._begin(run, requested, tool_input, request_stored=False)
        if not await self._port.append(run, [PendingEvent(EventType.TOOL_CALL_REQUESTED, requested)]):
            return None
        assert run.tools_nursery is not None
        handle = self._handle_runtime_call if requested.executed_by == ExecutedBy.RUNTIME else self._handle
        return partial(handle, run, requested, tool_input)

    async def _stamp(self, run: TaskRun, requested: ToolCallRequested,
                     ) -> tuple[ToolCallRequested, dict[str, Any]] | None:
        """The request with our attempt number and input hash (a large input moved to a blob), and its input;
        None for a repeat."""
        tool_input = requested.input or {}
        data = canonical_json(tool_input)
        input_hash = sha256_hex(data)  # ours, not the worker's word for it
        key = (requested.tool_call_id, requested.attempt, input_hash)
        if key in run.requests_seen:  # the same request again (a replayed notification): it is handled already
            self._stats.duplicate_events += 1
            log.warning("task %s: tool call %s (attempt %d) requested again; not run twice", run.task_id,
                        requested.tool_call_id, requested.attempt)
            return None
        run.requests_seen.add(key)
        attempt = run.attempts.get(requested.tool_call_id, 0) + 1
        run.attempts[requested.tool_call_id] = attempt
        if input_hash != requested.input_hash:
            self._stats.invalid_events += 1
            log.warning("task %s: worker's input_hash for %s was wrong", run.task_id, requested.tool_call_id)
        # input_ref is ours alone: a worker cannot have stored a blob, so one it names is not its call's input (and
        # the session's events name only blobs the supervisor put there: GET /v1/sessions/{id}/blobs/{ref}).
        update: dict[str, Any] = {"attempt": attempt, "input_hash": input_hash, "input_ref": None}
        if len(data) > INLINE_INPUT_MAX_BYTES:
            update.update(input=None, input_ref=await self._port.put_blob(run, data, "application/json"))
        return requested.model_copy(update=update), tool_input

    async def _handle(self, run: TaskRun, requested: ToolCallRequested, tool_input: dict[str, Any]) -> None:
        """The whole attempt, for a request already stored (tasks that may wait for a human)."""
        rest = await self._begin(run, requested, tool_input, request_stored=True)
        if rest is not None:
            await rest()

    async def _begin(self, run: TaskRun, requested: ToolCallRequested, tool_input: dict[str, Any], *,
                     request_stored: bool) -> Rest | None:
        """Replay check and policy, and store the decision — with the request itself when it is not stored yet,
        in one commit (one fsync fewer per call). Returns the rest of the attempt (run the tool, store and send
        the result, or send the denial), to be run in the task's tool nursery; None if nothing is left to do."""
        identity = _identity(requested)
        prefix = [] if request_stored else [PendingEvent(EventType.TOOL_CALL_REQUESTED, requested)]
        tools = self._port.tools
        spec = tools.spec(requested.tool_name)

        replay = await self._replayable(run, requested) if spec is not None and is_replay_safe(spec) else None
        if replay is not None:
            if not await self._record_replay(run, identity, replay, prefix):
                return None
            return partial(self._send_replayed, run, identity, replay)

        decided = await self._decide(run, identity, requested, tool_input, prefix, PolicyRequest(
            tool_name=requested.tool_name, tool=spec, permission_mode=run.params.permission_mode,
            interaction_mode=run.params.interaction_mode, tools_hash=tools.manifest_hash(),
            input=tool_input, identity=identity, unattended_network=tools.unattended_network,
            **await self._grant_context(run, spec.tool_class if spec else None)))
        if decided is None:
            return None
        outcome, decision = decided.outcome, decided.events
        identity, tool_input = decided.identity, decided.tool_input  # an approver's edit: the call runs with it
        if not outcome.approved:
            if not await self._port.append(run, decision):
                return None
            self._note_grant(run, decided)
            return partial(self._answer, run, Rpc.SEND_TOOL_DENIED, SendToolDeniedParams(
                task_id=run.task_id, tool_call_id=requested.tool_call_id, reason=outcome.effective.reason))

        assert spec is not None
        workspace = Path(run.session.workspace or ".")
        started_at = time.monotonic()
        started = PendingEvent(EventType.TOOL_CALL_STARTED, ToolCallStarted(
            **identity.model_dump(), tool_name=requested.tool_name,
            execution_env="supervisor", sandbox=SandboxSummary(kind="workspace", workspace=str(workspace))))
        if spec.tool_class is ToolClass.READ_ONLY:
            # A read has no side effect that must be durable before it runs: it runs now, in the worker's order,
            # and its whole record (what is not stored yet of the request and decision, tool.call.started, the
            # result) is stored in one commit after it. If the supervisor dies before that commit, nothing of the
            # call is stored (see "Audit order of a tool call" in docs/reliability.md).
            return await self._execute(run, requested, identity, tool_input, outcome.policy_snapshot, workspace,
                                       started_at, [*decision, started])
        # A write or a command: the decision and tool.call.started share one commit, durable before the tool runs.
        if not await self._port.append(run, [*decision, started]):
            return None
        self._note_grant(run, decided)
        return partial(self._execute_and_answer, run, requested, identity, tool_input, outcome.policy_snapshot,
                       workspace, started_at)

    async def _execute_and_answer(self, run: TaskRun, requested: ToolCallRequested, identity: ToolCallIdentity,
                                  tool_input: dict[str, Any], policy_snapshot: dict[str, Any], workspace: Path,
                                  started_at: float) -> None:
        answer = await self._execute(run, requested, identity, tool_input, policy_snapshot, workspace, started_at)
        if answer is not None:
            await answer()

    async def _execute(self, run: TaskRun, requested: ToolCallRequested, identity: ToolCallIdentity,
                       tool_input: dict[str, Any], policy_snapshot: dict[str, Any], workspace: Path,
                       started_at: float, unstored: Sequence[PendingEvent] = ()) -> Rest | None:
        """Run the tool and store its result, with ``unstored`` (the record so far of a read, not stored yet) and
        its output in the same commit. Returns the answer to send the runtime; None if the task ended."""
        result = await self._port.tools.execute(requested.tool_name, tool_input, ToolContext(
            workspace=workspace, namespace=run.session.namespace, put_blob=partial(self._port.put_blob, run)))
        duration_ms = (time.monotonic() - started_at) * 1000
        output = _output_events(identity, result)
        if not unstored and output:  # a command's output is stored as soon as it ran
            await self._port.append(run, output)
            output = []
        data = await _canonical_result(result.content)
        result_ref = sha256_hex(data)  # the canonical hash of the result
        blobs: dict[str, tuple[bytes, str]] = {}
        if len(data) <= INLINE_BLOB_MAX:  # committed with tool.call.completed: no separate fsyncs
            blobs[result_ref] = (data, "application/json")
        else:
            await self._port.put_blob(run, data, "application/json")
        completed = ToolCallCompleted(
            **identity.model_dump(), tool_name=requested.tool_name, is_error=result.is_error,
            execution_env=result.execution_env, policy_snapshot=policy_snapshot, sandbox=result.sandbox,
            result_ref=result_ref, result_preview=result.preview or _preview(result.content),
            result_hash=result_ref, output_ref=result.output_ref, duration_ms=round(duration_ms, 3))
        record = [*unstored, *output, PendingEvent(EventType.TOOL_CALL_COMPLETED, completed)]
        if not await self._port.append(run, record, blobs):
            return None
        self._completed[(run.session_id, requested.runtime_tool_call_id, requested.tool_name,
                         requested.input_hash)] = completed
        return partial(self._answer, run, Rpc.SEND_TOOL_RESULT, SendToolResultParams(
            task_id=run.task_id, tool_call_id=requested.tool_call_id, result=result.content, is_error=result.is_error))

    async def _handle_runtime_call(self, run: TaskRun, requested: ToolCallRequested,
                                   tool_input: dict[str, Any]) -> None:
        """A call the runtime runs itself: the supervisor only decides. On approval the runtime runs it and
        reports tool.call.started/completed, which the engine accepts only for approved calls."""
        identity = _identity(requested)
        spec = runtime_tool_spec(requested.tool_name)
        decided = await self._decide(run, identity, requested, tool_input, [], PolicyRequest(
            tool_name=requested.tool_name, tool=spec, permission_mode=run.params.permission_mode,
            interaction_mode=run.params.interaction_mode, input=tool_input, identity=identity,
            **await self._grant_context(run, spec.tool_class)), snapshot_extra={"executed_by": "runtime"}, runs_here=False)
        if decided is None:
            return
        outcome, decision = decided.outcome, decided.events
        if not await self._port.append(run, decision):
            return
        self._note_grant(run, decided)
        if outcome.approved:
            run.approved_runtime_calls[requested.tool_call_id] = identity
        if outcome.approved:
            await self._answer(run, Rpc.SEND_TOOL_APPROVED, SendToolApprovedParams(
                task_id=run.task_id, tool_call_id=requested.tool_call_id, reason=outcome.effective.reason,
                scope=decided.scope))
        else:
            await self._answer(run, Rpc.SEND_TOOL_DENIED, SendToolDeniedParams(
                task_id=run.task_id, tool_call_id=requested.tool_call_id, reason=outcome.effective.reason))

    async def _grant_context(self, run: TaskRun, tool_class: ToolClass | None) -> dict[str, Any]:
        """What the policy needs to consult the session's grants (only this session's live ones), where it may:
        a call the mode does not ask about (or a tool not enabled) is decided without them."""
        if tool_class is None or RULES[(run.params.permission_mode, tool_class)] is not PolicyDecision.ASK:
            return {}
        return {"grants": await self._port.grants.live(run.session), "task_id": run.task_id,
                "workspace": run.session.workspace}

    def _note_grant(self, run: TaskRun, decided: _Decided) -> None:
        """The grant an answer created is stored now: it decides the session's next calls."""
        if decided.grant is not None:
            self._port.grants.noted(run.session_id, decided.grant)

    async def _decide(self, run: TaskRun, identity: ToolCallIdentity, requested: ToolCallRequested,
                      tool_input: dict[str, Any], prefix: list[PendingEvent], request: PolicyRequest,
                      snapshot_extra: dict[str, Any] | None = None, *, runs_here: bool = True,
                      ) -> _Decided | None:
        """The policy's outcome, and the events still to store for it (``prefix`` first). An "ask" is stored at
        once — with ``prefix``, the evaluations so far and ``approval.requested`` — before the human is asked;
        then the answer's events are what is left: a grant it makes (``grant.created``, before the evaluation that
        names it), and an input the approver edited (the call's events after the evaluation carry its hash).
        None: the task ended meanwhile."""

        def events(payloads: Sequence[PolicyPayload]) -> list[PendingEvent]:
            if snapshot_extra:
                payloads = [p.model_copy(update={"policy_snapshot": {**p.policy_snapshot, **snapshot_extra}})
                            for p in payloads]
            return [PendingEvent(_type_of(p), p) for p in payloads]

        step = evaluate(request)
        if isinstance(step, PolicyOutcome):
            effective = step.effective
            scope = _grant_scope(request.grants, effective.grant_id) if step.approved else GrantScope.ONCE
            return _Decided(step, [*prefix, *events(policy_payloads(step, identity))], identity, tool_input,
                            scope=scope)
        approvals = self._port.approvals
        record = await approvals.open(run, step.approval, runs_here=runs_here)
        asked = ApprovalRequested(**identity.model_dump(), approval_id=record.approval_id,
                                  tool_name=requested.tool_name, tool_class=step.approval.tool_class.value,
                                  reason=step.approval.reason, expires_at=record.expires_at,
                                  input_preview=_preview(tool_input))
        stored_now = events(evaluation_payloads(step.evaluations, step.policy_snapshot, identity))
        # From here the approval is pending and listed: however the task ends before a decision (here, while its
        # request is being stored, or while it waits), the approval is closed, never left pending.
        try:
            if await self._port.append(run, [*prefix, *stored_now, PendingEvent(EventType.APPROVAL_REQUESTED, asked)]):
                final = await approvals.wait(run, record, step.approval)
            else:
                await approvals.close_for_end(run, record.approval_id)
                return None
        except trio.Cancelled:
            with trio.CancelScope(shield=True):
                await approvals.close_for_end(run, record.approval_id)
            raise
        answer = approvals.answer_of(record.approval_id) if final.decided_by != BY_CODESDK else None
        grant = _grant_of(run, requested, final, answer)
        outcome = _outcome(step, final, grant.grant_id if grant is not None else None)
        payloads = policy_payloads(outcome, identity)[len(step.evaluations):]
        edit = await self._edit(run, answer) if outcome.approved and answer is not None else None
        if edit is not None:
            # The answer's evaluation records the edit (under the call's original hash); the decision and what
            # follows carry the edited input's hash: the call runs with that input.
            edited_input, edited_hash, recorded = edit
            user, *after = payloads
            assert isinstance(user, ToolCallPolicyEvaluated)
            payloads = [user.model_copy(update={"edited_input_hash": edited_hash, **recorded}),
                        *(p.model_copy(update={"input_hash": edited_hash}) for p in after)]
            identity = identity.model_copy(update={"input_hash": edited_hash})
            tool_input = edited_input
        made = [PendingEvent(EventType.GRANT_CREATED, grant)] if grant is not None else []
        return _Decided(outcome, [*made, *events(payloads)], identity, tool_input, grant=grant,
                        scope=grant.scope if grant is not None and outcome.approved else GrantScope.ONCE)

    async def _edit(self, run: TaskRun, answer: ApproverAnswer) -> tuple[dict[str, Any], str, dict[str, Any]] | None:
        """An approver's edited input: it, its hash, and how the evaluation records it (inline when small, else a
        blob); None when the input was not edited (or edited to itself)."""
        if answer.input is None:
            return None
        edited = dict(answer.input)
        data = canonical_json(edited)
        edited_hash = sha256_hex(data)
        if len(data) > INLINE_INPUT_MAX_BYTES:
            return edited, edited_hash, {"edited_input_ref": await self._port.put_blob(run, data, "application/json")}
        return edited, edited_hash, {"edited_input": edited}

    async def _replayable(self, run: TaskRun, requested: ToolCallRequested) -> ToolCallCompleted | None:
        if run.session_id not in self._indexed_sessions:
            await self._index(run.session_id)
        found = self._completed.get((run.session_id, requested.runtime_tool_call_id, requested.tool_name,
                                     requested.input_hash))
        return found if found is not None and not found.is_error else None

    async def _index(self, session_id: str) -> None:
        """Load the session's completed calls once (so replays work across supervisor restarts); only the
        tool-call events are read, a page at a time."""
        requested: dict[tuple[str | None, str, int], ToolCallRequested] = {}
        after = 0
        while page := await self._port.read_types(session_id, _INDEX_TYPES, after, 1000):
            after = page[-1].seq
            for event in page:
                p = event.payload
                key = (event.trace.task_id, getattr(p, "tool_call_id", ""), getattr(p, "attempt", 0))
                if isinstance(p, ToolCallRequested) and event.type == EventType.TOOL_CALL_REQUESTED:
                    requested[key] = p
                elif isinstance(p, ToolCallCompleted) and key in requested:
                    self._completed[(session_id, requested[key].runtime_tool_call_id, p.tool_name,
                                     p.input_hash)] = p
        self._indexed_sessions.add(session_id)

    async def _record_replay(self, run: TaskRun, identity: ToolCallIdentity, done: ToolCallCompleted,
                             prefix: list[PendingEvent]) -> bool:
        snapshot = {**done.policy_snapshot, "rule": "replay.read_only", "replay_of_attempt": done.attempt}
        reason = "identical read-only call already completed in this session; answered from the store"
        ids = identity.model_dump()
        return await self._port.append(run, [
            *prefix,
            PendingEvent(EventType.TOOL_CALL_POLICY_EVALUATED, ToolCallPolicyEvaluated(
                **ids, source=PolicySource.CODESDK, decision=PolicyDecision.ALLOW, reason=reason,
                rule="replay.read_only", policy_snapshot=snapshot)),
            PendingEvent(EventType.TOOL_CALL_APPROVED, ToolCallApproved(**ids, source=PolicySource.CODESDK,
                                                                        reason=reason, policy_snapshot=snapshot)),
            PendingEvent(EventType.TOOL_CALL_STARTED, ToolCallStarted(**ids, tool_name=done.tool_name,
                                                                      execution_env="store",
                                                                      sandbox=SandboxSummary(kind="none"))),
            PendingEvent(EventType.TOOL_CALL_COMPLETED, done.model_copy(update={
                **ids, "replayed": True, "duration_ms": 0.0, "execution_env": "store", "policy_snapshot": snapshot})),
        ])

    async def _send_replayed(self, run: TaskRun, identity: ToolCallIdentity, done: ToolCallCompleted) -> None:
        if done.result_ref is None:
            return
        content = json.loads(await self._port.get_blob(done.result_ref))
        await self._answer(run, Rpc.SEND_TOOL_RESULT, SendToolResultParams(
            task_id=run.task_id, tool_call_id=identity.tool_call_id, result=content, is_error=done.is_error))

    async def _answer(self, run: TaskRun, method: ToolAnswer, params: Model) -> None:
        if not run.ended:  # an ended task's runtime is being stopped: nothing more to tell it
            await self._port.answer(run, method, params)


_INDEX_TYPES = (EventType.TOOL_CALL_REQUESTED, EventType.TOOL_CALL_COMPLETED)


async def _held(run: TaskRun, rest: Rest, phase: Phase) -> None:
    """The rest of a call the supervisor still holds: the task's idle clock does not run meanwhile; ``phase`` (its
    observers' timing of the call) ends with it."""
    outcome = "error"
    try:
        with run.clock.hold():
            await rest()
        outcome = "ok"
    except trio.Cancelled:
        outcome = "cancelled"
        raise
    finally:
        phase.end(outcome)


def _output_events(identity: ToolCallIdentity, result: ToolResult) -> list[PendingEvent]:
    """A command's stdout/stderr as tool.output events (file tools have none)."""
    if result.stdout is None and result.stderr is None:
        return []
    ids = identity.model_dump()
    events: list[PendingEvent] = []
    for stream in ("stdout", "stderr"):
        text = getattr(result, stream)
        if text:
            events.append(PendingEvent(EventType.TOOL_OUTPUT_DELTA, ToolOutputDelta(**ids, stream=stream, delta=text)))
    events.append(PendingEvent(EventType.TOOL_OUTPUT_COMPLETED, ToolOutputCompleted(
        **ids, stdout_bytes=len((result.stdout or "").encode()), stderr_bytes=len((result.stderr or "").encode()))))
    return events


def _identity(requested: ToolCallRequested) -> ToolCallIdentity:
    return ToolCallIdentity(tool_call_id=requested.tool_call_id, runtime_tool_call_id=requested.runtime_tool_call_id,
                            attempt=requested.attempt, input_hash=requested.input_hash)


@dataclass(frozen=True)
class _Decided:
    """A call's decision: the policy's outcome, its events still to store, the identity and input the call goes on
    with (an approver may have edited the input), the grant the answer made, and the scope to tell the runtime."""

    outcome: PolicyOutcome
    events: list[PendingEvent]
    identity: ToolCallIdentity
    tool_input: dict[str, Any]
    grant: GrantCreated | None = None
    scope: GrantScope = GrantScope.ONCE


def _grant_scope(grants: Sequence[GrantCreated], grant_id: str | None) -> GrantScope:
    found = next((g for g in grants if g.grant_id == grant_id), None) if grant_id else None
    return found.scope if found is not None else GrantScope.ONCE


def _grant_of(run: TaskRun, requested: ToolCallRequested, final: ApprovalRecord,
              answer: ApproverAnswer | None) -> GrantCreated | None:
    """The grant a person's scoped answer makes (None for ``once``, or when nobody answered)."""
    if answer is None or answer.scope is GrantScope.ONCE or final.decided_by == BY_CODESDK \
            or final.state not in (ApprovalState.APPROVED, ApprovalState.DENIED):
        return None
    decision = GrantDecision.ALLOW if final.state == ApprovalState.APPROVED else GrantDecision.DENY
    return GrantCreated(
        grant_id=new_id("grt"), scope=answer.scope, decision=decision, tool_name=requested.tool_name,
        pattern=answer.pattern, approval_id=final.approval_id, tool_call_id=requested.tool_call_id,
        created_by=final.decided_by or "", task_id=run.task_id if answer.scope is GrantScope.TASK else None)


def _outcome(step: ApprovalNeeded, final: ApprovalRecord, grant_id: str | None = None) -> PolicyOutcome:
    """The policy outcome of a settled approval: a human's decision, or codesdk's denial when nobody's."""
    reason = final.decision_reason or final.state
    if final.decided_by == BY_CODESDK:
        if final.state == ApprovalState.EXPIRED or unattended(final):  # nobody answered (or could)
            return complete(step, None, unanswered=reason)
        return complete(step, None, failure=reason)
    return complete(step, ApproverAnswer(allow=final.state == ApprovalState.APPROVED, reason=reason),
                    approval_id=final.approval_id, grant_id=grant_id)


def _type_of(payload: PolicyPayload) -> EventType:
    if isinstance(payload, ToolCallPolicyEvaluated):
        return EventType.TOOL_CALL_POLICY_EVALUATED
    if isinstance(payload, ToolCallApproved):
        return EventType.TOOL_CALL_APPROVED
    if isinstance(payload, ToolCallDenied):
        return EventType.TOOL_CALL_DENIED
    raise TypeError(f"not a policy payload: {payload!r}")
