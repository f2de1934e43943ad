"""A session's life in the store: titles, archiving and search in listings; forks copying a session's events; and
deletion, which removes the session whole and exactly the blobs no other session holds.

The tests that take ``recorder`` are part of the recorder contract (run against each backend); the property test
and the migration test look at the SQLite store's files and rows."""

from __future__ import annotations

import os
import random
import tempfile
from pathlib import Path

import apsw
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from codesdk.protocol import EventType, ForkPoint, IsolationLevel, SessionCreated, Trace, sha256_hex
from codesdk.protocol.api import SessionFilter
from codesdk.supervisor.store import (
    DB_FILENAME,
    INLINE_BLOB_MAX,
    BlobNotFound,
    EventDraft,
    EventStore,
    QuotaExceeded,
    Quotas,
    Recorder,
    SessionBusy,
    SessionRecord,
    TaskState,
    TaskUpdate,
    UnknownSession,
    UnknownTask,
)
from codesdk.supervisor.store._schema import MIGRATIONS, migrate

from tests.store.store_helpers import RUNTIME, delta, session_created, terminal


async def _session(store: Recorder, title: str | None = None, namespace: str = "default") -> str:
    record = await store.create_session(runtime="scripted", namespace=namespace, title=title)
    await store.append(record.session_id, [session_created()])
    return record.session_id


async def _fork(store: Recorder, session_id: str, *, quotas: Quotas | None = None) -> str:
    """A fork of the whole session (as the engine makes one)."""
    parent = await store.get_session(session_id)
    events = [e for e in await store.read(session_id, limit=1000) if e.type != EventType.SESSION_CREATED]
    fork = SessionRecord(session_id=f"ses_{os.urandom(16).hex()}", runtime=parent.runtime,
                         namespace=parent.namespace, created_at=parent.created_at,
                         forked_from=ForkPoint(session_id=session_id, seq=max(parent.last_seq, 1)))
    created = EventDraft(type=EventType.SESSION_CREATED, runtime=RUNTIME, trace=Trace(session_id=fork.session_id),
                         payload=SessionCreated(runtime=parent.runtime, namespace=parent.namespace,
                                                forked_from=fork.forked_from))
    return (await store.fork_session(session_id, created, events, record=fork, quotas=quotas)).session_id


async def test_listings_filter_by_state_and_search_titles_and_prompts(recorder: Recorder) -> None:
    with trio.fail_after(10):
        parser = await _session(recorder, "Fix the Parser")
        busy = await _session(recorder, "Docs")
        await recorder.create_task(busy, metadata={"prompt_preview": "Rewrite the README\x00 intro"})
        archived = await _session(recorder)
        await recorder.update_session(archived, archived=True)

        async def listed(state: SessionFilter = SessionFilter.LIVE, text: str | None = None) -> list[str]:
            return [s.session_id for s in await recorder.list_sessions(state=state, text=text)]

        assert await listed() == [parser, busy]
        assert await listed(SessionFilter.ALL) == [parser, busy, archived]
        assert await listed(SessionFilter.ARCHIVED) == [archived]
        assert await listed(SessionFilter.BUSY) == [busy]
        assert await listed(SessionFilter.IDLE) == [parser]
        assert await listed(text="parser") == [parser]  # any case
        assert await listed(text="readme") == [busy]  # a task's prompt
        assert await listed(text="%") == [] and await listed(text="_") == []  # no pattern characters
        assert (await recorder.get_session(busy)).active_task_id is not None
        first = (await recorder.get_session(archived)).archived_at
        assert first is not None
        await recorder.update_session(archived, archived=True)  # archived again: still since the first time
        assert (await recorder.get_session(archived)).archived_at == first
        back = await recorder.update_session(archived, archived=False, title="Back")
        assert back.archived_at is None and back.title == "Back"


async def test_a_fork_copies_the_events_and_keeps_the_seqs(recorder: Recorder) -> None:
    with trio.fail_after(10):
        parent = await _session(recorder)
        await recorder.append(parent, [delta("a"), delta("b")])
        fork = await _fork(recorder, parent)
        copied = await recorder.read(fork, limit=100)
        original = await recorder.read(parent, limit=100)
        assert [e.seq for e in copied] == [e.seq for e in original] == [1, 2, 3]
        assert [e.trace.session_id for e in copied] == [fork] * 3
        assert [e.payload for e in copied[1:]] == [e.payload for e in original[1:]]
        assert [e.time for e in copied[1:]] == [e.time for e in original[1:]]
        assert isinstance(copied[0].payload, SessionCreated) and copied[0].payload.forked_from == ForkPoint(
            session_id=parent, seq=3)
        record = await recorder.get_session(fork)
        assert record.forked_from == ForkPoint(session_id=parent, seq=3) and record.last_seq == 3
        await recorder.append(fork, [delta("c")])  # the fork goes on alone
        assert (await recorder.get_session(parent)).last_seq == 3


async def test_a_fork_counts_against_the_quotas_of_a_new_session_and_of_its_events(recorder: Recorder) -> None:
    with trio.fail_after(10):
        parent = await _session(recorder)
        await recorder.append(parent, [delta("x" * 100) for _ in range(5)])
        with pytest.raises(QuotaExceeded):
            await _fork(recorder, parent, quotas=Quotas(session_events=3))
        with pytest.raises(QuotaExceeded):
            await _fork(recorder, parent, quotas=Quotas(namespace_sessions=1))
        assert [s.session_id for s in await recorder.list_sessions(state=SessionFilter.ALL)] == [parent]


async def test_deleting_a_session_removes_it_whole_and_frees_its_quota(recorder: Recorder) -> None:
    with trio.fail_after(10):
        keep = await _session(recorder)
        await recorder.append(keep, [delta("kept")])
        doomed = await _session(recorder)
        task = await recorder.create_task(doomed, metadata={"prompt_preview": "hello"})
        await recorder.append(doomed, [delta("gone", task_id=task.task_id, session_id=doomed)])
        with pytest.raises(SessionBusy):  # never while a task of it is pending or running
            await recorder.drop_session(doomed)
        await recorder.append(doomed, [terminal()], task_update=TaskUpdate(task.task_id, state=TaskState.COMPLETED))
        quotas = Quotas(namespace_sessions=2)
        with pytest.raises(QuotaExceeded):
            await recorder.create_session(runtime="scripted", quotas=quotas)
        dropped = await recorder.drop_session(doomed)
        assert dropped.events == 3 and dropped.stored_bytes > 0 and not dropped.workspace_shared
        for lookup in (recorder.get_session(doomed), recorder.drop_session(doomed), recorder.read(doomed)):
            with pytest.raises(UnknownSession):
                await lookup
        with pytest.raises(UnknownTask):
            await recorder.get_task(task.task_id)
        assert [e.payload.delta for e in (await recorder.read(keep))[1:]] == ["kept"]  # type: ignore[attr-defined]
        await recorder.create_session(runtime="scripted", quotas=quotas)  # its place in the quota is free again


async def test_a_blob_stays_while_any_session_holds_it(recorder: Recorder) -> None:
    with trio.fail_after(10):
        big = os.urandom(INLINE_BLOB_MAX + 1)
        small = b'{"small": true}'
        first, second = await _session(recorder), await _session(recorder)
        big_ref = await recorder.put_blob(big, session_id=first)
        small_ref = sha256_hex(small)
        await recorder.append(first, [delta(f"{big_ref} {small_ref}")], blobs={small_ref: (small, "application/json")})
        pinned = await recorder.put_blob(big, session_id=second)  # put for an event of the second not yet stored
        assert pinned == big_ref
        fork = await _fork(recorder, first)  # names both by its copies
        assert set((await recorder.drop_session(first)).blobs) == set()
        await recorder.drop_session(fork)  # the second still holds the big one (put for it); the small one goes
        assert await recorder.get_blob(big_ref) == big
        with pytest.raises(BlobNotFound):
            await recorder.get_blob(small_ref)
        assert (await recorder.drop_session(second)).blobs == (big_ref,)
        with pytest.raises(BlobNotFound):
            await recorder.get_blob(big_ref)
        assert not await recorder.blob_exists(big_ref)


async def test_a_small_blob_put_again_goes_with_its_session(recorder: Recorder) -> None:
    """Stored inline with its events, then put again for the session: it stays inline (no file beside its row), so
    the session's deletion removes it whole."""
    with trio.fail_after(10):
        session = await _session(recorder)
        small = b"small and named twice"
        ref = sha256_hex(small)
        await recorder.append(session, [delta(f"see {ref}")], blobs={ref: (small, "text/plain")})
        assert await recorder.put_blob(small, session_id=session) == ref
        assert await recorder.get_blob(ref) == small
        assert (await recorder.drop_session(session)).blobs == (ref,)
        assert not await recorder.blob_exists(ref)


# --- properties (SQLite: blob files and rows) -------------------------------------------------------------------

_POOL = [b"small-%d" % n for n in range(3)] + [bytes([n]) * (INLINE_BLOB_MAX + 10) for n in range(3)]
_STEP = st.one_of(
    st.tuples(st.just("create"), st.integers(0, 5), st.integers(0, 5)),
    st.tuples(st.just("name"), st.integers(0, 5), st.integers(0, len(_POOL) - 1)),
    st.tuples(st.just("pin"), st.integers(0, 5), st.integers(0, len(_POOL) - 1)),
    st.tuples(st.just("fork"), st.integers(0, 5), st.integers(0, 5)),
    st.tuples(st.just("delete"), st.integers(0, 5), st.integers(0, 5)),
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(_STEP, min_size=1, max_size=25), seed=st.integers(0, 2**32 - 1))
def test_deletions_remove_exactly_the_blobs_no_session_holds(steps: list[tuple[str, int, int]], seed: int) -> None:
    """Sessions name (or have blobs put for them from) a pool of small and big blobs, fork and are deleted in any
    order: a blob some live session holds stays readable; one none holds is gone, row and file."""
    print(f"seed={seed}")  # shown on failure, with hypothesis's own reproduction line
    rng = random.Random(seed)

    async def run(data_dir: Path) -> None:
        async with EventStore.open(data_dir, synchronous="NORMAL") as store:
            live: list[str] = []
            holds: dict[str, set[bytes]] = {}
            for action, which, other in steps:
                if action == "create" or not live:
                    session = await _session(store)
                    live.append(session)
                    holds[session] = set()
                    continue
                session = live[which % len(live)]
                data = _POOL[other % len(_POOL)]
                ref = sha256_hex(data)
                if action == "name":
                    inline = {ref: (data, "text/plain")} if len(data) <= INLINE_BLOB_MAX and rng.random() < .5 else {}
                    if not inline:
                        await store.put_blob(data, session_id=session)
                    await store.append(session, [delta(f"see {ref}")], blobs=inline)
                    holds[session].add(data)
                elif action == "pin":
                    await store.put_blob(data, session_id=session)
                    holds[session].add(data)
                elif action == "fork":
                    fork = await _fork(store, session)
                    live.append(fork)
                    named = {d for d in holds[session] if any(sha256_hex(d) in str(e.payload.model_dump())
                                                             for e in await store.read(session, limit=1000))}
                    holds[fork] = named
                else:
                    await store.drop_session(session)
                    live.remove(session)
                    del holds[session]
                held: set[bytes] = set().union(*holds.values())
                files = {p.name for p in (data_dir / "blobs").rglob("*") if p.is_file()}
                for blob in _POOL:  # stored exactly while held: its row, and its file if it has one
                    ref = sha256_hex(blob)
                    assert await store.blob_exists(ref) == (blob in held), (action, blob[:8])
                    if blob in held:
                        assert await store.get_blob(ref) == blob
                    else:
                        assert ref.removeprefix("sha256:")[2:] not in files

    with tempfile.TemporaryDirectory() as tmp:
        trio.run(run, Path(tmp) / "data")


async def test_migrating_a_store_gives_its_sessions_the_blobs_their_events_name(tmp_path: Path) -> None:
    """A store from before blob holders were kept: the migration finds each session's blobs in its events."""
    with trio.fail_after(20):
        data_dir = tmp_path / "data"
        async with EventStore.open(data_dir) as store:
            first, second = await _session(store), await _session(store)
            small = b"named by both"
            ref = sha256_hex(small)
            await store.append(first, [delta(f"here: {ref}")], blobs={ref: (small, "text/plain")})
            await store.append(second, [delta(f"and here: {ref}")])
        conn = apsw.Connection(str(data_dir / DB_FILENAME))
        conn.execute("DROP TABLE blob_holders")  # back to the version before them: as an older store has it
        _undo_budgets(conn)
        conn.execute("DROP TABLE questions")
        for column in ("title", "archived_at", "forked_from", "forked_at_seq", "isolation"):
            conn.execute(f"ALTER TABLE sessions DROP COLUMN {column}")
        conn.execute("ALTER TABLE tasks DROP COLUMN prompt")
        conn.pragma("user_version", 9)
        conn.execute("DELETE FROM schema_migrations WHERE version >= 10")
        assert migrate(conn, str(data_dir)) == 9
        holders = sorted(conn.execute("SELECT session_id FROM blob_holders WHERE ref = ?", (ref,)).fetchall())
        assert holders == sorted([(first,), (second,)])
        conn.close()
        async with EventStore.open(data_dir) as store:
            await store.drop_session(first)
            assert await store.get_blob(ref) == small  # the second holds it
            await store.drop_session(second)
            assert not await store.blob_exists(ref)


async def test_a_session_keeps_its_isolation_level(recorder: Recorder) -> None:
    plain = await recorder.create_session(runtime="scripted")
    own = await recorder.create_session(runtime="scripted", isolation=IsolationLevel.EPHEMERAL)
    assert plain.isolation == IsolationLevel.NAMESPACED and own.isolation == IsolationLevel.EPHEMERAL
    assert (await recorder.get_session(own.session_id)).isolation == IsolationLevel.EPHEMERAL
    assert (await recorder.get_session(plain.session_id)).isolation == IsolationLevel.NAMESPACED
    listed = {s.session_id: s.isolation for s in await recorder.list_sessions()}
    assert listed == {plain.session_id: IsolationLevel.NAMESPACED, own.session_id: IsolationLevel.EPHEMERAL}


async def test_migrating_a_store_gives_its_sessions_the_namespaced_level(tmp_path: Path) -> None:
    """A store from before isolation levels: its sessions ran in their namespace's HOME, and say so."""
    with trio.fail_after(20):
        data_dir = tmp_path / "data"
        async with EventStore.open(data_dir) as store:
            session_id = await _session(store)
        conn = apsw.Connection(str(data_dir / DB_FILENAME))
        conn.execute("ALTER TABLE sessions DROP COLUMN isolation")
        _undo_budgets(conn)
        conn.execute("DROP TABLE questions")
        conn.pragma("user_version", 10)
        conn.execute("DELETE FROM schema_migrations WHERE version >= 11")
        assert migrate(conn, str(data_dir)) == 10
        conn.close()
        async with EventStore.open(data_dir) as store:
            assert (await store.get_session(session_id)).isolation == IsolationLevel.NAMESPACED
            made = await store.create_session(runtime="scripted", isolation=IsolationLevel.SHARED)
            assert (await store.get_session(made.session_id)).isolation == IsolationLevel.SHARED


def _budgets_step() -> int:
    """The version of the migration that added budgets (found by name: versions are renumbered as steps land)."""
    return next(m.version for m in MIGRATIONS if m.name.startswith("session budgets"))


def _undo_budgets(conn: apsw.Connection) -> None:
    """What the budgets migration added, taken away again (a store from before it), with the webhooks' tables
    that came after it."""
    for table in ("webhook_attempts", "webhook_deliveries", "webhook_kinds", "webhooks"):
        conn.execute(f"DROP TABLE {table}")
    conn.execute("ALTER TABLE sessions DROP COLUMN budget")
    conn.execute("DROP TABLE namespace_spend")


async def test_migrating_a_store_gives_its_sessions_no_budget_and_its_namespaces_nothing_spent(
        tmp_path: Path) -> None:
    with trio.fail_after(20):
        data_dir = tmp_path / "data"
        async with EventStore.open(data_dir) as store:
            session_id = await _session(store)
        conn = apsw.Connection(str(data_dir / DB_FILENAME))
        before = _budgets_step() - 1
        for later in reversed(MIGRATIONS[before:]):  # only the budgets step and what came after it are undone
            assert later.name.startswith(("session budgets", "webhook endpoints")), "undo the later steps here too"
        _undo_budgets(conn)
        conn.pragma("user_version", before)
        conn.execute("DELETE FROM schema_migrations WHERE version > ?", (before,))
        assert migrate(conn, str(data_dir)) == before
        conn.close()
        async with EventStore.open(data_dir) as store:
            assert (await store.get_session(session_id)).budget is None
            assert (await store.namespace_spend("default", "2026-11")).cost_usd == 0
