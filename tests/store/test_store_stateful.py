"""Hypothesis state machine over the real store: seqs stay gap-free, subscribers see exactly the log.

The store lives in a trio loop on a background thread (``StoreRunner``) so Hypothesis can drive it with
plain synchronous rules while subscribers keep running between steps — started at arbitrary cursors and
times, paused (so their bounded feeds overflow) and resumed. Part of the recorder contract: one machine runs
per backend (``backends.BACKENDS``).
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import unittest
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import hypothesis.strategies as st
import pytest
import trio
from hypothesis import HealthCheck, event, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from codesdk.protocol import NormalizedEvent
from codesdk.supervisor.store import InvalidEvent, Recorder, StoreClosed, TaskState, TaskUpdate, UnknownTask

from tests.postgres import PostgresServer
from tests.store.backends import BACKENDS, Backend
from tests.store.store_helpers import bad_delta, delta, texts

T = TypeVar("T")
STEP_TIMEOUT = 15


class StoreRunner:
    """An open recorder inside ``trio.run`` on its own thread; ``call`` runs a coroutine there."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._thread_main, name="store-runner", daemon=True)
        self._thread.start()
        if not self._ready.wait(STEP_TIMEOUT) or self._error is not None:
            raise RuntimeError("store runner did not start") from self._error

    def _thread_main(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:  # noqa: BLE001 - reported by close()
            self._error = exc
        finally:
            self._ready.set()

    async def _main(self) -> None:
        # Tiny feeds, pages and batches so overflow, paging and group commit happen in few steps.
        async with (
            self.backend.open(subscriber_buffer=3, page_size=4, max_batch=5) as store,
            trio.open_nursery() as nursery,
        ):
            self.store, self.nursery = store, nursery
            self.token = trio.lowlevel.current_trio_token()
            self._stop = trio.Event()
            self._ready.set()
            await self._stop.wait()
            nursery.cancel_scope.cancel()

    def call(self, function: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        async def bounded() -> T:
            with trio.fail_after(STEP_TIMEOUT):
                return await function(*args, **kwargs)

        return trio.from_thread.run(bounded, trio_token=self.token)

    def close(self) -> None:
        trio.from_thread.run_sync(self._stop.set, trio_token=self.token)
        self._thread.join(STEP_TIMEOUT)
        assert not self._thread.is_alive(), "store runner did not stop"
        if self._error is not None:
            raise self._error


class Follower:
    """A subscriber that records what it sees; it can be paused (stops iterating) and resumed."""

    def __init__(self, session_id: str, after_seq: int) -> None:
        self.session_id = session_id
        self.after_seq = after_seq
        self.seen: list[NormalizedEvent] = []
        self.overflows = 0
        self.gate = trio.Event()
        self.gate.set()
        self.progress = trio.Event()

    @property
    def position(self) -> int:
        return self.seen[-1].seq if self.seen else self.after_seq

    async def run(self, store: Recorder, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with store.subscribe(self.session_id, self.after_seq) as events:
            task_status.started()
            try:
                async for event in events:
                    await self.gate.wait()
                    self.seen.append(event)
                    self.overflows = events.overflows
                    self.progress.set()
            except StoreClosed:
                pass

    def pause(self) -> None:
        if self.gate.is_set():  # a paused follower may already wait on the current gate
            self.gate = trio.Event()

    async def caught_up(self, last_seq: int) -> None:
        self.gate.set()
        while self.position < last_seq:
            self.progress = trio.Event()
            await self.progress.wait()


class StoreMachine(RuleBasedStateMachine):
    #: the backend under test: a key of ``BACKENDS`` (see ``machine_for``)
    backend_name: ClassVar[str]
    #: the session's PostgreSQL server, for the PostgreSQL machine (set by ``postgres_for_the_machine``)
    postgres: ClassVar[PostgresServer | None] = None

    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="codesdk-store-sm-"))
        self.backend = BACKENDS[self.backend_name](self.tmp, self._new_database)
        self.runner = StoreRunner(self.backend)
        self.expected: dict[str, list[NormalizedEvent]] = {}
        self.followers: list[Follower] = []
        self.batches = 0

    def _new_database(self) -> str:
        assert self.postgres is not None, "the PostgreSQL machine runs with the postgres_server fixture"
        return self.postgres.new_database()

    @property
    def sessions(self) -> list[str]:
        return list(self.expected)

    @initialize()
    def first_session(self) -> None:
        self.new_session()

    @rule()
    def new_session(self) -> None:
        session_id = f"s{len(self.expected)}"
        self.runner.call(self.runner.store.create_session, session_id, runtime="scripted")
        self.expected[session_id] = []

    @precondition(lambda self: self.expected)
    @rule(
        plan=st.lists(
            st.tuples(
                st.integers(0, 7),
                st.integers(1, 5),
                st.sampled_from(["ok", "ok", "ok", "invalid", "fails_in_db"]),
                st.integers(0, 4),
            ),
            min_size=1,
            max_size=10,
        )
    )
    def append_concurrently(self, plan: list[tuple[int, int, str, int]]) -> None:
        sessions = self.sessions
        batches = []
        for session_index, size, mode, bad_at in plan:
            self.batches += 1
            labels = [f"{self.batches}.{k}" for k in range(size)]
            drafts = [delta(label) for label in labels]
            if mode == "invalid":
                drafts.insert(bad_at % (size + 1), bad_delta())
            batches.append((sessions[session_index % len(sessions)], drafts, mode, labels))
        outcomes = self.runner.call(self._append_all, [batch[:3] for batch in batches])
        if self.runner.store.writer_stats.largest_batch > 1:
            event("appends shared a transaction")

        new_events: dict[str, list[NormalizedEvent]] = {sid: [] for sid in sessions}
        for (session_id, _, mode, labels), outcome in zip(batches, outcomes, strict=True):
            if mode == "ok":
                assert isinstance(outcome, list), outcome
                assert texts(outcome) == labels
                assert [e.seq for e in outcome] == list(range(outcome[0].seq, outcome[0].seq + len(outcome)))
                new_events[session_id].extend(outcome)
            else:
                assert isinstance(outcome, InvalidEvent if mode == "invalid" else UnknownTask), outcome
        for session_id in sessions:
            stored = self._read_all(session_id)
            old = self.expected[session_id]
            assert [e.seq for e in stored] == list(range(1, len(stored) + 1))  # gap-free, monotonic
            assert stored[: len(old)] == old  # nothing stored earlier changed
            assert stored[len(old):] == sorted(new_events[session_id], key=lambda e: e.seq)  # only ok batches
            self.expected[session_id] = stored

    async def _append_all(self, batches: list[tuple[str, list[Any], str]]) -> list[object]:
        outcomes: list[object] = [None] * len(batches)

        async def one(index: int, session_id: str, drafts: list[Any], mode: str) -> None:
            update = TaskUpdate("no-such-task", state=TaskState.COMPLETED) if mode == "fails_in_db" else None
            try:
                outcomes[index] = await self.runner.store.append(session_id, drafts, task_update=update)
            except (InvalidEvent, UnknownTask) as exc:
                outcomes[index] = exc

        async with trio.open_nursery() as nursery:
            for index, (session_id, drafts, mode) in enumerate(batches):
                nursery.start_soon(one, index, session_id, drafts, mode)
        return outcomes

    def _read_all(self, session_id: str) -> list[NormalizedEvent]:
        return self.runner.call(self.runner.store.read, session_id, 0, 100_000)

    @precondition(lambda self: self.expected)
    @rule(data=st.data())
    def subscribe(self, data: st.DataObject) -> None:
        session_id = data.draw(st.sampled_from(self.sessions), label="session")
        after_seq = data.draw(st.integers(0, len(self.expected[session_id]) + 3), label="after_seq")
        follower = Follower(session_id, after_seq)
        self.runner.call(self.runner.nursery.start, follower.run, self.runner.store)
        self.followers.append(follower)

    @precondition(lambda self: self.followers)
    @rule(data=st.data())
    def pause(self, data: st.DataObject) -> None:
        follower = data.draw(st.sampled_from(self.followers), label="follower")
        trio.from_thread.run_sync(follower.pause, trio_token=self.runner.token)

    @precondition(lambda self: self.followers)
    @rule(data=st.data())
    def resume(self, data: st.DataObject) -> None:
        follower = data.draw(st.sampled_from(self.followers), label="follower")
        trio.from_thread.run_sync(follower.gate.set, trio_token=self.runner.token)

    @precondition(lambda self: self.followers)
    @rule()
    def check_followers(self) -> None:
        for follower in self.followers:
            expected = self.expected[follower.session_id]
            self.runner.call(follower.caught_up, len(expected))
            assert follower.seen == expected[follower.after_seq:]  # exactly the log: no gap, no duplicate
            if follower.overflows:
                event("a follower overflowed its feed and re-read from the store")

    @rule()
    def reopen(self) -> None:
        if self.followers:
            self.check_followers()
        self.runner.close()
        self.followers = []
        self.runner = StoreRunner(self.backend)
        for session_id, expected in self.expected.items():
            assert self._read_all(session_id) == expected
            assert self.runner.call(self.runner.store.last_seq, session_id) == len(expected)

    def teardown(self) -> None:
        try:
            if self.followers:
                self.check_followers()
        finally:
            try:
                self.runner.close()
            finally:
                shutil.rmtree(self.tmp, ignore_errors=True)


def machine_for(name: str) -> type[unittest.TestCase]:
    """The state machine's test case for one backend."""
    class Machine(StoreMachine):
        backend_name = name

    Machine.__name__ = Machine.__qualname__ = f"StoreMachine_{name}"
    case: type[unittest.TestCase] = Machine.TestCase
    case.backend_name = name  # type: ignore[attr-defined]
    case.settings = settings(  # type: ignore[attr-defined]
        max_examples=60,
        stateful_step_count=20,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    return case


@pytest.fixture(autouse=True)
def postgres_for_the_machine(request: pytest.FixtureRequest) -> None:
    """The PostgreSQL machine's examples each take a database of the session's server (or the case skips)."""
    if getattr(request.cls, "backend_name", None) == "postgresql":
        StoreMachine.postgres = request.getfixturevalue("postgres_server")


# One test case per backend, named for it (TestStoreMachine_sqlite, ...), so pytest collects each.
for _name in BACKENDS:
    globals()[f"TestStoreMachine_{_name}"] = machine_for(_name)
