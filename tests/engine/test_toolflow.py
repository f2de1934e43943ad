"""One tool call, through the tool flow's port alone: no engine, no store, no worker.

``MemoryPort`` keeps what the flow stores and what it tells the runtime; ``ScriptedApprovals`` decides every
"ask" the way the test says. The real tool registry works in a tmp workspace. Each test runs the call inside a
nursery standing in for the task's tool nursery, so when the nursery closes the call is over: no waiting.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio

from codesdk.protocol import (
    GrantCreated,
    GrantScope,
    ApprovalState,
    EventType,
    ExecutedBy,
    InteractionMode,
    Method,
    Model,
    NormalizedEvent,
    PermissionMode,
    PolicySource,
    RuntimeInfo,
    SessionRef,
    StartTaskParams,
    ToolCallCompleted,
    ToolCallDenied,
    ToolCallPolicyEvaluated,
    ToolCallRequested,
    Trace,
    canonical_hash,
    sha256_hex,
    utc_now,
)
from codesdk.supervisor.engine import EngineStats
from codesdk.supervisor.engine._runs import Blobs, PendingEvent, TaskRun
from codesdk.supervisor.engine._toolflow import INLINE_INPUT_MAX_BYTES, ToolFlow
from codesdk.supervisor.engine._toolport import Approvals, ToolAnswer, ToolRunner
from codesdk.supervisor.store import ApprovalRecord, DatabaseError, SessionRecord
from codesdk.supervisor.tools import ApprovalRequest, ApproverAnswer, ToolRegistry, ToolsConfig


class MemoryGrants:
    """A session's live grants in memory (none unless a test notes some)."""

    def __init__(self) -> None:
        self.by_session: dict[str, dict[str, GrantCreated]] = {}

    async def live(self, session: SessionRecord) -> tuple[GrantCreated, ...]:
        return tuple(self.by_session.get(session.session_id, {}).values())

    def noted(self, session_id: str, created: GrantCreated) -> None:
        self.by_session.setdefault(session_id, {})[created.grant_id] = created


@dataclass
class MemoryPort:
    """The tool flow's port in memory: stored events in order, blobs, and what the runtime was told."""

    tools: ToolRunner
    approvals: Approvals
    stored: list[PendingEvent] = field(default_factory=list)
    commits: list[list[EventType]] = field(default_factory=list)  # the event types of each append
    blobs: dict[str, bytes] = field(default_factory=dict)
    answers: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    history: list[NormalizedEvent] = field(default_factory=list)  # the session's events before this flow
    grants: MemoryGrants = field(default_factory=lambda: MemoryGrants())

    async def append(self, run: TaskRun, events: Sequence[PendingEvent], blobs: Blobs | None = None) -> bool:
        if run.ended:
            return False
        self.stored.extend(events)
        self.commits.append([e.type for e in events])
        self.blobs.update({ref: data for ref, (data, _) in (blobs or {}).items()})
        return True

    async def put_blob(self, run: TaskRun, data: bytes, media_type: str) -> str:
        ref = sha256_hex(data)
        self.blobs[ref] = data
        return ref

    async def get_blob(self, ref: str) -> bytes:
        return self.blobs[ref]

    async def read_types(self, session_id: str, types: Sequence[str], after_seq: int,
                         limit: int) -> Sequence[NormalizedEvent]:
        return [e for e in self.history if e.seq > after_seq and e.type in types][:limit]

    async def answer(self, run: TaskRun, method: ToolAnswer, params: Model) -> None:
        self.answers.append((method.method, params.to_json_obj()))

    def types(self) -> list[EventType]:
        return [e.type for e in self.stored]

    def payloads(self, type_: EventType) -> list[Any]:
        return [e.payload for e in self.stored if e.type == type_]


class ScriptedApprovals:
    """Every approval ends as ``state`` by ``decided_by`` — a human's answer, or "codesdk" when nobody's."""

    def __init__(self, state: ApprovalState = ApprovalState.PENDING, decided_by: str = "api:alice",
                 reason: str = "", answer: ApproverAnswer | None = None) -> None:
        self.state, self.decided_by, self.reason, self.answer = state, decided_by, reason, answer
        self.asked: list[ApprovalRequest] = []
        self.closed: list[str] = []

    def answer_of(self, approval_id: str) -> ApproverAnswer | None:
        return self.answer

    async def open(self, run: TaskRun, request: ApprovalRequest, *, runs_here: bool = True) -> ApprovalRecord:
        self.asked.append(request)
        now = utc_now()
        identity = request.identity
        assert identity is not None
        return ApprovalRecord(approval_id=f"apr_{len(self.asked)}", session_id=run.session_id, task_id=run.task_id,
                              namespace=run.namespace, tool_call_id=identity.tool_call_id, attempt=identity.attempt,
                              tool_name=request.tool_name, tool_class=request.tool_class.value, reason=request.reason,
                              state=ApprovalState.PENDING, created_at=now, expires_at=now)

    async def wait(self, run: TaskRun, record: ApprovalRecord, request: ApprovalRequest) -> ApprovalRecord:
        return record.model_copy(update={"state": self.state, "decided_by": self.decided_by,
                                         "decision_reason": self.reason, "decided_at": utc_now()})

    async def close(self, approval_id: str, why: str,
                    state: ApprovalState = ApprovalState.EXPIRED) -> ApprovalRecord:
        self.closed.append(approval_id)
        raise AssertionError("not expected in these tests")

    async def close_for_end(self, run: TaskRun, approval_id: str) -> ApprovalRecord:
        return await self.close(approval_id, "the task ended")


def _run(workspace: Path, mode: PermissionMode = PermissionMode.ASK,
         interaction: InteractionMode = InteractionMode.NON_INTERACTIVE) -> TaskRun:
    session = SessionRecord(session_id="ses_t", runtime="scripted", namespace="default", workspace=str(workspace),
                            created_at=utc_now())
    params = StartTaskParams(runtime="scripted", session=SessionRef(session_id="ses_t"), task_id="task_t",
                             permission_mode=mode, interaction_mode=interaction)
    return TaskRun(task_id="task_t", session=session, params=params,
                   trace=Trace(session_id="ses_t", task_id="task_t"), runtime=RuntimeInfo(name="scripted"))


def _request(tool: str, tool_input: dict[str, Any], call: str = "call_1", **extra: Any) -> ToolCallRequested:
    return ToolCallRequested(tool_call_id=call, attempt=1, input_hash=canonical_hash(tool_input), tool_name=tool,
                             input=tool_input, **extra)


@dataclass
class Flow:
    port: MemoryPort
    flow: ToolFlow
    stats: EngineStats

    async def call(self, run: TaskRun, *requests: ToolCallRequested) -> None:
        """The requests in order, and everything they started, to the end."""
        async with trio.open_nursery() as tools:
            run.tools_nursery = tools
            for request in requests:
                await self.flow.requested(run, request)


def _flow(approvals: Approvals | None = None) -> Flow:
    port = MemoryPort(ToolRegistry(ToolsConfig()), approvals or ScriptedApprovals())
    stats = EngineStats()
    return Flow(port, ToolFlow(port, stats), stats)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    (tmp_path / "a.txt").write_text("alpha\n")
    return tmp_path


# -- policy: allow, deny -------------------------------------------------------------------------------


_READ_RECORD = [EventType.TOOL_CALL_REQUESTED, EventType.TOOL_CALL_POLICY_EVALUATED, EventType.TOOL_CALL_APPROVED,
                EventType.TOOL_CALL_STARTED, EventType.TOOL_CALL_COMPLETED]


@pytest.mark.parametrize(("tool", "tool_input", "expect"), [
    ("workspace.read", {"path": "a.txt"}, "alpha"),
    ("workspace.list", {"path": "."}, "a.txt"),
])
async def test_a_read_only_call_is_stored_whole_in_one_commit_after_it_ran(
        workspace: Path, tool: str, tool_input: dict[str, Any], expect: str) -> None:
    f = _flow()
    with trio.fail_after(10):
        await f.call(_run(workspace), _request(tool, tool_input))
    assert f.port.commits == [_READ_RECORD]  # requested ... completed: one append, in the usual order
    completed: ToolCallCompleted = f.port.payloads(EventType.TOOL_CALL_COMPLETED)[0]
    assert not completed.is_error and completed.result_ref in f.port.blobs
    [(method, params)] = f.port.answers
    assert method == Method.SEND_TOOL_RESULT and expect in str(params["result"]) and not params["is_error"]


async def test_a_write_has_its_decision_and_start_durable_before_it_runs(workspace: Path) -> None:
    f = _flow()
    seen_at_commit: list[bool] = []  # whether the file was written when each append came
    append = f.port.append

    async def watching(run: TaskRun, events: Sequence[PendingEvent], blobs: Blobs | None = None) -> bool:
        seen_at_commit.append((workspace / "b.txt").exists())
        return await append(run, events, blobs)

    f.port.append = watching  # type: ignore[method-assign]
    with trio.fail_after(10):
        await f.call(_run(workspace, PermissionMode.YOLO), _request("workspace.write", {"path": "b.txt",
                                                                                         "content": "hi\n"}))
    assert f.port.commits == [_READ_RECORD[:4], [EventType.TOOL_CALL_COMPLETED]]
    assert seen_at_commit == [False, True]  # decided and started before the write, completed after it
    assert (workspace / "b.txt").read_text() == "hi\n"


async def test_an_interactive_read_stores_its_request_first_and_the_rest_in_one_commit(workspace: Path) -> None:
    f = _flow()
    with trio.fail_after(10):
        await f.call(_run(workspace, interaction=InteractionMode.INTERACTIVE),
                     _request("workspace.read", {"path": "a.txt"}))
    assert f.port.commits == [_READ_RECORD[:1], _READ_RECORD[1:]]
    assert [m for m, _ in f.port.answers] == [Method.SEND_TOOL_RESULT]


async def test_a_read_whose_record_cannot_be_stored_leaves_nothing_of_it_and_is_not_answered(
        workspace: Path) -> None:
    """The disk fails between the read and its one commit: none of the call is stored (no request without its
    end), the runtime is told nothing, and the failure reaches the caller (the intake), which ends the task."""
    f = _flow()
    append = f.port.append

    async def failing(run: TaskRun, events: Sequence[PendingEvent], blobs: Blobs | None = None) -> bool:
        if any(e.type == EventType.TOOL_CALL_COMPLETED for e in events):
            raise DatabaseError("could not store events: injected fault")
        return await append(run, events, blobs)

    f.port.append = failing  # type: ignore[method-assign]
    with trio.fail_after(10), pytest.raises(ExceptionGroup) as raised:  # from the call's nursery
        await f.call(_run(workspace), _request("workspace.read", {"path": "a.txt"}))
    assert raised.group_contains(DatabaseError, match="injected fault")
    assert f.port.stored == [] and f.port.answers == []


async def test_a_big_read_runs_off_the_loop_and_reads_the_same(workspace: Path) -> None:
    text = "".join(f"line {i:06d} " + "x" * 60 + "\n" for i in range(2000))  # ~140 KiB: past the inline size
    (workspace / "big.txt").write_text(text)
    f = _flow()
    with trio.fail_after(10):
        await f.call(_run(workspace), _request("workspace.read", {"path": "big.txt", "offset": 1500, "limit": 2}),
                     _request("workspace.read", {"path": "a.txt"}, call="call_2"))
    assert f.port.commits == [_READ_RECORD, _READ_RECORD]
    results = {params["tool_call_id"]: params["result"] for _, params in f.port.answers}
    big, small = results["call_1"], results["call_2"]
    assert big["text"] == text.splitlines(keepends=True)[1500] + text.splitlines(keepends=True)[1501]
    assert big["has_more"] and small["text"] == "alpha\n"


async def test_an_ask_without_anyone_to_ask_is_a_denial_and_nothing_runs(workspace: Path) -> None:
    f = _flow()
    with trio.fail_after(10):
        await f.call(_run(workspace), _request("workspace.write", {"path": "b.txt", "content": "no"}))
    assert f.port.commits == [[EventType.TOOL_CALL_REQUESTED, EventType.TOOL_CALL_POLICY_EVALUATED,
                                EventType.TOOL_CALL_DENIED]]
    assert f.port.payloads(EventType.TOOL_CALL_POLICY_EVALUATED)[0].decision == "ask"
    assert "non-interactive" in f.port.payloads(EventType.TOOL_CALL_DENIED)[0].reason
    assert not (workspace / "b.txt").exists()
    [(method, params)] = f.port.answers
    denied: ToolCallDenied = f.port.payloads(EventType.TOOL_CALL_DENIED)[0]
    assert method == Method.SEND_TOOL_DENIED and params["reason"] == denied.reason


async def test_a_tool_that_is_not_enabled_is_denied_in_every_mode(workspace: Path) -> None:
    f = _flow()
    with trio.fail_after(10):
        await f.call(_run(workspace, PermissionMode.YOLO), _request("workspace.exec", {"argv": ["true"]}))
    assert f.port.types()[-1] == EventType.TOOL_CALL_DENIED
    assert [m for m, _ in f.port.answers] == [Method.SEND_TOOL_DENIED]


# -- approvals: granted, denied, timed out -------------------------------------------------------------


async def test_a_granted_approval_is_stored_before_the_human_is_asked_then_the_call_runs(workspace: Path) -> None:
    approvals = ScriptedApprovals(ApprovalState.APPROVED, reason="fine by me")
    f = _flow(approvals)
    with trio.fail_after(10):
        await f.call(_run(workspace, interaction=InteractionMode.INTERACTIVE),
                     _request("workspace.write", {"path": "b.txt", "content": "yes\n"}))
    assert f.port.commits[:2] == [
        [EventType.TOOL_CALL_REQUESTED],
        [EventType.TOOL_CALL_POLICY_EVALUATED, EventType.APPROVAL_REQUESTED],  # before anyone is asked
    ]
    assert f.port.types()[3:] == [EventType.TOOL_CALL_POLICY_EVALUATED, EventType.TOOL_CALL_APPROVED,
                                  EventType.TOOL_CALL_STARTED, EventType.TOOL_CALL_COMPLETED]
    user: ToolCallPolicyEvaluated = f.port.payloads(EventType.TOOL_CALL_POLICY_EVALUATED)[-1]
    assert (user.source, user.decision, user.approval_id) == ("user", "allow", "apr_1")
    assert [r.tool_name for r in approvals.asked] == ["workspace.write"]
    assert (workspace / "b.txt").read_text() == "yes\n"
    assert [m for m, _ in f.port.answers] == [Method.SEND_TOOL_RESULT]


async def test_a_scoped_answer_is_a_grant_stored_with_it_that_decides_the_next_call(workspace: Path) -> None:
    approvals = ScriptedApprovals(ApprovalState.APPROVED, answer=ApproverAnswer(allow=True, scope=GrantScope.TASK))
    f = _flow(approvals)
    with trio.fail_after(10):
        await f.call(_run(workspace, interaction=InteractionMode.INTERACTIVE),
                     _request("workspace.write", {"path": "b.txt", "content": "1"}),
                     _request("workspace.write", {"path": "c.txt", "content": "2"}, call="call_2"))
    assert len(approvals.asked) == 1  # the second call was not asked
    [grant] = f.port.payloads(EventType.GRANT_CREATED)
    assert (grant.scope, grant.task_id, grant.approval_id) == (GrantScope.TASK, "task_t", "apr_1")
    types = f.port.types()
    assert types.index(EventType.GRANT_CREATED) < types.index(EventType.TOOL_CALL_APPROVED)
    user = [p for p in f.port.payloads(EventType.TOOL_CALL_POLICY_EVALUATED) if p.source == "user"]
    assert [(p.rule, p.grant_id) for p in user] == [("user.answer", grant.grant_id), ("grant.task", grant.grant_id)]
    assert (workspace / "c.txt").read_text() == "2"


async def test_an_edited_input_runs_and_its_hash_follows_the_answer(workspace: Path) -> None:
    edited = {"path": "edited.txt", "content": "edited"}
    f = _flow(ScriptedApprovals(ApprovalState.APPROVED, answer=ApproverAnswer(allow=True, input=edited)))
    with trio.fail_after(10):
        await f.call(_run(workspace, interaction=InteractionMode.INTERACTIVE),
                     _request("workspace.write", {"path": "b.txt", "content": "original"}))
    assert (workspace / "edited.txt").read_text() == "edited" and not (workspace / "b.txt").exists()
    [user] = [p for p in f.port.payloads(EventType.TOOL_CALL_POLICY_EVALUATED) if p.source == "user"]
    assert user.edited_input == edited and user.edited_input_hash == canonical_hash(edited)
    assert user.input_hash == canonical_hash({"path": "b.txt", "content": "original"})
    for later in (EventType.TOOL_CALL_APPROVED, EventType.TOOL_CALL_STARTED, EventType.TOOL_CALL_COMPLETED):
        assert [p.input_hash for p in f.port.payloads(later)] == [canonical_hash(edited)]


async def test_a_denied_approval_tells_the_runtime_the_humans_reason(workspace: Path) -> None:
    f = _flow(ScriptedApprovals(ApprovalState.DENIED, reason="not today"))
    with trio.fail_after(10):
        await f.call(_run(workspace, interaction=InteractionMode.INTERACTIVE),
                     _request("workspace.write", {"path": "b.txt", "content": "no\n"}))
    denied: ToolCallDenied = f.port.payloads(EventType.TOOL_CALL_DENIED)[0]
    assert (denied.source, denied.reason) == (PolicySource.USER, "not today")
    assert EventType.TOOL_CALL_STARTED not in f.port.types()
    assert not (workspace / "b.txt").exists()
    assert f.port.answers == [(Method.SEND_TOOL_DENIED, {"task_id": "task_t", "tool_call_id": "call_1",
                                                         "reason": "not today"})]


async def test_an_approval_nobody_answered_in_time_is_codesdks_denial(workspace: Path) -> None:
    f = _flow(ScriptedApprovals(ApprovalState.EXPIRED, decided_by="codesdk",
                                    reason="no decision within 900 s"))
    with trio.fail_after(10):
        await f.call(_run(workspace, interaction=InteractionMode.INTERACTIVE),
                     _request("workspace.write", {"path": "b.txt", "content": "late\n"}))
    denied: ToolCallDenied = f.port.payloads(EventType.TOOL_CALL_DENIED)[0]
    assert denied.source == PolicySource.CODESDK and "no decision within 900 s" in denied.reason
    assert [(e.source, e.decision) for e in f.port.payloads(EventType.TOOL_CALL_POLICY_EVALUATED)] == [
        ("codesdk", "ask")]  # no user answered
    assert not (workspace / "b.txt").exists()
    assert [m for m, _ in f.port.answers] == [Method.SEND_TOOL_DENIED]


# -- tool errors, repeats, replays, the end of the task ------------------------------------------------


async def test_a_tool_error_is_a_completed_call_with_is_error(workspace: Path) -> None:
    f = _flow()
    with trio.fail_after(10):
        await f.call(_run(workspace), _request("workspace.read", {"path": "missing.txt"}),
                     _request("workspace.read", {"path": "../outside"}, call="call_2"))
    completed: list[ToolCallCompleted] = f.port.payloads(EventType.TOOL_CALL_COMPLETED)
    assert [c.is_error for c in completed] == [True, True]
    assert [(m, p["is_error"]) for m, p in f.port.answers] == [(Method.SEND_TOOL_RESULT, True)] * 2


async def test_a_repeated_request_is_dropped_and_counted_a_new_attempt_runs(workspace: Path) -> None:
    f = _flow()
    run = _run(workspace, PermissionMode.YOLO)
    write = _request("workspace.write", {"path": "log.txt", "content": "once\n"})
    with trio.fail_after(10):
        await f.call(run, write, write, write.model_copy(update={"attempt": 2}))
    started = f.port.payloads(EventType.TOOL_CALL_STARTED)
    assert [(s.tool_call_id, s.attempt) for s in started] == [("call_1", 1), ("call_1", 2)]
    assert f.stats.duplicate_events == 1


async def test_an_identical_read_is_answered_from_the_store(workspace: Path) -> None:
    f = _flow()
    read = {"path": "a.txt"}
    with trio.fail_after(10):
        await f.call(_run(workspace), _request("workspace.read", read))
        (workspace / "a.txt").write_text("changed\n")  # a replay answers what was read, not what is there now
        await f.call(_run(workspace), _request("workspace.read", read, call="call_2"))
    first, again = f.port.payloads(EventType.TOOL_CALL_COMPLETED)
    assert (first.replayed, again.replayed, again.execution_env) == (False, True, "store")
    assert f.port.answers[0][1]["result"] == f.port.answers[1][1]["result"]


async def test_a_worker_with_a_wrong_input_hash_is_counted_and_ours_is_stored(workspace: Path) -> None:
    f = _flow()
    wrong = _request("workspace.read", {"path": "a.txt"}).model_copy(update={"input_hash": "sha256:" + "0" * 64})
    with trio.fail_after(10):
        await f.call(_run(workspace), wrong)
    assert f.port.payloads(EventType.TOOL_CALL_REQUESTED)[0].input_hash == canonical_hash({"path": "a.txt"})
    assert f.stats.invalid_events == 1


async def test_a_large_input_is_stored_as_a_blob_and_referenced(workspace: Path) -> None:
    f = _flow()
    content = "x" * (INLINE_INPUT_MAX_BYTES + 1)
    with trio.fail_after(10):
        await f.call(_run(workspace, PermissionMode.YOLO),
                     _request("workspace.write", {"path": "big.txt", "content": content}))
    requested: ToolCallRequested = f.port.payloads(EventType.TOOL_CALL_REQUESTED)[0]
    assert requested.input is None and requested.input_ref in f.port.blobs
    assert (workspace / "big.txt").read_text() == content


async def test_nothing_is_stored_or_told_once_the_task_has_ended(workspace: Path) -> None:
    f = _flow()
    run = _run(workspace, PermissionMode.YOLO)
    run.ended = True
    with trio.fail_after(10):
        await f.call(run, _request("workspace.write", {"path": "b.txt", "content": "no\n"}))
    assert f.port.stored == [] and f.port.answers == []
    assert not (workspace / "b.txt").exists()


async def test_a_call_the_runtime_runs_itself_is_only_decided(workspace: Path) -> None:
    f = _flow()
    run = _run(workspace, PermissionMode.YOLO)
    with trio.fail_after(10):
        await f.call(run, _request("Bash", {"command": "ls"}, executed_by=ExecutedBy.RUNTIME))
    assert f.port.types() == [EventType.TOOL_CALL_REQUESTED, EventType.TOOL_CALL_POLICY_EVALUATED,
                              EventType.TOOL_CALL_APPROVED]
    assert [m for m, _ in f.port.answers] == [Method.SEND_TOOL_APPROVED]
    assert "call_1" in run.approved_runtime_calls  # only now may the runtime report it started/completed


class ClosingApprovals(ScriptedApprovals):
    """Records which approvals were closed because their task ended."""

    def __init__(self) -> None:
        super().__init__()
        self.ended: list[str] = []

    async def close_for_end(self, run: TaskRun, approval_id: str) -> ApprovalRecord:
        self.ended.append(approval_id)
        return (await self.open(run, self.asked[-1])).model_copy(update={"state": ApprovalState.EXPIRED})


@dataclass
class BlockingPort(MemoryPort):
    """Its second append (the "ask") waits until the test lets it go: the task can end meanwhile."""

    entered: trio.Event = field(default_factory=trio.Event)
    release: trio.Event = field(default_factory=trio.Event)

    async def append(self, run: TaskRun, events: Sequence[PendingEvent], blobs: Blobs | None = None) -> bool:
        if any(e.type == EventType.APPROVAL_REQUESTED for e in events):
            self.entered.set()
            await self.release.wait()
        return await super().append(run, events, blobs)


@pytest.mark.parametrize("released", [False, True], ids=["ended-while-storing", "ended-before-storing"])
async def test_an_approval_is_closed_when_its_task_ends_while_the_ask_is_being_stored(workspace: Path,
                                                                                     released: bool) -> None:
    """Between the approval's row (listed as pending at once) and its wait, the task may end — cancelled in the
    middle of storing the ask, or found ended by it: either way the approval is closed, never left pending."""
    approvals = ClosingApprovals()
    port = BlockingPort(ToolRegistry(ToolsConfig()), approvals)
    flow = ToolFlow(port, EngineStats())
    run = _run(workspace, interaction=InteractionMode.INTERACTIVE)
    with trio.fail_after(10):
        async with trio.open_nursery() as tools:
            run.tools_nursery = tools
            await flow.requested(run, _request("workspace.write", {"path": "b.txt", "content": "x"}))
            await port.entered.wait()
            run.ended = True  # what TaskEnder.finish does first
            if released:
                port.release.set()  # the append finds the task ended
            else:
                tools.cancel_scope.cancel()  # the task's end cancels its tool nursery mid-append
    assert approvals.ended == ["apr_1"] and not (workspace / "b.txt").exists()
