"""What is particular to the PostgreSQL store: several stores (supervisors) on one database, the live tail between
them, its schema and its errors. The recorder contract itself runs on it too (``backends``)."""

from __future__ import annotations

import random
from pathlib import Path

import psycopg
import pytest
import trio
import trio.lowlevel

from codesdk.supervisor.store import (
    DatabaseError,
    EventStore,
    InvalidTransition,
    SchemaTooNew,
    StoreError,
    TaskState,
    TaskUpdate,
    open_postgres,
)
from codesdk.protocol import IsolationLevel
from codesdk.supervisor.store._pg_schema import LATEST

from tests.postgres import PostgresServer
from tests.seeds import Seed
from tests.store.store_helpers import delta, session_created

#: A subscriber that would wait this long before reading on its own: only a notice can wake it within a test.
NO_POLLING = 3600.0


async def follow(store: EventStore, session_id: str, count: int, after_seq: int = 0) -> list[int]:
    seqs = []
    async with store.subscribe(session_id, after_seq) as events:
        async for event in events:
            seqs.append(event.seq)
            if len(seqs) == count:
                return seqs
    raise AssertionError("the subscription ended early")


async def test_a_subscriber_on_one_store_sees_what_another_store_commits_without_polling(postgres_url: str) -> None:
    with trio.fail_after(60):
        async with open_postgres(postgres_url, poll_interval_s=NO_POLLING) as a, \
                open_postgres(postgres_url) as b:
            await b.create_session("s1", runtime="scripted")
            await b.append("s1", [session_created()])
            got: list[int] = []

            async def subscriber() -> None:
                got.extend(await follow(a, "s1", 20))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(subscriber)
                for i in range(19):
                    await b.append("s1", [delta(f"d{i}")])
                    await trio.lowlevel.checkpoint()
            assert got == list(range(1, 21))


async def test_the_tail_survives_a_lost_notification_connection_without_gaps_or_duplicates(
        postgres_url: str) -> None:
    """The listener's connection is terminated by the server while events keep coming: the follower still gets
    every event once, in order (the listener reconnects and the subscriber reads what it missed)."""
    with trio.fail_after(60):
        async with open_postgres(postgres_url, poll_interval_s=NO_POLLING) as a, \
                open_postgres(postgres_url) as b:
            await b.create_session("s1", runtime="scripted")
            await b.append("s1", [session_created()])
            got: list[int] = []
            half = trio.Event()

            async def subscriber() -> None:
                async with a.subscribe("s1") as events:
                    async for event in events:
                        got.append(event.seq)
                        if event.seq == 10:
                            half.set()
                        if event.seq == 30:
                            return

            async with trio.open_nursery() as nursery:
                nursery.start_soon(subscriber)
                for i in range(9):
                    await b.append("s1", [delta(f"d{i}")])
                await half.wait()
                killed = await trio.to_thread.run_sync(terminate_listeners, postgres_url)
                assert killed >= 1
                for i in range(20):
                    await b.append("s1", [delta(f"e{i}")])
            assert got == list(range(1, 31))


def terminate_listeners(url: str) -> int:
    """Have the server end every connection that LISTENs for CodeSDK's notices (as a restart or network cut
    would); how many it ended."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                            "WHERE query LIKE 'LISTEN %' AND pid <> pg_backend_pid()").fetchall()
    return len(rows)


async def test_stores_appending_to_one_session_at_once_get_gap_free_seqs(postgres_url: str) -> None:
    """Two supervisors' writers appending to the same session concurrently: every seq once, no gaps, and each
    append's events consecutive."""
    with trio.fail_after(120):
        async with open_postgres(postgres_url) as a, open_postgres(postgres_url) as b:
            await a.create_session("s1", runtime="scripted")
            appended: list[list[int]] = []

            async def writer(store: EventStore, name: str) -> None:
                for i in range(40):
                    stored = await store.append("s1", [delta(f"{name}{i}.{j}") for j in range(1 + i % 3)])
                    appended.append([e.seq for e in stored])

            async with trio.open_nursery() as nursery:
                for store, name in ((a, "a"), (b, "b")):
                    for k in range(3):
                        nursery.start_soon(writer, store, f"{name}{k}")
            seqs = sorted(seq for batch in appended for seq in batch)
            assert seqs == list(range(1, len(seqs) + 1))
            assert all(batch == list(range(batch[0], batch[0] + len(batch))) for batch in appended)
            assert [e.seq for e in await b.read("s1", 0, 10_000)] == seqs
            assert await a.last_seq("s1") == len(seqs)


RACE_SEED = Seed.from_env("CODESDK_TASK_END_RACE_SEED")


async def test_two_stores_ending_one_task_at_once_store_one_terminal_event(postgres_url: str) -> None:
    """A task ended by two supervisors at the same moment (one failing it after a takeover, one completing it):
    exactly one terminal event is stored, with its state; the other gets InvalidTransition and stores nothing."""
    with RACE_SEED.rng() as rng, trio.fail_after(120):
        async with open_postgres(postgres_url) as a, open_postgres(postgres_url) as b:
            for round_ in range(20):
                session_id, task_id = f"s{round_}", f"t{round_}"
                await a.create_session(session_id, runtime="scripted")
                await a.create_task(session_id, task_id, state=TaskState.RUNNING)
                outcomes: dict[str, str] = {}

                async def end(store: EventStore, name: str, state: TaskState, session_id: str = session_id,
                              task_id: str = task_id, outcomes: dict[str, str] = outcomes) -> None:
                    # Who goes first varies with the seed (a number of scheduler turns, not a duration); the
                    # assertions hold either way: exactly one ends it.
                    for _ in range(rng.randrange(4)):
                        await trio.lowlevel.checkpoint()
                    draft = delta(f"the end by {name}", session_id=session_id, task_id=task_id)
                    try:
                        await store.append(session_id, [draft],
                                           task_update=TaskUpdate(task_id=task_id, state=state))
                        outcomes[name] = "ended"
                    except InvalidTransition:
                        outcomes[name] = "refused"

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(end, a, "a", TaskState.COMPLETED)
                    nursery.start_soon(end, b, "b", TaskState.FAILED)
                assert sorted(outcomes.values()) == ["ended", "refused"], f"round {round_}: {outcomes}"
                events = await b.read(session_id)
                assert len(events) == 1, f"round {round_}"
                task = await b.get_task(task_id)
                winner = next(name for name, outcome in outcomes.items() if outcome == "ended")
                assert task.state is (TaskState.COMPLETED if winner == "a" else TaskState.FAILED)


async def test_supervisors_opening_a_new_database_together_migrate_it_once(postgres_url: str) -> None:
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(open_and_ping, postgres_url)
        with psycopg.connect(postgres_url) as conn:
            assert conn.execute("SELECT version FROM schema_migrations ORDER BY version").fetchall() == [
                (v,) for v in range(1, LATEST + 1)]


async def open_and_ping(url: str) -> None:
    async with open_postgres(url) as store:
        await store.ping()


async def test_a_database_of_a_newer_codesdk_is_refused_and_left_alone(postgres_url: str) -> None:
    with trio.fail_after(60):
        async with open_postgres(postgres_url) as store:
            await store.create_session("s1", runtime="scripted")
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute("INSERT INTO schema_migrations VALUES (%s, 'from the future', 'now')", (LATEST + 1,))
        with pytest.raises(SchemaTooNew, match="upgrade codesdk"):
            async with open_postgres(postgres_url):
                pass
        with psycopg.connect(postgres_url) as conn:
            assert conn.execute("SELECT session_id FROM sessions").fetchall() == [("s1",)]


async def test_a_database_with_other_tables_is_not_taken_over(postgres_url: str) -> None:
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE invoices (id INT)")
    with trio.fail_after(60), pytest.raises(StoreError, match="not a CodeSDK database"):
        async with open_postgres(postgres_url):
            pass
    with psycopg.connect(postgres_url) as conn:
        assert conn.execute("SELECT to_regclass('sessions')").fetchone() == (None,)


async def test_errors_name_the_database_but_never_its_password(postgres_server: PostgresServer) -> None:
    url = f"postgresql://codesdk:s3cret-pw@/no_such_db?host={postgres_server.socket_dir}"
    with trio.fail_after(60), pytest.raises(DatabaseError) as raised:
        async with open_postgres(url):
            pass
    message = str(raised.value)
    assert "s3cret-pw" not in message and "no_such_db" in message and "does not exist" in message
    for unreadable in ("postgresql://codesdk:s3cret-pw@/db?bogus_option=1",
                       "postgresql://codesdk:s3cret%zz-pw@/db",  # libpq quotes the token it cannot decode
                       "postgresql://codesdk:s3cret pw@/db",
                       "postgresql://codesdk:s3cret-pw@[::1/db"):
        with pytest.raises(StoreError, match="not a PostgreSQL URL") as bad:
            async with open_postgres(unreadable):
                pass
        assert "s3cret" not in str(bad.value), unreadable


async def test_large_blobs_live_in_the_database_for_every_store(postgres_url: str) -> None:
    """A blob one supervisor wrote is read by another: there are no blob files on either host."""
    data = bytes(random.Random(7).randbytes(3 * 1024 * 1024))
    with trio.fail_after(60):
        async with open_postgres(postgres_url) as a, open_postgres(postgres_url) as b:
            ref = await a.put_blob(data, "application/x-test")
            assert await b.get_blob(ref) == data
            info = await b.blob_info(ref)
            assert (info.size, info.media_type) == (len(data), "application/x-test")



def test_a_batch_of_rows_goes_to_the_server_as_one_copy_not_a_statement_per_row(postgres_url: str,
                                                                                   tmp_path: Path) -> None:
    """The append path's insert (``executemany`` of a plain INSERT) is one COPY: no row is bound as a statement of its
    own (the protocol trace counts Bind messages), and values the COPY text format must escape arrive unchanged."""
    from codesdk.supervisor.store import _pg

    values = ["tab\there", "line\nbreak", "cr\rhere", "back\\slash \\N \\t", "ünï€ode 🙂", "", "\\.", None]
    db = _pg.PostgresDb(postgres_url, "test", "origin")
    try:
        db.ready()
        db.execute("CREATE TABLE copied (n BIGINT NOT NULL, v TEXT)")
        trace = tmp_path / "trace"
        with trace.open("w") as out:
            db.conn.pgconn.trace(out.fileno())
            try:
                db.executemany("INSERT INTO copied(n, v) VALUES (?, ?)", [(i, v) for i, v in enumerate(values)])
            finally:
                db.conn.pgconn.untrace()
        binds = sum("\tBind\t" in line for line in trace.read_text().splitlines())
        assert binds < 2, f"{binds} Bind messages for {len(values)} rows"
        assert [tuple(row) for row in db.execute("SELECT n, v FROM copied ORDER BY n")] == list(enumerate(values))
        with pytest.raises(psycopg.errors.NotNullViolation):  # the same constraints as an INSERT
            db.executemany("INSERT INTO copied(n, v) VALUES (?, ?)", [(99, "x"), (None, "y")])
        assert db.scalar("SELECT count(*) FROM copied") == len(values)  # nothing of the failed batch stayed
    finally:
        db.close()


async def test_an_event_must_name_a_stored_session_and_a_session_keeps_its_events(postgres_url: str) -> None:
    """What the events' foreign key promised, kept by the statement-level triggers that replace it (migration 4):
    rows naming an unknown session are refused (however many rows the statement has), and a session with events can
    be neither deleted nor renamed; a session without events still can."""
    async with open_postgres(postgres_url) as store:
        await store.create_session("s1", runtime="scripted")
        await store.append("s1", [session_created(), delta("a")])
        await store.create_session("empty", runtime="scripted")
    columns = "session_id, seq, task_id, type, time, schema_version, body"
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.ForeignKeyViolation):
            conn.execute(f"INSERT INTO events({columns}) VALUES ('s1', 3, NULL, 't', 't', 1, '{{}}'), "
                         "('nobody', 1, NULL, 't', 't', 1, '{}')")
        with pytest.raises(psycopg.errors.ForeignKeyViolation), conn.cursor() as cursor, \
                cursor.copy(f"COPY events({columns}) FROM STDIN") as copy:
            copy.write_row(("nobody", 1, None, "t", "t", 1, "{}"))
        with pytest.raises(psycopg.errors.ForeignKeyViolation):
            conn.execute("DELETE FROM sessions WHERE session_id = 's1'")
        with pytest.raises(psycopg.errors.ForeignKeyViolation):
            conn.execute("UPDATE sessions SET session_id = 's2' WHERE session_id = 's1'")
        conn.execute("UPDATE sessions SET last_seq = last_seq WHERE session_id = 's1'")  # other columns: as before
        assert conn.execute("SELECT count(*) FROM events").fetchone() == (2,)
        conn.execute("DELETE FROM sessions WHERE session_id = 'empty'")


async def test_a_database_at_schema_3_with_events_moves_to_the_triggers_and_keeps_them(postgres_url: str) -> None:
    """Migration 4 on a database that already holds sessions and events (as a supervisor of the previous release
    left it): its events stay, appends go on, and what the dropped foreign key refused is still refused."""
    from codesdk.supervisor.store import _pg
    from codesdk.supervisor.store._pg_schema import migrate

    db = _pg.PostgresDb(postgres_url, "test", "origin")
    try:
        db.ready()
        assert migrate(db, target=3) == 0
    finally:
        db.close()
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        assert conn.execute("SELECT max(version) FROM schema_migrations").fetchone() == (3,)
        for session_id in ("old", "raw"):
            conn.execute("INSERT INTO sessions(session_id, runtime, namespace, created_at) "
                         "VALUES (%s, 'scripted', 'default', '2026-01-01T00:00:00Z')", (session_id,))
        conn.execute("INSERT INTO events(session_id, seq, task_id, type, time, schema_version, body) "
                     "VALUES ('raw', 1, NULL, 't', 't', 1, '{}')")
    async with open_postgres(postgres_url) as store:  # migrates to the latest
        await store.append("old", [session_created(), delta("kept")])
        assert [event.seq for event in await store.read("old")] == [1, 2]
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        assert conn.execute("SELECT max(version) FROM schema_migrations").fetchone() == (LATEST,)
        for session_id in ("old", "raw"):
            with pytest.raises(psycopg.errors.ForeignKeyViolation):
                conn.execute("DELETE FROM sessions WHERE session_id = %s", (session_id,))
        with pytest.raises(psycopg.errors.ForeignKeyViolation):
            conn.execute("INSERT INTO events(session_id, seq, task_id, type, time, schema_version, body) "
                         "VALUES ('nobody', 1, NULL, 't', 't', 1, '{}')")
        assert conn.execute("SELECT count(*) FROM events WHERE session_id = 'raw'").fetchone() == (1,)


async def test_sessions_from_before_isolation_levels_are_namespaced(postgres_url: str) -> None:
    """A database at schema 6 (before a session stored its isolation level): migrated, its sessions say the level
    they ran at, their namespace's HOME."""
    from codesdk.supervisor.store import _pg
    from codesdk.supervisor.store._pg_schema import migrate

    db = _pg.PostgresDb(postgres_url, "test", "origin")
    try:
        db.ready()
        assert migrate(db, target=6) == 0
    finally:
        db.close()
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("INSERT INTO sessions(session_id, runtime, namespace, created_at, metadata) "
                     "VALUES ('old', 'scripted', 'default', '2026-01-01T00:00:00Z', '{}')")
    async with open_postgres(postgres_url) as store:  # migrates to the latest
        assert (await store.get_session("old")).isolation == IsolationLevel.NAMESPACED
        made = await store.create_session(runtime="scripted", isolation=IsolationLevel.EPHEMERAL)
        assert (await store.get_session(made.session_id)).isolation == IsolationLevel.EPHEMERAL
