"""Contract of the event store: sessions, tasks, append/read, errors, atomic batches, reopen."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import apsw
import pytest
import trio

from protocol import EventType, ModelOutputDelta, NormalizedEvent, Trace
from supervisor.store import (
    DB_FILENAME,
    EventDraft,
    EventStore,
    InvalidEvent,
    InvalidTransition,
    SessionBusy,
    SessionExists,
    StoreClosed,
    TaskExists,
    TaskState,
    TaskUpdate,
    UnknownSession,
    UnknownTask,
)

from .store_helpers import RUNTIME, bad_delta, delta, session_created, terminal, texts


async def test_create_and_get_session(store: EventStore) -> None:
    with trio.fail_after(10):
        created = await store.create_session(
            "s1", runtime="scripted", namespace="user:7", workspace="/w", metadata={"k": [1, None]}
        )
        assert created.session_id == "s1" and created.last_seq == 0
        assert await store.get_session("s1") == created
        generated = await store.create_session(runtime="claude")
        assert generated.session_id.startswith("ses_") and generated.namespace == "default"
        assert await store.last_seq("s1") == 0


async def test_list_sessions_in_creation_order_with_filter_and_paging(store: EventStore) -> None:
    with trio.fail_after(10):
        for index in range(5):
            await store.create_session(f"s{index}", runtime="scripted", namespace="a" if index % 2 else "b")
        listed = await store.list_sessions()
        assert [s.session_id for s in listed] == ["s0", "s1", "s2", "s3", "s4"]
        assert [s.session_id for s in await store.list_sessions(namespace="a")] == ["s1", "s3"]
        assert [s.session_id for s in await store.list_sessions(limit=2, offset=2)] == ["s2", "s3"]
        with pytest.raises(ValueError, match="limit"):
            await store.list_sessions(limit=0)


async def test_session_errors_and_update(store: EventStore) -> None:
    with trio.fail_after(10):
        await store.create_session("s1", runtime="scripted")
        with pytest.raises(SessionExists, match="already exists"):
            await store.create_session("s1", runtime="scripted")
        with pytest.raises(UnknownSession, match="'nope'"):
            await store.get_session("nope")
        with pytest.raises(UnknownSession):
            await store.last_seq("nope")
        with pytest.raises(UnknownSession):
            await store.update_session("nope", runtime_session_id="r")
        updated = await store.update_session("s1", runtime_session_id="rt-42", metadata={"title": "x"})
        assert updated.runtime_session_id == "rt-42" and updated.metadata == {"title": "x"}
        assert await store.get_session("s1") == updated


async def test_task_lifecycle(store: EventStore) -> None:
    with trio.fail_after(10):
        await store.create_session("s1", runtime="scripted")
        task = await store.create_task("s1", "t1", metadata={"prompt": "hi"})
        assert task.state is TaskState.PENDING and task.runtime == "scripted" and task.started_at is None
        running = await store.update_task("t1", state=TaskState.RUNNING, worker_pid=1234)
        assert running.state is TaskState.RUNNING and running.started_at is not None and running.worker_pid == 1234
        failed = await store.update_task(
            "t1", state=TaskState.FAILED, error={"code": "WORKER_CRASHED", "exit_code": -9}
        )
        assert failed.state is TaskState.FAILED and failed.ended_at is not None
        assert failed.terminal_type == "task.failed" and failed.error == {"code": "WORKER_CRASHED", "exit_code": -9}
        assert await store.get_task("t1") == failed
        with pytest.raises(InvalidTransition, match="failed to running"):
            await store.update_task("t1", state=TaskState.RUNNING)
        with pytest.raises(InvalidTransition):
            await store.update_task("t1", state=TaskState.FAILED)  # a task ends exactly once
        second = await store.create_task("s1", "t2", runtime="other", state=TaskState.RUNNING)
        assert second.started_at is not None and second.runtime == "other"
        assert [t.task_id for t in await store.list_tasks("s1")] == ["t1", "t2"]


async def test_task_errors(store: EventStore) -> None:
    with trio.fail_after(10):
        await store.create_session("s1", runtime="scripted")
        await store.create_session("s2", runtime="scripted")
        with pytest.raises(UnknownSession):
            await store.create_task("nope")
        await store.create_task("s1", "t1")
        with pytest.raises(TaskExists):
            await store.create_task("s2", "t1")
        with pytest.raises(SessionBusy, match="active task 't1'"):
            await store.create_task("s1", "t2")
        with pytest.raises(UnknownTask):
            await store.get_task("nope")
        with pytest.raises(UnknownTask):
            await store.update_task("nope", state=TaskState.RUNNING)
        with pytest.raises(UnknownSession):
            await store.list_tasks("nope")
        assert await store.list_tasks("s2") == []
        with pytest.raises(ValueError, match="starts pending or running"):
            await store.create_task("s2", state=TaskState.COMPLETED)


async def test_append_assigns_gap_free_seqs_and_read_round_trips(store: EventStore) -> None:
    with trio.fail_after(10):
        await store.create_session("s1", runtime="scripted")
        first = await store.append("s1", [session_created()])
        later = await store.append("s1", [delta("a"), delta("b", session_id="s1", task_id="t1"), delta("c")])
        assert [e.seq for e in first + later] == [1, 2, 3, 4]
        assert await store.last_seq("s1") == 4
        assert (await store.get_session("s1")).last_seq == 4
        stored = await store.read("s1")
        assert stored == first + later
        assert stored[2].trace == Trace(session_id="s1", task_id="t1")
        assert stored[1].trace == Trace(session_id="s1")
        assert isinstance(stored[1].payload, ModelOutputDelta) and stored[1].runtime == RUNTIME
        assert await store.append("s1", []) == []
        assert await store.last_seq("s1") == 4


async def test_append_keeps_given_time_and_accepts_payload_models(store: EventStore) -> None:
    with trio.fail_after(10):
        await store.create_session("s1", runtime="scripted")
        when = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
        draft = EventDraft(
            type=EventType.MODEL_OUTPUT_DELTA,
            runtime=RUNTIME,
            payload=ModelOutputDelta(block_id="b", delta="x"),
            time=when.astimezone(timezone(timedelta(hours=2))),  # normalized to UTC
        )
        [event] = await store.append("s1", [draft])
        assert event.time == when
        assert (await store.read("s1")) == [event]


async def test_read_pages(store: EventStore) -> None:
    with trio.fail_after(10):
        await store.create_session("s1", runtime="scripted")
        await store.append("s1", [delta(str(i)) for i in range(1, 26)])
        pages: list[list[NormalizedEvent]] = []
        after = 0
        while page := await store.read("s1", after_seq=after, limit=10):
            pages.append(page)
            after = page[-1].seq
        assert [len(page) for page in pages] == [10, 10, 5]
        assert [e.seq for page in pages for e in page] == list(range(1, 26))
        assert texts([e for page in pages for e in page]) == [str(i) for i in range(1, 26)]
        assert await store.read("s1", after_seq=25) == []
        assert await store.read("s1", after_seq=99) == []
        with pytest.raises(UnknownSession):
            await store.read("nope")
        with pytest.raises(ValueError):
            await store.read("s1", after_seq=-1)


async def test_events_are_stored_per_session(store: EventStore) -> None:
    with trio.fail_after(10):
        await store.create_session("s1", runtime="scripted")
        await store.create_session("s2", runtime="scripted")
        await store.append("s1", [delta("a1")])
        await store.append("s2", [delta("b1"), delta("b2")])
        await store.append("s1", [delta("a2")])
        assert [(e.seq, e.payload.delta) for e in await store.read("s1")] == [(1, "a1"), (2, "a2")]  # type: ignore[attr-defined]
        assert [(e.seq, e.payload.delta) for e in await store.read("s2")] == [(1, "b1"), (2, "b2")]  # type: ignore[attr-defined]


async def test_events_rows_have_indexed_columns(data_dir: Path) -> None:
    with trio.fail_after(10):
        async with EventStore.open(data_dir, synchronous="NORMAL") as store:
            await store.create_session("s1", runtime="scripted")
            await store.append("s1", [session_created(), delta("x", session_id="s1", task_id="t9")])
        conn = apsw.Connection(str(data_dir / DB_FILENAME))
        rows = conn.execute("SELECT session_id, seq, task_id, type, body FROM events ORDER BY seq").fetchall()
        conn.close()
        assert [row[:4] for row in rows] == [("s1", 1, None, "session.created"), ("s1", 2, "t9", "model.output.delta")]
        assert '"seq"' not in str(rows[1][4])  # the key column is the one source of seq


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
async def test_failing_batch_leaves_store_unchanged(store: EventStore, bad: EventDraft, message: str | None) -> None:
    with trio.fail_after(10):
        await store.create_session("s1", runtime="scripted")
        await store.append("s1", [delta("before")])
        if message is None:  # NaN inside free-form metadata: pydantic stores it as null, which is still valid
            await store.append("s1", [bad])
            assert (await store.read("s1"))[-1].payload.metadata == {"x": None}  # type: ignore[attr-defined]
            return
        with pytest.raises(InvalidEvent, match=message):
            await store.append("s1", [delta("ok"), bad, delta("never")])
        assert texts(await store.read("s1")) == ["before"]
        assert await store.last_seq("s1") == 1
        [after] = await store.append("s1", [delta("after")])
        assert after.seq == 2


async def test_batch_failing_inside_the_transaction_is_rolled_back(store: EventStore) -> None:
    with trio.fail_after(10):
        await store.create_session("s1", runtime="scripted")
        await store.create_task("s1", "t1", state=TaskState.RUNNING)
        await store.append("s1", [delta("before")])
        with pytest.raises(InvalidTransition):
            await store.append(
                "s1", [delta("x"), terminal()], task_update=TaskUpdate("t1", state=TaskState.PENDING)
            )
        with pytest.raises(UnknownTask):
            await store.append("s1", [delta("y")], task_update=TaskUpdate("missing", state=TaskState.COMPLETED))
        assert texts(await store.read("s1")) == ["before"]
        assert (await store.get_task("t1")).state is TaskState.RUNNING


async def test_append_cancelled_before_it_is_queued_stores_nothing(store: EventStore) -> None:
    with trio.fail_after(10):
        await store.create_session("s1", runtime="scripted")
        with trio.CancelScope() as scope:
            scope.cancel()
            await store.append("s1", [delta("x")])
        assert scope.cancelled_caught
        [event] = await store.append("s1", [delta("y")])
        assert event.seq == 1 and texts(await store.read("s1")) == ["y"]


async def test_append_to_unknown_session_writes_nothing(store: EventStore) -> None:
    with trio.fail_after(10):
        with pytest.raises(UnknownSession, match="create it first"):
            await store.append("nope", [delta("x")])
        assert await store.list_sessions() == []


async def test_terminal_event_and_task_state_commit_together(store: EventStore) -> None:
    with trio.fail_after(10):
        await store.create_session("s1", runtime="scripted")
        await store.create_task("s1", "t1", state=TaskState.RUNNING)
        await store.create_session("s2", runtime="scripted")
        with pytest.raises(InvalidEvent, match="belongs to session 's1'"):
            await store.append("s2", [terminal()], task_update=TaskUpdate("t1", state=TaskState.COMPLETED))
        assert await store.last_seq("s2") == 0
        [event] = await store.append(
            "s1", [terminal(EventType.TASK_STOPPED, reason="user")], task_update=TaskUpdate("t1", TaskState.STOPPED)
        )
        assert event.is_terminal
        task = await store.get_task("t1")
        assert task.state is TaskState.STOPPED and task.terminal_type == "task.stopped"


async def test_concurrent_failures_do_not_affect_neighbours_in_the_same_transaction(store: EventStore) -> None:
    with trio.fail_after(20):
        await store.create_session("s1", runtime="scripted")
        outcomes: dict[int, list[NormalizedEvent] | Exception] = {}

        async def append(index: int) -> None:
            update = TaskUpdate("missing", state=TaskState.COMPLETED) if index % 3 == 0 else None
            try:
                outcomes[index] = await store.append("s1", [delta(f"{index}.0"), delta(f"{index}.1")],
                                                     task_update=update)
            except UnknownTask as exc:
                outcomes[index] = exc

        async with trio.open_nursery() as nursery:
            for index in range(60):
                nursery.start_soon(append, index)
        stored = await store.read("s1")
        assert [e.seq for e in stored] == list(range(1, len(stored) + 1))
        good = {i: v for i, v in outcomes.items() if not isinstance(v, Exception)}
        assert len(good) == 40 and all(isinstance(outcomes[i], UnknownTask) for i in range(0, 60, 3))
        assert sorted(e.seq for events in good.values() for e in events) == [e.seq for e in stored]
        for index, events in good.items():
            assert texts(events) == [f"{index}.0", f"{index}.1"] and events[1].seq == events[0].seq + 1
        assert store.writer_stats.largest_batch > 1  # queued requests shared transactions


async def test_reopen_keeps_everything(data_dir: Path) -> None:
    with trio.fail_after(10):
        async with EventStore.open(data_dir) as store:  # default durability (FULL)
            await store.create_session("s1", runtime="scripted", metadata={"a": 1})
            await store.create_task("s1", "t1")
            written = await store.append("s1", [session_created(), delta("a")])
            ref = await store.put_blob(b"hello", "text/plain")
        async with EventStore.open(data_dir) as store:
            assert (await store.get_session("s1")).metadata == {"a": 1}
            assert (await store.get_task("t1")).state is TaskState.PENDING
            assert await store.read("s1") == written
            [next_event] = await store.append("s1", [delta("b")])
            assert next_event.seq == 3
            assert await store.get_blob(ref) == b"hello"


async def test_closed_store_refuses_work(data_dir: Path) -> None:
    with trio.fail_after(10):
        async with EventStore.open(data_dir, synchronous="NORMAL") as store:
            await store.create_session("s1", runtime="scripted")
        assert store.closed
        with pytest.raises(StoreClosed):
            await store.append("s1", [delta("x")])
        with pytest.raises(StoreClosed):
            await store.read("s1")
        with pytest.raises(StoreClosed):
            await store.put_blob(b"x")


async def test_error_in_body_propagates_unwrapped_and_flushes(data_dir: Path) -> None:
    with trio.fail_after(10):
        with pytest.raises(KeyError, match="boom"):
            async with EventStore.open(data_dir, synchronous="NORMAL") as store:
                await store.create_session("s1", runtime="scripted")
                await store.append("s1", [delta("kept")])
                raise KeyError("boom")
        async with EventStore.open(data_dir, synchronous="NORMAL") as store:
            assert texts(await store.read("s1")) == ["kept"]


async def test_open_rejects_bad_options(data_dir: Path) -> None:
    with trio.fail_after(10):
        with pytest.raises(ValueError, match="synchronous"):
            async with EventStore.open(data_dir, synchronous="OFF"):  # type: ignore[arg-type]
                pass
        with pytest.raises(ValueError, match="max_batch"):
            async with EventStore.open(data_dir, max_batch=0):
                pass
