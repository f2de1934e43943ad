"""Fenced writes on PostgreSQL (``_fencing``): a write queued with a lease epoch that is no longer current is refused
(``Fenced``), whatever kind of write it is, and changes nothing; the current holder's writes go through; a lease's
epoch is never reused; and a supervisor stopped inside a write transaction does not block a takeover, or another's
write, for long."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import psycopg
import pytest
import trio

from codesdk.protocol import (
    AnsweredVia,
    ApprovalState,
    EventType,
    Question,
    QuestionRequested,
    QuestionSource,
    QuestionState,
    SessionCreated,
    Trace,
    utc_now,
)
from codesdk.supervisor.store import (
    ApprovalRecord,
    EventDraft,
    EventStore,
    Fenced,
    PostgresLeases,
    QuestionRecord,
    Quotas,
    SessionRecord,
    StoreError,
    TaskState,
    TaskUpdate,
    open_postgres,
)
from codesdk.supervisor.store import _sql
from codesdk.supervisor.store._db import Db
from codesdk.supervisor.store._fencing import Scope
from codesdk.supervisor.store._pg import redacted

from tests.store.store_helpers import RUNTIME, delta, session_created

NAMESPACE = "user:fenced"
#: The tables a refused write must leave as they were.
TABLES = ("sessions", "tasks", "events", "approvals", "questions", "namespace_spend", "namespace_usage",
          "webhook_deliveries")


def _approval(approval_id: str) -> ApprovalRecord:
    now = utc_now()
    return ApprovalRecord(approval_id=approval_id, session_id="s1", task_id="t1", namespace=NAMESPACE,
                          tool_call_id="call-1", attempt=1, tool_name="workspace.write", tool_class="write",
                          input={"path": "a.txt"}, reason="writes need approval", state=ApprovalState.PENDING,
                          created_at=now, expires_at=now + timedelta(minutes=5))


def _question(question_id: str) -> QuestionRecord:
    now = utc_now()
    request = QuestionRequested(question_id=question_id, source=QuestionSource.SCRIPTED,
                                questions=(Question(id="name", text="Your name?"),))
    return QuestionRecord(question_id=question_id, session_id="s1", task_id="t1", namespace=NAMESPACE,
                          ask_id="ask-1", request=request, state=QuestionState.PENDING, created_at=now,
                          expires_at=now + timedelta(minutes=5))


def _fork_of(parent: SessionRecord, fork_id: str) -> tuple[EventDraft, SessionRecord]:
    record = SessionRecord(session_id=fork_id, runtime=parent.runtime, namespace=parent.namespace,
                           created_at=parent.created_at)
    created = EventDraft(type=EventType.SESSION_CREATED, runtime=RUNTIME, trace=Trace(session_id=fork_id),
                         payload=SessionCreated(runtime=parent.runtime, namespace=parent.namespace))
    return created, record


def rows(url: str) -> dict[str, list[Any]]:
    """Everything a write could have changed, table by table."""
    with psycopg.connect(url) as conn:
        return {table: sorted(map(repr, conn.execute(f"SELECT * FROM {table}").fetchall())) for table in TABLES}


@asynccontextmanager
async def fenced_store(url: str, leases: PostgresLeases) -> AsyncIterator[tuple[EventStore, list[Fenced]]]:
    """A store whose writes carry ``leases``' epochs, and the refusals it reported."""
    refused: list[Fenced] = []
    async with open_postgres(url) as store:
        store.fence_with(lambda: leases.epochs, refused.append)
        yield store, refused


async def take_over(url: str, namespace: str) -> None:
    """Another supervisor takes the namespace (as a takeover after expiry does: a new epoch, another holder)."""
    def update() -> None:
        with psycopg.connect(url) as conn:
            conn.execute("UPDATE namespace_leases SET supervisor_id = 'elsewhere', "
                         "epoch = nextval('namespace_lease_epochs') WHERE namespace = %s", (namespace,))
    await trio.to_thread.run_sync(update)


async def test_every_kind_of_write_with_a_stale_epoch_is_refused_and_changes_nothing(postgres_url: str) -> None:
    with trio.fail_after(120):
        async with open_postgres(postgres_url):  # the schema
            pass
        leases = await PostgresLeases.open(postgres_url, redacted(postgres_url), 60.0)
        try:
            claim = await leases.claim(NAMESPACE)
            assert claim.epoch is not None and leases.epochs == {NAMESPACE: claim.epoch}
            async with fenced_store(postgres_url, leases) as (store, refused):
                # While the lease is ours, every kind of write goes through.
                parent = await store.create_session("s1", runtime="scripted", namespace=NAMESPACE)
                await store.append("s1", [session_created()])
                await store.create_task("s1", "t1", state=TaskState.RUNNING)
                await store.append("s1", [delta("hello", task_id="t1")])
                await store.create_approval(_approval("a1"))
                await store.create_question(_question("q1"))
                await store.create_session("s2", runtime="scripted", namespace=NAMESPACE)
                await store.update_session("s1", title="ours")
                assert not refused

                await take_over(postgres_url, NAMESPACE)
                before = rows(postgres_url)
                created, fork = _fork_of(parent, "s3")
                writes: dict[str, Callable[[], Awaitable[object]]] = {
                    "append": lambda: store.append("s1", [delta("late", task_id="t1")]),
                    "append under quotas": lambda: store.append("s1", [delta("late", task_id="t1")],
                                                                quotas=Quotas()),
                    "append ending the task": lambda: store.append(
                        "s1", [delta("end", task_id="t1")],
                        task_update=TaskUpdate(task_id="t1", state=TaskState.FAILED)),
                    "create_session": lambda: store.create_session("s4", runtime="scripted", namespace=NAMESPACE),
                    "update_session": lambda: store.update_session("s1", title="late"),
                    "drop_session": lambda: store.drop_session("s2"),
                    "fork_session": lambda: store.fork_session("s1", created, [], record=fork),
                    "change_budget": lambda: store.change_budget("s1", lambda budget: None),
                    "create_task": lambda: store.create_task("s2", "t2"),
                    "update_task": lambda: store.update_task("t1", state=TaskState.FAILED),
                    "create_approval": lambda: store.create_approval(_approval("a2")),
                    "decide_approval": lambda: store.decide_approval("a1", ApprovalState.APPROVED, "u", "ok"),
                    "extend_approval": lambda: store.extend_approval("a1", utc_now() + timedelta(hours=1)),
                    "create_question": lambda: store.create_question(_question("q2")),
                    "settle_question": lambda: store.settle_question(
                        "q1", QuestionState.ANSWERED, AnsweredVia.USER, "u", {"name": ["x"]}, "answered"),
                    "extend_question": lambda: store.extend_question("q1", utc_now() + timedelta(hours=1)),
                }
                for kind, write in writes.items():
                    with pytest.raises(Fenced, match="another supervisor runs the namespace") as caught:
                        await write()
                    assert caught.value.namespace == NAMESPACE and caught.value.epoch == claim.epoch, kind
                    assert rows(postgres_url) == before, f"a refused {kind} changed the database"
                assert len(refused) == len(writes)  # each refusal reported (the engine lets the namespace go)
                assert store.write_failure is None  # not a fault of the database
        finally:
            await leases.aclose()


async def test_a_namespace_not_held_when_the_write_was_queued_is_refused(postgres_url: str) -> None:
    with trio.fail_after(60):
        async with open_postgres(postgres_url):
            pass
        leases = await PostgresLeases.open(postgres_url, redacted(postgres_url), 60.0)
        try:
            async with fenced_store(postgres_url, leases) as (store, _):
                with pytest.raises(Fenced) as caught:
                    await store.create_session("s1", runtime="scripted", namespace=NAMESPACE)
                assert caught.value.epoch is None
                assert rows(postgres_url)["sessions"] == []
        finally:
            await leases.aclose()


async def test_a_lease_claimed_again_gets_an_epoch_never_held_before(postgres_url: str) -> None:
    """Epochs come from a sequence: a lease deleted (given up, or dropped once expired) and claimed again by the
    same supervisor does not get back an epoch its old queued writes carry."""
    with trio.fail_after(60):
        async with open_postgres(postgres_url):
            pass
        epochs: list[int] = []
        for _ in range(3):
            leases = await PostgresLeases.open(postgres_url, redacted(postgres_url), 60.0)
            try:
                claim = await leases.claim(NAMESPACE)
                assert claim.epoch is not None
                epochs.append(claim.epoch)
            finally:
                await leases.aclose()  # deletes the lease row
        assert epochs == sorted(set(epochs))


async def test_a_writer_stopped_inside_a_transaction_does_not_hold_a_takeover_for_long(postgres_url: str) -> None:
    """A write whose thread stops mid-transaction (as under SIGSTOP) right after a statement sent in the pipeline,
    with no Sync after it, holds its namespace's lease row and its session's row, and nothing on the server ends
    that. Another supervisor's claim, once the lease expired and it was blocked ``lease_s * TAKEOVER_WAIT``, ends
    that transaction: the takeover goes through while the writer is still stopped, the new holder writes to the
    session, and nothing of the stopped write is kept."""
    lease_s = 2.0
    with trio.fail_after(60):
        async with open_postgres(postgres_url):  # the schema
            pass
        stopped_leases = await PostgresLeases.open(postgres_url, redacted(postgres_url), lease_s)
        other_leases = await PostgresLeases.open(postgres_url, redacted(postgres_url), lease_s)
        try:
            await stopped_leases.claim(NAMESPACE)  # and never renewed: it expires
            async with open_postgres(postgres_url, lease_s=lease_s) as store:
                store.fence_with(lambda: stopped_leases.epochs, lambda refused: None)
                await store.create_session("s1", runtime="scripted", namespace=NAMESPACE)
                stopped, resume = threading.Event(), threading.Event()

                def stalled_write(conn: Db) -> None:
                    _sql.lock_session(conn, "s1")  # the lease row FOR SHARE, the session's FOR UPDATE
                    conn.execute("UPDATE sessions SET title = 'stalled' WHERE session_id = 's1'")  # no Sync after
                    stopped.set()
                    resume.wait()

                outcome: list[BaseException] = []

                async def write() -> None:
                    try:
                        await store._write("a stalled write", stalled_write, scope=Scope("session", "s1"))
                    except StoreError as exc:
                        outcome.append(exc)

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(write)
                    await trio.to_thread.run_sync(stopped.wait)
                    claim = await other_leases.claim(NAMESPACE)
                    while claim.holder is not None:  # until the stopped one's lease expired
                        await trio.sleep(0.05)
                        claim = await other_leases.claim(NAMESPACE)
                    assert claim.taken_over
                    async with open_postgres(postgres_url) as new_store:
                        new_store.fence_with(lambda: other_leases.epochs, lambda refused: None)
                        await new_store.update_session("s1", title="the new holder's")
                    assert not resume.is_set()
                    resume.set()
                assert outcome and not isinstance(outcome[0], Fenced)  # its connection was ended under it
                assert (await store.get_session("s1")).title == "the new holder's"
        finally:
            await other_leases.aclose()
            await stopped_leases.aclose()


async def test_a_write_blocked_by_a_stalled_transaction_ends_it(postgres_url: str) -> None:
    """A transaction whose writer stopped after a statement sent without a Sync (no server timer runs) holds a
    session's row; another store's write to that session, blocked, ends it once it has stalled for a quarter of the
    lease (``_postgres.WRITER_IDLE_IN_TRANSACTION``), and goes through while the first writer is still stopped."""
    lease_s = 2.0
    with trio.fail_after(60):
        async with open_postgres(postgres_url, lease_s=lease_s) as stalled_store, \
                open_postgres(postgres_url, lease_s=lease_s) as other_store:
            await stalled_store.create_session("s1", runtime="scripted", namespace=NAMESPACE)
            stopped, resume = threading.Event(), threading.Event()

            def stalled_write(conn: Db) -> None:
                conn.execute("UPDATE sessions SET title = 'stalled' WHERE session_id = 's1'")  # no Sync after
                conn.scalar("SELECT 1")  # read with a flush request: the UPDATE ran, its row is locked
                stopped.set()
                resume.wait()

            outcome: list[BaseException] = []

            async def write() -> None:
                try:
                    await stalled_store._write("a stalled write", stalled_write)
                except StoreError as exc:
                    outcome.append(exc)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(write)
                await trio.to_thread.run_sync(stopped.wait)
                await other_store.update_session("s1", title="the other's")
                assert not resume.is_set()
                resume.set()
            assert outcome  # its connection was ended under it
            assert (await other_store.get_session("s1")).title == "the other's"
