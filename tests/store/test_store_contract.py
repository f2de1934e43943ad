"""The recorder contract: sessions, tasks, approvals, append/read, errors, atomic batches, quotas, reopen.

Every test here runs once per backend (``backends.BACKENDS``) and uses only the recorder interfaces, so a second
backend passes exactly what the SQLite store passes. What is particular to SQLite is in ``test_store_sqlite``.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta, timezone
from collections.abc import Callable
from typing import cast

import pytest
import trio

from codesdk.protocol import ApprovalState, EventType, ModelOutputDelta, NormalizedEvent, Trace, utc_now
from codesdk.protocol import AnsweredVia, Question, QuestionOption, QuestionRequested, QuestionSource, QuestionState
from codesdk.supervisor.store import (
    ApprovalDecided,
    ApprovalRecord,
    EventDraft,
    InvalidEvent,
    InvalidTransition,
    QuotaExceeded,
    Quotas,
    Recorder,
    SessionBusy,
    SessionExists,
    StoreClosed,
    TaskExists,
    TaskState,
    TaskUpdate,
    UnknownApproval,
    UnknownSession,
    UnknownTask,
)

from codesdk.supervisor.store import QuestionRecord, QuestionSettled, UnknownQuestion
from tests.store.backends import Backend
from tests.store.store_helpers import RUNTIME, bad_delta, delta, session_created, terminal, texts


async def test_create_and_get_session(recorder: Recorder) -> None:
    with trio.fail_after(10):
        created = await recorder.create_session(
            "s1", runtime="scripted", namespace="user:7", workspace="/w", metadata={"k": [1, None]}
        )
        assert created.session_id == "s1" and created.last_seq == 0
        assert await recorder.get_session("s1") == created
        generated = await recorder.create_session(runtime="claude")
        assert generated.session_id.startswith("ses_") and generated.namespace == "default"
        assert await recorder.last_seq("s1") == 0


async def test_list_sessions_in_creation_order_with_filter_and_paging(recorder: Recorder) -> None:
    with trio.fail_after(10):
        for index in range(5):
            await recorder.create_session(f"s{index}", runtime="scripted", namespace="a" if index % 2 else "b")
        listed = await recorder.list_sessions()
        assert [s.session_id for s in listed] == ["s0", "s1", "s2", "s3", "s4"]
        assert [s.session_id for s in await recorder.list_sessions(namespace="a")] == ["s1", "s3"]
        assert [s.session_id for s in await recorder.list_sessions(limit=2, offset=2)] == ["s2", "s3"]
        with pytest.raises(ValueError, match="limit"):
            await recorder.list_sessions(limit=0)


async def test_session_errors_and_update(recorder: Recorder) -> None:
    with trio.fail_after(10):
        await recorder.create_session("s1", runtime="scripted")
        with pytest.raises(SessionExists, match="already exists"):
            await recorder.create_session("s1", runtime="scripted")
        with pytest.raises(UnknownSession, match="'nope'"):
            await recorder.get_session("nope")
        with pytest.raises(UnknownSession):
            await recorder.last_seq("nope")
        with pytest.raises(UnknownSession):
            await recorder.update_session("nope", runtime_session_id="r")
        updated = await recorder.update_session("s1", runtime_session_id="rt-42", metadata={"title": "x"})
        assert updated.runtime_session_id == "rt-42" and updated.metadata == {"title": "x"}
        assert await recorder.get_session("s1") == updated


async def test_task_lifecycle(recorder: Recorder) -> None:
    with trio.fail_after(10):
        await recorder.create_session("s1", runtime="scripted")
        task = await recorder.create_task("s1", "t1", metadata={"prompt": "hi"})
        assert task.state is TaskState.PENDING and task.runtime == "scripted" and task.started_at is None
        running = await recorder.update_task("t1", state=TaskState.RUNNING, worker_pid=1234)
        assert running.state is TaskState.RUNNING and running.started_at is not None and running.worker_pid == 1234
        failed = await recorder.update_task(
            "t1", state=TaskState.FAILED, error={"code": "WORKER_CRASHED", "exit_code": -9}
        )
        assert failed.state is TaskState.FAILED and failed.ended_at is not None
        assert failed.terminal_type == "task.failed" and failed.error == {"code": "WORKER_CRASHED", "exit_code": -9}
        assert await recorder.get_task("t1") == failed
        with pytest.raises(InvalidTransition, match="failed to running"):
            await recorder.update_task("t1", state=TaskState.RUNNING)
        with pytest.raises(InvalidTransition):
            await recorder.update_task("t1", state=TaskState.FAILED)  # a task ends exactly once
        second = await recorder.create_task("s1", "t2", runtime="other", state=TaskState.RUNNING)
        assert second.started_at is not None and second.runtime == "other"
        assert [t.task_id for t in await recorder.list_tasks("s1")] == ["t1", "t2"]


async def test_task_errors(recorder: Recorder) -> None:
    with trio.fail_after(10):
        await recorder.create_session("s1", runtime="scripted")
        await recorder.create_session("s2", runtime="scripted")
        with pytest.raises(UnknownSession):
            await recorder.create_task("nope")
        await recorder.create_task("s1", "t1")
        with pytest.raises(TaskExists):
            await recorder.create_task("s2", "t1")
        with pytest.raises(SessionBusy, match="active task 't1'"):
            await recorder.create_task("s1", "t2")
        with pytest.raises(UnknownTask):
            await recorder.get_task("nope")
        with pytest.raises(UnknownTask):
            await recorder.update_task("nope", state=TaskState.RUNNING)
        with pytest.raises(UnknownSession):
            await recorder.list_tasks("nope")
        assert await recorder.list_tasks("s2") == []
        with pytest.raises(ValueError, match="starts pending or running"):
            await recorder.create_task("s2", state=TaskState.COMPLETED)


async def test_append_assigns_gap_free_seqs_and_read_round_trips(recorder: Recorder) -> None:
    with trio.fail_after(10):
        await recorder.create_session("s1", runtime="scripted")
        first = await recorder.append("s1", [session_created()])
        later = await recorder.append("s1", [delta("a"), delta("b", session_id="s1", task_id="t1"), delta("c")])
        assert [e.seq for e in first + later] == [1, 2, 3, 4]
        assert await recorder.last_seq("s1") == 4
        assert (await recorder.get_session("s1")).last_seq == 4
        stored = await recorder.read("s1")
        assert stored == first + later
        assert stored[2].trace == Trace(session_id="s1", task_id="t1")
        assert stored[1].trace == Trace(session_id="s1")
        assert isinstance(stored[1].payload, ModelOutputDelta) and stored[1].runtime == RUNTIME
        assert await recorder.append("s1", []) == []
        assert await recorder.last_seq("s1") == 4


async def test_append_keeps_given_time_and_accepts_payload_models(recorder: Recorder) -> None:
    with trio.fail_after(10):
        await recorder.create_session("s1", runtime="scripted")
        when = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
        draft = EventDraft(
            type=EventType.MODEL_OUTPUT_DELTA,
            runtime=RUNTIME,
            payload=ModelOutputDelta(block_id="b", delta="x"),
            time=when.astimezone(timezone(timedelta(hours=2))),  # normalized to UTC
        )
        [event] = await recorder.append("s1", [draft])
        assert event.time == when
        assert (await recorder.read("s1")) == [event]


async def test_read_pages(recorder: Recorder) -> None:
    with trio.fail_after(10):
        await recorder.create_session("s1", runtime="scripted")
        await recorder.append("s1", [delta(str(i)) for i in range(1, 26)])
        pages: list[list[NormalizedEvent]] = []
        after = 0
        while page := await recorder.read("s1", after_seq=after, limit=10):
            pages.append(page)
            after = page[-1].seq
        assert [len(page) for page in pages] == [10, 10, 5]
        assert [e.seq for page in pages for e in page] == list(range(1, 26))
        assert texts([e for page in pages for e in page]) == [str(i) for i in range(1, 26)]
        assert await recorder.read("s1", after_seq=25) == []
        assert await recorder.read("s1", after_seq=99) == []
        with pytest.raises(UnknownSession):
            await recorder.read("nope")
        with pytest.raises(ValueError):
            await recorder.read("s1", after_seq=-1)


async def test_events_are_stored_per_session(recorder: Recorder) -> None:
    with trio.fail_after(10):
        await recorder.create_session("s1", runtime="scripted")
        await recorder.create_session("s2", runtime="scripted")
        await recorder.append("s1", [delta("a1")])
        await recorder.append("s2", [delta("b1"), delta("b2")])
        await recorder.append("s1", [delta("a2")])
        assert [(e.seq, e.payload.delta) for e in await recorder.read("s1")] == [(1, "a1"), (2, "a2")]  # type: ignore[attr-defined]
        assert [(e.seq, e.payload.delta) for e in await recorder.read("s2")] == [(1, "b1"), (2, "b2")]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (bad_delta(), "draft #1 .*model.output.delta.* is invalid"),
        (EventDraft(type="no.such.type", runtime=RUNTIME), "unknown event type 'no.such.type'"),
        (delta("x", session_id="other"), "trace.session_id 'other'"),
        (EventDraft(type="session.created", runtime=RUNTIME, payload={"runtime": "r", "namespace": "n",
                                                                         "metadata": {"x": float("nan")}}),
         None),
        (EventDraft(type=EventType.MODEL_OUTPUT_DELTA, runtime=RUNTIME, payload={"block_id": "b", "delta": "\ud800"}),
         "cannot be stored"),
        (EventDraft(type="session.created", runtime=RUNTIME, payload={"runtime": "r", "namespace": "n",
                                                                         "metadata": {"raw": b"\xff"}}),
         "cannot be stored"),
        (EventDraft(type=EventType.MODEL_OUTPUT_DELTA, runtime=RUNTIME, payload={"block_id": "b", "delta": "x"},
                    time=datetime(2026, 1, 1)), "timezone"),
    ],
)
async def test_failing_batch_leaves_store_unchanged(recorder: Recorder, bad: EventDraft, message: str | None) -> None:
    with trio.fail_after(10):
        await recorder.create_session("s1", runtime="scripted")
        await recorder.append("s1", [delta("before")])
        if message is None:  # NaN inside free-form metadata: pydantic stores it as null, which is still valid
            await recorder.append("s1", [bad])
            assert (await recorder.read("s1"))[-1].payload.metadata == {"x": None}  # type: ignore[attr-defined]
            return
        with pytest.raises(InvalidEvent, match=message):
            await recorder.append("s1", [delta("ok"), bad, delta("never")])
        assert texts(await recorder.read("s1")) == ["before"]
        assert await recorder.last_seq("s1") == 1
        [after] = await recorder.append("s1", [delta("after")])
        assert after.seq == 2


async def test_batch_failing_inside_the_transaction_is_rolled_back(recorder: Recorder) -> None:
    with trio.fail_after(10):
        await recorder.create_session("s1", runtime="scripted")
        await recorder.create_task("s1", "t1", state=TaskState.RUNNING)
        await recorder.append("s1", [delta("before")])
        with pytest.raises(InvalidTransition):
            await recorder.append(
                "s1", [delta("x"), terminal()], task_update=TaskUpdate("t1", state=TaskState.PENDING)
            )
        with pytest.raises(UnknownTask):
            await recorder.append("s1", [delta("y")], task_update=TaskUpdate("missing", state=TaskState.COMPLETED))
        assert texts(await recorder.read("s1")) == ["before"]
        assert (await recorder.get_task("t1")).state is TaskState.RUNNING


async def test_append_cancelled_before_it_is_queued_stores_nothing(recorder: Recorder) -> None:
    with trio.fail_after(10):
        await recorder.create_session("s1", runtime="scripted")
        with trio.CancelScope() as scope:
            scope.cancel()
            await recorder.append("s1", [delta("x")])
        assert scope.cancelled_caught
        [event] = await recorder.append("s1", [delta("y")])
        assert event.seq == 1 and texts(await recorder.read("s1")) == ["y"]


async def test_append_to_unknown_session_writes_nothing(recorder: Recorder) -> None:
    with trio.fail_after(10):
        with pytest.raises(UnknownSession, match="codesdk sessions"):
            await recorder.append("nope", [delta("x")])
        assert await recorder.list_sessions() == []


async def test_terminal_event_and_task_state_commit_together(recorder: Recorder) -> None:
    with trio.fail_after(10):
        await recorder.create_session("s1", runtime="scripted")
        await recorder.create_task("s1", "t1", state=TaskState.RUNNING)
        await recorder.create_session("s2", runtime="scripted")
        with pytest.raises(InvalidEvent, match="belongs to session 's1'"):
            await recorder.append("s2", [terminal()], task_update=TaskUpdate("t1", state=TaskState.COMPLETED))
        assert await recorder.last_seq("s2") == 0
        [event] = await recorder.append(
            "s1", [terminal(EventType.TASK_STOPPED, reason="user")], task_update=TaskUpdate("t1", TaskState.STOPPED)
        )
        assert event.is_terminal
        task = await recorder.get_task("t1")
        assert task.state is TaskState.STOPPED and task.terminal_type == "task.stopped"


async def test_concurrent_failures_do_not_affect_neighbours_in_the_same_transaction(recorder: Recorder) -> None:
    with trio.fail_after(20):
        await recorder.create_session("s1", runtime="scripted")
        outcomes: dict[int, list[NormalizedEvent] | Exception] = {}

        async def append(index: int) -> None:
            update = TaskUpdate("missing", state=TaskState.COMPLETED) if index % 3 == 0 else None
            try:
                outcomes[index] = await recorder.append("s1", [delta(f"{index}.0"), delta(f"{index}.1")],
                                                        task_update=update)
            except UnknownTask as exc:
                outcomes[index] = exc

        async with trio.open_nursery() as nursery:
            for index in range(60):
                nursery.start_soon(append, index)
        stored = await recorder.read("s1")
        assert [e.seq for e in stored] == list(range(1, len(stored) + 1))
        good = {i: v for i, v in outcomes.items() if not isinstance(v, Exception)}
        assert len(good) == 40 and all(isinstance(outcomes[i], UnknownTask) for i in range(0, 60, 3))
        assert sorted(e.seq for events in good.values() for e in events) == [e.seq for e in stored]
        for index, events in good.items():
            assert texts(events) == [f"{index}.0", f"{index}.1"] and events[1].seq == events[0].seq + 1
        assert recorder.writer_stats.largest_batch > 1  # queued requests shared transactions


async def test_reopen_keeps_everything(backend: Backend) -> None:
    await reopen_keeps_everything(backend)


async def reopen_keeps_everything(backend: Backend) -> None:
    """Also run by the SQLite tests at its default durability (FULL)."""
    with trio.fail_after(10):
        async with backend.open() as recorder:
            await recorder.create_session("s1", runtime="scripted", metadata={"a": 1})
            await recorder.create_task("s1", "t1")
            written = await recorder.append("s1", [session_created(), delta("a")])
            ref = await recorder.put_blob(b"hello", "text/plain")
        async with backend.open() as recorder:
            assert (await recorder.get_session("s1")).metadata == {"a": 1}
            assert (await recorder.get_task("t1")).state is TaskState.PENDING
            assert await recorder.read("s1") == written
            [next_event] = await recorder.append("s1", [delta("b")])
            assert next_event.seq == 3
            assert await recorder.get_blob(ref) == b"hello"


async def test_closed_store_refuses_work(backend: Backend) -> None:
    with trio.fail_after(10):
        async with backend.open() as recorder:
            await recorder.create_session("s1", runtime="scripted")
        assert recorder.closed
        with pytest.raises(StoreClosed):
            await recorder.append("s1", [delta("x")])
        with pytest.raises(StoreClosed):
            await recorder.read("s1")
        with pytest.raises(StoreClosed):
            await recorder.put_blob(b"x")


async def test_error_in_body_propagates_unwrapped_and_flushes(backend: Backend) -> None:
    with trio.fail_after(10):
        with pytest.raises(KeyError, match="boom"):
            async with backend.open() as recorder:
                await recorder.create_session("s1", runtime="scripted")
                await recorder.append("s1", [delta("kept")])
                raise KeyError("boom")
        async with backend.open() as recorder:
            assert texts(await recorder.read("s1")) == ["kept"]


# -- the rest of the interface: projections, active tasks, approvals, idempotency, quotas, health ---------------


async def test_read_types_and_last_event_of_type(recorder: Recorder) -> None:
    with trio.fail_after(10):
        await recorder.create_session("s1", runtime="scripted")
        await recorder.append("s1", [session_created(), delta("a", session_id="s1", task_id="t1"),
                                     terminal(), delta("b", session_id="s1", task_id="t2"), delta("c")])
        deltas = await recorder.read_types("s1", [EventType.MODEL_OUTPUT_DELTA])
        assert [e.seq for e in deltas] == [2, 4, 5]
        assert texts(await recorder.read_types("s1", [EventType.MODEL_OUTPUT_DELTA], task_id="t2")) == ["b"]
        assert [e.seq for e in await recorder.read_types("s1", ["session.created", "task.completed"], 1)] == [3]
        assert [e.seq for e in await recorder.read_types("s1", [EventType.MODEL_OUTPUT_DELTA], 0, 2)] == [2, 4]
        assert await recorder.read_types("s1", []) == []
        last = await recorder.last_event_of_type("s1", EventType.MODEL_OUTPUT_DELTA)
        assert last is not None and last.seq == 5
        assert await recorder.last_event_of_type("s1", EventType.TASK_FAILED) is None
        with pytest.raises(UnknownSession):
            await recorder.last_event_of_type("nope", EventType.TASK_FAILED)


async def test_active_tasks_across_sessions_oldest_first(recorder: Recorder) -> None:
    with trio.fail_after(10):
        for sid, namespace in (("s1", "user:a"), ("s2", "user:b"), ("s3", "user:a"), ("s4", "user:a")):
            await recorder.create_session(sid, runtime="scripted", namespace=namespace)
        await recorder.create_task("s1", "t1", state=TaskState.RUNNING)
        await recorder.create_task("s2", "t2")
        await recorder.create_task("s3", "t3")
        await recorder.update_task("t3", state=TaskState.STOPPED)
        await recorder.create_task("s4", "t4")
        assert [t.task_id for t in await recorder.list_active_tasks()] == ["t1", "t2", "t4"]
        assert [t.task_id for t in await recorder.list_active_tasks("user:a")] == ["t1", "t4"]
        assert [t.task_id for t in await recorder.list_active_tasks("user:b")] == ["t2"]
        assert await recorder.list_active_tasks("user:nobody") == []


def _approval(approval_id: str, namespace: str = "default") -> ApprovalRecord:
    now = utc_now()
    return ApprovalRecord(approval_id=approval_id, session_id="s1", task_id="t1", namespace=namespace,
                          tool_call_id="call-1", attempt=1, tool_name="workspace.write", tool_class="write",
                          input={"path": "a.txt"}, reason="writes need approval", state=ApprovalState.PENDING, created_at=now,
                          expires_at=now + timedelta(minutes=5))


async def test_approvals_are_decided_exactly_once(recorder: Recorder) -> None:
    with trio.fail_after(10):
        await recorder.create_session("s1", runtime="scripted")
        await recorder.create_task("s1", "t1", state=TaskState.RUNNING)
        first = await recorder.create_approval(_approval("a1"))
        assert first.state == "pending" and first.input == {"path": "a.txt"} and first.decided_at is None
        await recorder.create_approval(_approval("a2", namespace="user:7"))
        assert await recorder.get_approval("a1") == first
        assert [a.approval_id for a in await recorder.list_approvals()] == ["a1", "a2"]
        assert [a.approval_id for a in await recorder.list_approvals(namespaces=["user:7"])] == ["a2"]
        assert await recorder.list_approvals(namespaces=[]) == []
        decided = await recorder.decide_approval("a1", ApprovalState.APPROVED, "approver", "looks fine")
        assert (decided.state, decided.decided_by, decided.decision_reason) == ("approved", "approver", "looks fine")
        assert decided.decided_at is not None
        with pytest.raises(ApprovalDecided, match="already approved"):
            await recorder.decide_approval("a1", ApprovalState.DENIED, "approver", "changed my mind")
        assert [a.approval_id for a in await recorder.list_approvals()] == ["a2"]
        assert [a.state for a in await recorder.list_approvals(state=None)] == ["approved", "pending"]
        with pytest.raises(ValueError, match="approved, denied or expired"):
            await recorder.decide_approval("a2", cast(ApprovalState, "maybe"), "approver", "")  # an untyped caller
        with pytest.raises(UnknownApproval):
            await recorder.get_approval("nope")
        with pytest.raises(UnknownApproval):
            await recorder.decide_approval("nope", ApprovalState.DENIED, "approver", "")


async def test_a_pending_requests_deadline_moves_and_a_settled_ones_does_not(recorder: Recorder) -> None:
    with trio.fail_after(10):
        await recorder.create_session("s1", runtime="scripted")
        await recorder.create_task("s1", "t1", state=TaskState.RUNNING)
        approval = await recorder.create_approval(_approval("a1"))
        later = approval.created_at + timedelta(minutes=15)
        assert (await recorder.extend_approval("a1", later)).expires_at == later
        assert (await recorder.get_approval("a1")).expires_at == later
        await recorder.decide_approval("a1", ApprovalState.EXPIRED, "codesdk", "no decision")
        assert (await recorder.extend_approval("a1", later + timedelta(hours=1))).expires_at == later
        question = await recorder.create_question(_question("q1"))
        assert (await recorder.extend_question("q1", later)).expires_at == later
        await recorder.settle_question("q1", QuestionState.DECLINED, AnsweredVia.FALLBACK, "codesdk", {}, "none")
        assert (await recorder.extend_question("q1", later + timedelta(hours=1))).expires_at == later
        assert question.expires_at != later
        with pytest.raises(UnknownApproval):
            await recorder.extend_approval("nope", later)
        with pytest.raises(UnknownQuestion):
            await recorder.extend_question("nope", later)


def _question(question_id: str, namespace: str = "default") -> QuestionRecord:
    now = utc_now()
    request = QuestionRequested(question_id=question_id, source=QuestionSource.SCRIPTED, questions=(
        Question(id="color", text="Which colour?", options=(QuestionOption(label="red"), QuestionOption(label="blue"))),
        Question(id="token", text="Your token?", secret=True)))
    return QuestionRecord(question_id=question_id, session_id="s1", task_id="t1", namespace=namespace,
                          ask_id="ask-1", request=request, state=QuestionState.PENDING, created_at=now,
                          expires_at=now + timedelta(minutes=5))


async def test_questions_are_answered_exactly_once(recorder: Recorder) -> None:
    with trio.fail_after(10):
        await recorder.create_session("s1", runtime="scripted")
        await recorder.create_task("s1", "t1", state=TaskState.RUNNING)
        first = await recorder.create_question(_question("q1"))
        assert first.state == "pending" and first.request.questions[1].secret and first.answered_at is None
        await recorder.create_question(_question("q2", namespace="user:7"))
        assert await recorder.get_question("q1") == first
        assert [q.question_id for q in await recorder.list_questions()] == ["q1", "q2"]
        assert [q.question_id for q in await recorder.list_questions(namespaces=["user:7"])] == ["q2"]
        assert [q.question_id for q in await recorder.list_questions(task_id="t1")] == ["q1", "q2"]
        assert await recorder.list_questions(namespaces=[]) == []
        answered = await recorder.settle_question("q1", QuestionState.ANSWERED, AnsweredVia.USER, "api:alice",
                                                  {"color": "red", "token": "[secret]"}, "")
        assert (answered.state, answered.answered_via, answered.answered_by) == ("answered", "user", "api:alice")
        assert answered.answers == {"color": "red", "token": "[secret]"} and answered.answered_at is not None
        with pytest.raises(QuestionSettled, match="already answered"):
            await recorder.settle_question("q1", QuestionState.DECLINED, AnsweredVia.USER, "api:bob", {}, "no")
        assert [q.question_id for q in await recorder.list_questions()] == ["q2"]
        declined = await recorder.settle_question("q2", QuestionState.DECLINED, AnsweredVia.TASK_END, "codesdk",
                                                  {}, "the task ended")
        assert (declined.state, declined.reason) == ("declined", "the task ended")
        assert [q.state for q in await recorder.list_questions(state=None)] == ["answered", "declined"]
        with pytest.raises(UnknownQuestion):
            await recorder.get_question("nope")
        with pytest.raises(UnknownQuestion):
            await recorder.settle_question("nope", QuestionState.DECLINED, AnsweredVia.USER, "x", {}, "")
        await recorder.update_task("t1", state=TaskState.COMPLETED)
        await recorder.drop_session("s1")  # its questions go with it
        assert await recorder.list_questions(state=None) == []


async def test_an_append_repeated_with_its_key_stores_nothing(recorder: Recorder) -> None:
    with trio.fail_after(10):
        await recorder.create_session("s1", runtime="scripted")
        first = await recorder.append("s1", [delta("a"), delta("b")], idempotency_key="k1")
        assert await recorder.append("s1", [delta("a"), delta("b")], idempotency_key="k1") == first
        [other] = await recorder.append("s1", [delta("c")], idempotency_key="k2")
        assert other.seq == 3 and await recorder.last_seq("s1") == 3


async def test_quotas_refuse_whole_appends_and_new_tasks(recorder: Recorder) -> None:
    with trio.fail_after(10):
        quotas = Quotas(session_events=3, namespace_tasks=1)
        await recorder.create_session("s1", runtime="scripted")
        await recorder.create_session("s2", runtime="scripted")
        await recorder.append("s1", [delta("a"), delta("b")], quotas=quotas)
        with pytest.raises(QuotaExceeded, match="would pass its limit") as refused:
            await recorder.append("s1", [delta("c"), delta("d")], quotas=quotas)
        assert (refused.value.quota, refused.value.code) == ("session_events", "session_quota_exceeded")
        assert await recorder.last_seq("s1") == 2  # nothing of the refused batch
        await recorder.append("s1", [delta("c")], quotas=quotas)
        with pytest.raises(QuotaExceeded, match="no new task may start"):
            await recorder.create_task("s1", "t1", quotas=quotas)  # the session is at its limit
        await recorder.create_task("s2", "t2", quotas=quotas)
        await recorder.create_session("s3", runtime="scripted")
        with pytest.raises(QuotaExceeded) as busy:
            await recorder.create_task("s3", "t3", quotas=quotas)  # the namespace runs as many as it may
        assert (busy.value.quota, busy.value.code) == ("namespace_tasks", "too_many_tasks")
        assert [t.task_id for t in await recorder.list_active_tasks()] == ["t2"]
        await recorder.create_task("s3", "t3")  # without quotas nothing is counted


async def test_a_blob_costs_its_size_in_every_batch_that_names_it(recorder: Recorder) -> None:
    """Stored bytes count the blobs a batch names, whichever way they were stored (put on their own, or carried
    by an earlier batch): on every backend, so that no blob gets past a byte quota."""
    with trio.fail_after(10):
        quotas = Quotas(session_bytes=20_000)
        await recorder.create_session("s1", runtime="scripted")
        put = await recorder.put_blob(b"p" * 12_000, "text/plain")
        carried_data = b"c" * 12_000
        carried = f"sha256:{hashlib.sha256(carried_data).hexdigest()}"
        await recorder.append("s1", [delta(f"carries {carried}")], blobs={carried: (carried_data, "text/plain")},
                              quotas=quotas)  # ~12 KB, once
        for named in (put, carried):
            with pytest.raises(QuotaExceeded) as refused:
                await recorder.append("s1", [delta(f"names {named}")], quotas=quotas)
            assert refused.value.quota == "session_bytes", named
        assert await recorder.last_seq("s1") == 1
        await recorder.append("s1", [delta("small")], quotas=quotas)


async def test_a_healthy_writer_reports_no_failure(recorder: Recorder) -> None:
    with trio.fail_after(10):
        await recorder.ping()
        assert not recorder.closed and recorder.write_failure is None
        before = recorder.writer_stats.transactions
        await recorder.create_session("s1", runtime="scripted")
        assert recorder.writer_stats.transactions > before


async def test_a_sessions_budget_is_stored_changed_in_one_transaction_and_spend_adds_up_per_month(
        recorder: Recorder) -> None:
    from codesdk.protocol import BudgetLimits, BudgetSpent, SessionBudget

    with trio.fail_after(10):
        created = await recorder.create_session("s1", runtime="scripted", namespace="user:7",
                                                budget=SessionBudget(limits=BudgetLimits(tokens=100)))
        assert created.budget is not None and created.budget.limits.tokens == 100
        assert (await recorder.create_session("s2", runtime="scripted")).budget is None

        def spend(tokens: int) -> Callable[[SessionBudget | None], SessionBudget]:
            def change(budget: SessionBudget | None) -> SessionBudget:
                budget = budget or SessionBudget()
                return budget.model_copy(update={"spent": budget.spent.plus(BudgetSpent(tokens=tokens))})
            return change

        async with trio.open_nursery() as nursery:  # concurrent changes: none is lost
            for _ in range(10):
                nursery.start_soon(lambda: recorder.change_budget(
                    "s1", spend(3), spend=("user:7", "2026-11", BudgetSpent(cost_usd=0.25, tokens=3))))
        stored = await recorder.get_session("s1")
        assert stored.budget is not None and stored.budget.spent.tokens == 30 and stored.budget.limits.tokens == 100
        assert [s.budget for s in await recorder.list_sessions(namespace="user:7")] == [stored.budget]
        month = await recorder.namespace_spend("user:7", "2026-11")
        assert (month.tokens, month.cost_usd) == (30, 2.5)
        assert await recorder.namespace_spend("user:7", "2026-12") == BudgetSpent()
        assert await recorder.change_budget("s2", lambda budget: None) == await recorder.get_session("s2")
        with pytest.raises(UnknownSession):
            await recorder.change_budget("nope", spend(1))


async def test_an_append_changes_the_sessions_budget_in_its_own_transaction(recorder: Recorder) -> None:
    from codesdk.protocol import BudgetLimits, SessionBudget

    class Refused(Exception):
        pass

    def refuse(budget: SessionBudget | None) -> SessionBudget:
        raise Refused("not paused")

    with trio.fail_after(10):
        await recorder.create_session("s1", runtime="scripted")
        await recorder.append("s1", [session_created()],
                              budget_change=lambda budget: SessionBudget(limits=BudgetLimits(tool_calls=2)))
        stored = await recorder.get_session("s1")
        assert stored.budget is not None and stored.budget.limits.tool_calls == 2 and stored.last_seq == 1
        with pytest.raises(Refused):  # the change refused: nothing of the append is stored
            await recorder.append("s1", [delta("x")], budget_change=refuse)
        assert await recorder.last_seq("s1") == 1
