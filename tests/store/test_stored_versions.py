"""Stored events of older schema versions are read by this build: the frozen corpora (fixtures/stored_events/vN)
written into a database as their build left it and read back through the store; a fictional later build's
upcaster applied by the store to rows on disk; a row newer than the build refused and kept; the upcasting rules
as properties.

The unit tests of ``UpcasterRegistry`` itself (walking steps, refusing a newer dict, registering) are in
tests/protocol/test_models.py; here is what the store does with rows on disk.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import apsw
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from codesdk.testing.invariants import check_session
from codesdk.protocol import (
    EVENT_MODELS,
    SCHEMA_VERSION,
    BlockKind,
    EventType,
    Model,
    ModelOutputCompleted,
    ModelOutputCompletedEvent,
    NormalizedEvent,
    UpcasterRegistry,
    upcasters,
)
from codesdk.supervisor.store import DB_FILENAME, EventStore
from codesdk.supervisor.store._schema import LATEST, migrate
from codesdk.supervisor.store._sql import _event
from codesdk.supervisor.store._stored import StoredEvent
from codesdk.supervisor.store._time import to_text

from tests.protocol.test_models import normalized_events
from tests.store.stored_events import Corpus, corpus_versions, read_corpus

VERSIONS = corpus_versions()
CORPORA = {version: read_corpus(version) for version in VERSIONS}
#: The corpus of this build's own schema version (test_every_schema_version_up_to_this_builds_has_a_frozen_corpus
#: insists there is one).
CURRENT = CORPORA.get(SCHEMA_VERSION)

Row = Mapping[str, Any]


# --- a database as an old build left it -----------------------------------------------------------------------


def _insert_events(conn: apsw.Connection, rows: Iterable[Row]) -> None:
    """Rows into ``events`` column for column, as they were stored (the session's ``last_seq`` follows)."""
    for row in rows:
        columns = list(row)
        conn.execute(f"INSERT INTO events({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})",
                     tuple(row[c] for c in columns))
        conn.execute("UPDATE sessions SET last_seq = max(last_seq, ?) WHERE session_id = ?",
                     (row["seq"], row["session_id"]))


def _write_as_stored(data_dir: Path, corpus: Corpus, *, extra: Sequence[Row] = ()) -> None:
    """The database a build at the corpus's version left: its schema (``store_schema_version``), a session row
    per session (from its session.created) and the event rows exactly as frozen; then ``extra`` rows."""
    data_dir.mkdir(parents=True)
    path = str(data_dir / DB_FILENAME)
    conn = apsw.Connection(path)
    try:
        conn.pragma("journal_mode", "WAL")
        migrate(conn, path, target=corpus.store_schema_version)
        with conn:
            for session_id, rows in corpus.sessions().items():
                created = json.loads(rows[0]["body"])
                assert created["type"] == EventType.SESSION_CREATED, f"session {session_id} starts with {created}"
                payload = created["payload"]
                conn.execute(
                    "INSERT INTO sessions(session_id, runtime, namespace, workspace, created_at, metadata) "
                    "VALUES (?, ?, ?, ?, ?, ?)",
                    (session_id, payload["runtime"], payload["namespace"], payload.get("workspace"), rows[0]["time"],
                     json.dumps(payload.get("metadata", {}))))
            _insert_events(conn, corpus.rows)
            _insert_events(conn, extra)
    finally:
        conn.close()


def _on_disk(data_dir: Path) -> list[tuple[Any, ...]]:
    """Every event row as the database holds it now."""
    conn = apsw.Connection(str(data_dir / DB_FILENAME), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        return conn.execute("SELECT * FROM events ORDER BY session_id, seq").fetchall()
    finally:
        conn.close()


async def _read_all(store: EventStore, session_id: str, page: int = 40) -> list[NormalizedEvent]:
    """The session's events through the store's paged read."""
    events: list[NormalizedEvent] = []
    while batch := await store.read(session_id, after_seq=events[-1].seq if events else 0, limit=page):
        events += batch
    return events


def _raw(row: Row) -> dict[str, Any]:
    """A row as the store decodes it before upcasting (the key column is the one source of seq)."""
    return {**json.loads(row["body"]), "seq": row["seq"]}


def _kept(stored: Any, loaded: Any, where: str = "") -> list[str]:
    """Where a stored value is not in ``loaded`` as it was (a field this build adds, with its default, is fine)."""
    if isinstance(stored, dict) and isinstance(loaded, dict):
        return [problem for key, value in stored.items()
                for problem in (_kept(value, loaded[key], f"{where}.{key}") if key in loaded
                                else [f"{where}.{key} is gone"])]
    if isinstance(stored, list) and isinstance(loaded, list) and len(stored) == len(loaded):
        return [problem for index, (s, r) in enumerate(zip(stored, loaded, strict=True))
                for problem in _kept(s, r, f"{where}[{index}]")]
    same = stored == loaded and type(stored) is type(loaded)  # True == 1, but a bool read back as 1 is not kept
    return [] if same else [f"{where}: stored {stored!r}, read {loaded!r}"]


#: Each corpus, as a test parameter named by its version.
EACH_CORPUS = [pytest.param(CORPORA[v], id=f"v{v}") for v in VERSIONS]


# --- the corpora ---------------------------------------------------------------------------------------------


def test_every_schema_version_up_to_this_builds_has_a_frozen_corpus() -> None:
    """Bumping SCHEMA_VERSION means freezing what the new version stores (scripts/freeze-stored-events), and an
    old version's corpus is never removed: each is a promise to read what is on users' disks."""
    assert VERSIONS == list(range(1, SCHEMA_VERSION + 1)), (
        f"frozen corpora: {VERSIONS}; schema versions of this build: 1..{SCHEMA_VERSION}. Freeze the current one "
        "with scripts/freeze-stored-events; never delete one")
    assert upcasters.current == SCHEMA_VERSION


@pytest.mark.parametrize("corpus", EACH_CORPUS)
def test_a_corpus_is_what_its_manifest_says(corpus: Corpus) -> None:
    manifest = corpus.manifest
    assert manifest["schema_version"] == corpus.version and manifest["events"] == len(corpus.rows)
    assert manifest["sessions"] == len(corpus.sessions()) and 1 <= corpus.store_schema_version <= LATEST
    counts = {t: sum(1 for row in corpus.rows if row["type"] == t) for t in manifest["event_types"]}
    assert counts == manifest["event_types"] and sum(counts.values()) == len(corpus.rows)
    for session_id, rows in corpus.sessions().items():
        assert [row["seq"] for row in rows] == list(range(1, len(rows) + 1)), session_id
    for row in corpus.rows:
        body = json.loads(row["body"])
        assert row["schema_version"] == body["schema_version"] == corpus.version
        assert "seq" not in body and row["type"] == body["type"]


@pytest.mark.parametrize("corpus", EACH_CORPUS)
def test_every_stored_event_loads_through_the_stores_read_path(corpus: Corpus) -> None:
    """What fails when a model changes incompatibly without an upcaster: every frozen row, decoded as the store
    decodes a row (``_sql._event``, through the registry the store uses), gives an event of this build's schema
    whose class, seq, trace and time agree with the row's key columns. Every failing row is named."""
    problems: list[str] = []
    for row in corpus.rows:
        where = f"v{corpus.version} session {row['session_id']} seq {row['seq']} ({row['type']})"
        try:
            event = _event(row["seq"], row["body"])
        except (ValidationError, ValueError) as exc:
            problems.append(f"{where} no longer loads: {exc}")
            continue
        if (type(event), event.seq, event.schema_version, event.trace.session_id, event.trace.task_id,
                to_text(event.time)) != (EVENT_MODELS[EventType(row["type"])], row["seq"], SCHEMA_VERSION,
                                         row["session_id"], row["task_id"], row["time"]):
            problems.append(f"{where} loads as {event!r}, which disagrees with the row's columns")
    assert not problems, f"{len(problems)} stored event(s) break:\n" + "\n".join(problems[:25])


@pytest.mark.skipif(CURRENT is None, reason="no corpus of this build's schema version (see the test above)")
def test_events_of_this_builds_version_load_without_losing_a_field() -> None:
    """Loading is lossless: every stored field comes back with its stored value (a field added since, with a
    default, may come back too). So a field renamed or retyped without a version bump shows here even where
    pydantic would coerce the old value."""
    assert CURRENT is not None
    problems = [f"session {row['session_id']} seq {row['seq']}: {problem}" for row in CURRENT.rows
                for problem in _kept(json.loads(row["body"]), upcasters.load(_raw(row)).model_dump(
                    mode="json", exclude_none=True, exclude={"seq"}))]
    assert not problems, "\n".join(problems[:25])


@pytest.mark.parametrize("corpus", EACH_CORPUS)
async def test_a_database_written_by_that_build_reads_back_through_the_store(corpus: Corpus, tmp_path: Path) -> None:
    """The rows, in a database at the store schema their build had, opened by this build's store (migrating it if
    older): every session reads back through the paged read, the filtered read and the last-of-type read, in a
    writable and a read-only store; each keeps the invariants; and reading rewrites no row."""
    data_dir = tmp_path / "data"
    _write_as_stored(data_dir, corpus)
    before = _on_disk(data_dir)
    sessions = corpus.sessions()
    tool_types = [EventType.TOOL_CALL_REQUESTED, EventType.TOOL_CALL_COMPLETED, EventType.TOOL_CALL_DENIED]
    read_back: dict[str, list[NormalizedEvent]] = {}
    async with EventStore.open(data_dir, synchronous="NORMAL") as store:
        for session_id, rows in sessions.items():
            events = read_back[session_id] = await _read_all(store, session_id)
            assert events == [_event(row["seq"], row["body"]) for row in rows]
            check_session(events)
            assert await store.read_types(session_id, tool_types) == [e for e in events if e.type in tool_types]
            for event_type in {e.type for e in events}:
                assert await store.last_event_of_type(session_id, event_type) == \
                    [e for e in events if e.type == event_type][-1]
    async with EventStore.open(data_dir, read_only=True) as reader:
        for session_id in sessions:
            assert await _read_all(reader, session_id, page=1000) == read_back[session_id]
    after = _on_disk(data_dir)
    assert after == before and len(after) == len(corpus.rows)


# --- a later build, built here: schema version NEXT renames model.output.completed's ``text`` to ``content`` ----

NEXT = SCHEMA_VERSION + 1


class ModelOutputCompletedNext(Model):
    """model.output.completed as the later build has it."""

    block_id: str
    kind: BlockKind = BlockKind.TEXT
    content: str
    language: str | None = None


class ModelOutputCompletedNextEvent(NormalizedEvent):
    schema_version: int = NEXT
    type: Literal[EventType.MODEL_OUTPUT_COMPLETED] = EventType.MODEL_OUTPUT_COMPLETED
    payload: ModelOutputCompletedNext


def rename_text_to_content(raw: dict[str, Any]) -> dict[str, Any]:
    """The later build's upcaster from this build's version. It builds new dicts rather than editing the one it is
    given: the registry hands a step a shallow copy, so an edit in place would reach the caller's payload."""
    if raw.get("type") != EventType.MODEL_OUTPUT_COMPLETED:
        return raw
    payload = {key: value for key, value in raw["payload"].items() if key != "text"}
    return {**raw, "payload": {**payload, "content": raw["payload"]["text"]}}


class LaterBuild(UpcasterRegistry):
    """The registry of a build at schema version ``current`` (NEXT by default): this build's own steps up to
    SCHEMA_VERSION, then the later build's, and its model of model.output.completed."""

    def __init__(self, current: int = NEXT, *, with_step: bool = True) -> None:
        # Checked here, not on import: the corpus tests above must still run, and say what no longer loads.
        assert "text" in ModelOutputCompleted.model_fields, \
            "model.output.completed has no `text` any more: give this fictional later build another rename"
        super().__init__(current)
        if with_step:
            self.register(SCHEMA_VERSION)(rename_text_to_content)

    def upcast(self, raw: dict[str, Any]) -> dict[str, Any]:
        if int(raw.get("schema_version", 1)) < SCHEMA_VERSION:
            raw = upcasters.upcast(raw)
        return super().upcast(raw)

    def load(self, raw: dict[str, Any]) -> NormalizedEvent:
        upcast = self.upcast(raw)
        if upcast["type"] == EventType.MODEL_OUTPUT_COMPLETED:
            return ModelOutputCompletedNextEvent.model_validate(upcast)
        return NormalizedEvent.model_validate(upcast)


def _completed_row(row: Row, version: int, seq: int) -> dict[str, Any]:
    """A model.output.completed row as the later build would store it: ``content``, at ``version``."""
    body = rename_text_to_content(json.loads(row["body"]))
    return {**row, "seq": seq, "schema_version": version,
            "body": json.dumps({**body, "schema_version": version}, separators=(",", ":"))}


def _a_completed_row(corpus: Corpus) -> Row:
    return next(row for row in corpus.rows if row["type"] == EventType.MODEL_OUTPUT_COMPLETED)


def _last_seq(corpus: Corpus, session_id: str) -> int:
    return int(corpus.sessions()[session_id][-1]["seq"])


@pytest.mark.parametrize("corpus", EACH_CORPUS)
async def test_rows_on_disk_are_read_back_upcast_by_a_later_builds_store(corpus: Corpus, tmp_path: Path) -> None:
    """A store given the later build's registry reads this build's rows (and older) upcast to its shape — the
    renamed field carries the stored text, everything else is as this build reads it — and the later build's own
    rows in the same session as they are. The rows on disk stay as they were: upcasting is on read."""
    data_dir = tmp_path / "data"
    sample = _a_completed_row(corpus)
    session_id = str(sample["session_id"])
    newer = _completed_row(sample, NEXT, _last_seq(corpus, session_id) + 1)
    _write_as_stored(data_dir, corpus, extra=[newer])
    before = _on_disk(data_dir)
    with pytest.raises(ValidationError, match="content"):  # the rename is a real change: the old shape won't do
        ModelOutputCompletedNextEvent.model_validate({**_raw(sample), "schema_version": NEXT})
    renamed = 0
    async with EventStore.open(data_dir, synchronous="NORMAL", upcasters=LaterBuild()) as store:
        for sid, rows in corpus.sessions().items():
            events = await _read_all(store, sid)
            assert [e.seq for e in events] == [row["seq"] for row in rows] + ([newer["seq"]] if sid == session_id
                                                                                else [])
            assert {e.schema_version for e in events} == {NEXT}
            for row, event in zip(rows, events, strict=False):
                ours = _event(row["seq"], row["body"])  # as this build reads the row
                if row["type"] == EventType.MODEL_OUTPUT_COMPLETED:
                    assert isinstance(event, ModelOutputCompletedNextEvent) and isinstance(
                        ours, ModelOutputCompletedEvent)
                    assert event.payload.content == ours.payload.text and "text" not in type(event.payload).model_fields
                    assert event.payload.model_dump(exclude={"content"}) == ours.payload.model_dump(exclude={"text"})
                    renamed += 1
                assert event.model_dump(exclude={"schema_version", "payload"}) == \
                    ours.model_dump(exclude={"schema_version", "payload"})
                if row["type"] != EventType.MODEL_OUTPUT_COMPLETED:
                    assert event == ours.model_copy(update={"schema_version": NEXT})
        [last] = await store.read(session_id, after_seq=newer["seq"] - 1)
        assert isinstance(last, ModelOutputCompletedNextEvent)
        assert last.payload.content == json.loads(sample["body"])["payload"]["text"]
        assert await store.last_event_of_type(session_id, EventType.MODEL_OUTPUT_COMPLETED) == last
    assert renamed == corpus.manifest["event_types"][EventType.MODEL_OUTPUT_COMPLETED] > 0
    assert _on_disk(data_dir) == before


@pytest.mark.parametrize("corpus", EACH_CORPUS)
@pytest.mark.parametrize("later", [False, True], ids=["this-build", "later-build"])
async def test_rows_read_as_stored_are_what_the_models_say(corpus: Corpus, tmp_path: Path, later: bool) -> None:
    """What a stream sends on (``read_stored``: the row's body with its seq put in, not decoded when it is of the
    reading build's version; upcast first when older) is, as JSON, the event the paged read gives, and its model is
    that event; its SSE frame is that JSON on one data line. By this build and by a later one (whose store upcasts
    this build's rows)."""
    data_dir = tmp_path / "data"
    _write_as_stored(data_dir, corpus)
    registry = LaterBuild() if later else upcasters
    async with EventStore.open(data_dir, synchronous="NORMAL", upcasters=registry) as store:
        for session_id in corpus.sessions():
            events = await _read_all(store, session_id)
            stored: list[StoredEvent] = []
            while page := await store.read_stored(session_id, after_seq=stored[-1].seq if stored else 0, limit=40):
                stored += page
            assert [s.seq for s in stored] == [e.seq for e in events]
            for event, as_stored in zip(events, stored, strict=True):
                assert json.loads(as_stored.body) == event.to_json_obj()
                assert as_stored.type == event.type and as_stored.model() == event
                head, data = as_stored.frame.split(b"\ndata: ")
                assert head == b"id: %d\nevent: %s" % (event.seq, event.type.value.encode())
                assert data.endswith(b"\n\n") and b"\n" not in data[:-2] and json.loads(data) == event.to_json_obj()


@pytest.mark.skipif(CURRENT is None, reason="no corpus of this build's schema version")
async def test_a_row_newer_than_this_build_is_refused_and_kept(tmp_path: Path) -> None:
    """A row a later build stored (a downgrade, or a second supervisor on the same data) is refused by name and
    version, with what to do; the rows before it still read; nothing on disk changes; and the later build, opened
    on the same data dir, reads it all."""
    assert CURRENT is not None
    data_dir = tmp_path / "data"
    sample = _a_completed_row(CURRENT)
    session_id = str(sample["session_id"])
    last_seq = _last_seq(CURRENT, session_id)
    newer = _completed_row(sample, NEXT, last_seq + 1)
    _write_as_stored(data_dir, CURRENT, extra=[newer])
    before = _on_disk(data_dir)
    refusal = rf"schema_version {NEXT}, newer than this build knows \({SCHEMA_VERSION}\); upgrade codesdk"
    async with EventStore.open(data_dir, synchronous="NORMAL") as store:
        with pytest.raises(ValueError, match=refusal):
            await _read_all(store, session_id)
        with pytest.raises(ValueError, match=refusal):
            await store.last_event_of_type(session_id, EventType.MODEL_OUTPUT_COMPLETED)
        older = await store.read(session_id, limit=last_seq)
        assert [e.seq for e in older] == list(range(1, last_seq + 1))
        check_session(older)
        assert (await store.last_event_of_type(session_id, EventType.TASK_STARTED)) is not None
    assert _on_disk(data_dir) == before
    async with EventStore.open(data_dir, synchronous="NORMAL", upcasters=LaterBuild()) as later:
        events = await _read_all(later, session_id)
    assert [e.seq for e in events] == list(range(1, last_seq + 2))
    assert isinstance(events[-1], ModelOutputCompletedNextEvent)
    assert events[-1].payload.content == json.loads(sample["body"])["payload"]["text"]
    assert _on_disk(data_dir) == before


@pytest.mark.parametrize("corpus", EACH_CORPUS)
async def test_a_missing_upcaster_step_is_a_clear_error(corpus: Corpus, tmp_path: Path) -> None:
    """A build whose registry lacks a step between a row's version and its own says which step, and stores
    nothing in place of the row."""
    data_dir = tmp_path / "data"
    _write_as_stored(data_dir, corpus)
    before = _on_disk(data_dir)
    session_id = str(_a_completed_row(corpus)["session_id"])
    for registry, missing in ((LaterBuild(with_step=False), SCHEMA_VERSION), (LaterBuild(NEXT + 1), NEXT)):
        async with EventStore.open(data_dir, synchronous="NORMAL", upcasters=registry) as store:
            with pytest.raises(ValueError, match=rf"^no upcaster registered from schema_version {missing}$"):
                await store.read(session_id)
            with pytest.raises(ValueError, match=rf"no upcaster registered from schema_version {missing}"):
                await store.read_types(session_id, [EventType.MODEL_OUTPUT_COMPLETED])
    assert _on_disk(data_dir) == before


# --- properties of upcasting ---------------------------------------------------------------------------------

_json = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                     max_leaves=6)
_names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=10)
ALL_ROWS = tuple(row for corpus in CORPORA.values() for row in corpus.rows)


@st.composite
def stored_dicts(draw: st.DrawFn) -> dict[str, Any]:
    """An event dict of this build's version, as the store decodes a row: a frozen row (of any corpus, upcast to
    now) or a generated event of any type, with fields no step knows of added to the envelope and the payload."""
    from_corpus: bool = draw(st.booleans())
    if ALL_ROWS and from_corpus:
        raw = upcasters.upcast(_raw(draw(st.sampled_from(ALL_ROWS))))
    else:
        raw = draw(normalized_events()).model_dump(mode="json", exclude_none=True)
    raw = {**draw(st.dictionaries(_names.filter(lambda k: k not in raw), _json, max_size=2)), **raw}
    payload = raw["payload"]
    return {**raw, "payload": {**draw(st.dictionaries(_names.filter(lambda k: k not in payload and k != "content"),
                                                      _json, max_size=2)), **payload}}


def _apart_from(raw: Mapping[str, Any], field: str) -> dict[str, Any]:
    """``raw`` without its version and without ``field`` of its payload."""
    return {**{k: v for k, v in raw.items() if k != "schema_version"},
            "payload": {k: v for k, v in raw["payload"].items() if k != field}}


@settings(max_examples=150, deadline=None)
@given(stored_dicts())
def test_upcasting_is_idempotent_at_the_current_version(raw: dict[str, Any]) -> None:
    """This build's registry leaves an event of its version as it is; so does the later build's, once an event is
    at its version; and neither touches the dict it is given."""
    given_raw = copy.deepcopy(raw)
    assert upcasters.upcast(raw) == raw
    later = LaterBuild()
    once = later.upcast(raw)
    assert later.upcast(once) == once and later.upcast(copy.deepcopy(once)) == once
    assert raw == given_raw


@settings(max_examples=150, deadline=None)
@given(stored_dicts())
def test_an_upcaster_step_changes_only_what_it_is_about(raw: dict[str, Any]) -> None:
    """The step renames model.output.completed's ``text``, and bumps the version: every other field of every
    event — known to the models or not — comes through as it was stored."""
    given_raw = copy.deepcopy(raw)
    upcast = LaterBuild().upcast(raw)
    assert raw == given_raw and upcast["schema_version"] == NEXT
    if raw["type"] == EventType.MODEL_OUTPUT_COMPLETED:
        assert upcast["payload"]["content"] == raw["payload"]["text"] and "text" not in upcast["payload"]
        assert _apart_from(upcast, "content") == _apart_from(raw, "text")
    else:
        assert upcast == {**raw, "schema_version": NEXT}
