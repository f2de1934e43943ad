"""The writer's pipelined transactions on PostgreSQL: what an append costs in round trips, a failing request blamed on
itself (its errors surface only when its answers are read), small appends (one ``INSERT … SELECT FROM unnest``)
and large ones (COPY) storing the same rows, and a connection the server dropped replaced without a failed write."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from codesdk.protocol import EventType
from codesdk.supervisor.store import DatabaseError, EventDraft, EventStore, Quotas, open_postgres
from codesdk.supervisor.store import _pg

from tests.store.store_helpers import RUNTIME, delta, session_created

#: Text that every escaping layer between the store and a row must carry unchanged.
AWKWARD = ["", "NULL", 'a "quoted" word', "back\\slash \\N \\t", "{braces},commas", "tab\there", "line\nbreak",
           "ünï€ode 🙂", "  padded  ", "\\", '"']


def round_trips(trace: str) -> int:
    """Times the client spoke and then heard back, in a libpq protocol trace: an upper bound on the round trips
    (a pipeline may also read answers that are already there without waiting)."""
    turns, last = 0, None
    for line in trace.splitlines():
        direction = line.split("\t")[1] if line.count("\t") >= 3 else None
        if direction == "B" and last == "F":
            turns += 1
        last = direction or last
    return turns


async def traced(store: EventStore, tmp_path: Path, work: Callable[[], Awaitable[object]]) -> int:
    """Round trips of the writer's connection while ``work`` runs."""
    db = store._writer._conn  # type: ignore[union-attr]
    assert isinstance(db, _pg.PostgresDb)
    trace = tmp_path / "trace"
    with trace.open("w") as out:
        db.conn.pgconn.trace(out.fileno())
        try:
            await work()
        finally:
            db.conn.pgconn.untrace()
    return round_trips(trace.read_text())


async def together(*appends: Callable[[], Awaitable[Any]]) -> list[BaseException | None]:
    """Run ``appends`` at once (queued before the writer wakes: one transaction); each one's error or None."""
    outcomes: list[BaseException | None] = [None] * len(appends)

    async def run(index: int) -> None:
        try:
            await appends[index]()
        except Exception as exc:  # noqa: BLE001 - the test looks at each outcome
            outcomes[index] = exc

    async with trio.open_nursery() as nursery:
        for index in range(len(appends)):
            nursery.start_soon(run, index)
    return outcomes


async def test_a_lone_append_costs_two_round_trips_and_a_batch_two_per_request_and_one(postgres_url: str,
                                                                                       tmp_path: Path) -> None:
    async with open_postgres(postgres_url) as store:
        for session in ("a", "b", "c"):
            await store.create_session(session, runtime="scripted")
            await store.append(session, [session_created()])  # (the first insert reads the table's column types)

        async def one() -> None:
            await store.append("a", [delta("x")])

        async def small_batch() -> None:
            await store.append("a", [delta(str(i)) for i in range(_pg.COPY_FROM_ROWS - 1)])

        async def three() -> None:
            transactions = store.writer_stats.transactions
            assert await together(*(lambda s=s: store.append(s, [delta("y")]) for s in ("a", "b", "c"))) == [None] * 3
            assert store.writer_stats.transactions == transactions + 1  # all three in one transaction

        assert await traced(store, tmp_path, one) <= 2  # (BEGIN, the locked read) (the rest, COMMIT)
        quota = await traced(store, tmp_path, lambda: store.append("a", [delta("q")], quotas=Quotas()))
        assert quota <= 2  # the usage is read with the lock
        assert await traced(store, tmp_path, small_batch) <= 2
        assert await traced(store, tmp_path, three) <= 2 * 3 + 1  # each its read and its sync; the COMMIT
        large = await traced(store, tmp_path, lambda: store.append("a", [delta("z")] * _pg.COPY_FROM_ROWS))
        assert large <= 5  # and the COPY: the pipeline's answers, the COPY's start and its end


async def test_a_request_failing_in_the_database_is_blamed_on_itself_not_on_the_next(postgres_url: str) -> None:
    """The failing statement's answer is read only at the request's sync: before the next request begins."""
    async with open_postgres(postgres_url, max_batch=8) as store:
        for session in ("before", "bad", "after"):
            await store.create_session(session, runtime="scripted")
            await store.append(session, [session_created()])
        with psycopg.connect(postgres_url, autocommit=True) as conn:  # the next seq of "bad" is taken already
            conn.execute("INSERT INTO events(session_id, seq, task_id, type, time, schema_version, body) "
                         "VALUES ('bad', 2, NULL, 'x', 'x', 1, '{}')")
        transactions = store.writer_stats.transactions
        outcomes = await together(lambda: store.append("before", [delta("1")]),
                                  lambda: store.append("bad", [delta("2")]),
                                  lambda: store.append("after", [delta("3")]))
        assert store.writer_stats.transactions == transactions + 1  # one transaction for the three
        before, bad, after = outcomes
        assert before is None and after is None, outcomes
        assert isinstance(bad, DatabaseError) and "'bad'" in str(bad) and not bad.storage_fault
        assert [e.seq for e in await store.read("before")] == [1, 2]
        assert [e.seq for e in await store.read("after")] == [1, 2]
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            assert conn.execute("SELECT last_seq FROM sessions WHERE session_id = 'bad'").fetchone() == (1,)
            conn.execute("DELETE FROM events WHERE session_id = 'bad' AND seq = 2")
        # Alone (no savepoint: the error surfaces at the commit) it fails the same way, and the writer goes on.
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute("INSERT INTO events(session_id, seq, task_id, type, time, schema_version, body) "
                         "VALUES ('bad', 2, NULL, 'x', 'x', 1, '{}')")
        with pytest.raises(DatabaseError, match="'bad'"):
            await store.append("bad", [delta("4")])
        assert [e.seq for e in await store.append("after", [delta("5")])] == [3]


async def test_small_and_large_appends_store_the_same_rows(postgres_url: str) -> None:
    """Appends below COPY_FROM_ROWS go as one statement of arrays inside the pipeline, larger ones as a COPY: the
    rows stored are the same, whatever the text holds."""
    size = _pg.COPY_FROM_ROWS + 3
    at = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    texts = [AWKWARD[i % len(AWKWARD)] + str(i) for i in range(size)]
    drafts = [EventDraft(type=EventType.MODEL_OUTPUT_DELTA, runtime=RUNTIME, time=at,
                         payload={"block_id": "b1", "delta": text}) for text in texts]
    async with open_postgres(postgres_url) as store:
        await store.create_session("large", runtime="scripted")
        await store.create_session("small", runtime="scripted")
        await store.append("large", drafts)
        for start in range(0, size, 7):
            await store.append("small", drafts[start:start + 7])
        large, small = await store.read("large"), await store.read("small")
    assert [e.payload.delta for e in small] == texts  # type: ignore[attr-defined]
    assert [e.model_dump(exclude={"trace"}) for e in small] == [e.model_dump(exclude={"trace"}) for e in large]
    columns = "seq, task_id, type, time, schema_version, replace(body, %s, 'S')"
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        rows = {session: conn.execute(f"SELECT {columns} FROM events WHERE session_id = %s ORDER BY seq",
                                      (session, session)).fetchall() for session in ("large", "small")}
        usage = conn.execute("SELECT session_id, last_seq, stored_bytes FROM sessions ORDER BY session_id").fetchall()
    assert rows["small"] == rows["large"] and len(rows["small"]) == size
    assert usage == [("large", size, usage[0][2]), ("small", size, usage[0][2])]


async def test_a_writer_connection_the_server_ended_is_replaced_before_the_next_append(postgres_url: str) -> None:
    async with open_postgres(postgres_url) as store:
        await store.create_session("s", runtime="scripted")
        await store.append("s", [session_created()])
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            ended = admin.execute("SELECT pg_terminate_backend(pid, 60000) FROM pg_stat_activity WHERE datname = "
                                  "current_database() AND pid <> pg_backend_pid()").fetchall()  # (waits for the end)
        assert ended  # (the readers' and the listener's too; they come back by themselves)
        assert [e.seq for e in await store.append("s", [delta("after")])] == [2]


@pytest.fixture(scope="module")
def array_conn(postgres_server: Any) -> Any:
    with psycopg.connect(postgres_server.new_database(), autocommit=True) as conn:
        yield conn


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.none() | st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\0")),
                min_size=1, max_size=8))
def test_text_array_literals_read_back_as_the_values(array_conn: Any, values: list[str | None]) -> None:
    literal = _pg._array_literal(values)
    assert literal is not None
    assert array_conn.execute("SELECT %s::text[]", (literal,)).fetchone() == (values,)


@given(st.lists(st.none() | st.integers(min_value=-2**63, max_value=2**63 - 1), min_size=1, max_size=8))
def test_integer_array_literals_read_back_as_the_values(values: list[int | None]) -> None:
    literal = _pg._array_literal(values)
    assert literal is not None
    assert literal == "{" + ",".join("NULL" if v is None else str(v) for v in values) + "}"


def test_values_without_an_array_literal_are_left_to_the_caller() -> None:
    assert _pg._array_literal([b"bytes"]) is None
    assert _pg._array_literal(["a\0b"]) is None  # a NUL would split a value: the rows go as a COPY instead
    assert _pg._array_literal([True]) is None


def test_inside_a_pipeline_rows_go_as_arrays_or_a_copy_and_the_transaction_holds_both(postgres_url: str) -> None:
    db = _pg.PostgresDb(postgres_url, "test", "origin")
    try:
        db.ready()
        db.execute("CREATE TABLE t (n BIGINT NOT NULL, v TEXT, b BOOLEAN)")
        db.begin(pipelined=True)
        db.executemany("INSERT INTO t(n, v, b) VALUES (?, ?, ?)", [(1, "a", True), (2, None, False)])  # no literal
        db.executemany("INSERT INTO t(n, v) VALUES (?, ?)", [(3, 'x"y'), (4, None)])  # arrays, back in the pipeline
        db.executemany("INSERT INTO t(n, v) VALUES (?, ?)", [(n, "many") for n in range(5, 5 + _pg.COPY_FROM_ROWS)])
        db.commit()
        rows = [tuple(row) for row in db.execute("SELECT n, v, b FROM t WHERE n < 5 ORDER BY n")]
        assert rows == [(1, "a", True), (2, None, False), (3, 'x"y', None), (4, None, None)]
        assert db.scalar("SELECT count(*) FROM t") == 4 + _pg.COPY_FROM_ROWS
        db.begin(pipelined=True)  # a failing insert's error surfaces at the commit; nothing of it stays
        db.executemany("INSERT INTO t(n, v) VALUES (?, ?)", [(99, "x"), (None, "y")])
        with pytest.raises(psycopg.errors.NotNullViolation):
            db.commit()
        db.rollback()
        assert db.scalar("SELECT count(*) FROM t") == 4 + _pg.COPY_FROM_ROWS
    finally:
        db.close()
