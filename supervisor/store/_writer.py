"""The single writer: one connection, one trio task, group commit, two classes of work that take turns.

Callers queue ``WriteRequest``s; the writer task takes what is queued (up to ``max_batch``) and runs it in
one transaction on a worker thread, each request inside its own SAVEPOINT so one failing request is rolled
back alone. Only after COMMIT returns are the requests answered and their events published, so no
subscriber ever sees an event that is not durable. Fast producers therefore share fsyncs instead of
queueing behind one each. On PostgreSQL the transaction is pipelined (``Db.begin``): statements go without waiting
for their answers, and each request of a batch ends with ``sync``, so its errors surface while it is still the one
running: a lone append costs two round trips, a batch of N two per request and one.

Fairness. A request is either ordinary or **bulk**: the events of a long stream (the engine marks a task's
streamed events as bulk once it has sent many, in appends of bounded size). Bulk requests are committed in
transactions of their own, and when both kinds are waiting the two kinds take turns: ordinary work waits
for at most one (bounded) bulk transaction, and a stream for at most one ordinary transaction — so a
tenant's flood delays another tenant's write by one short transaction, not by a queue of its events. Within
a bulk transaction each session gets one bulk request (round robin across streams). Requests of one session
are always committed in the order they were queued: an ordinary request queued behind a bulk one of the same
session goes with the bulk turn, right after it.

Linger. A request marked ``linger`` (a paced stream's events, with nothing of its task waiting behind them) may
wait up to ``linger_s`` for company before its transaction starts, but only while other sessions' lingering
requests arrive often enough that company is expected within it (``_Company``): many slow streams then share one
commit, one thread hop and one publish round instead of paying each alone. A lone stream, a flood (one session) and
every other request never wait; an arriving request that does not linger ends the wait at once.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import trio

from ._db import Db
from ._errors import StoreClosed
from ._stored import StoredEvent

T = TypeVar("T")

#: The longest a lingering request waits for company by default, and at most (``serve --commit-linger-ms``).
COMMIT_LINGER_S = 0.002
MAX_COMMIT_LINGER_S = 0.010
#: How far back the writer looks at lingering requests to judge whether a linger would find company.
COMPANY_WINDOW_S = 0.1
#: Lingering requests remembered over that window (more only makes the count less exact, never wrong in sign).
COMPANY_KEPT = 4096


class WriteRequest(Generic[T]):
    """One unit of work for the writer: ``op(conn)`` runs inside the group transaction."""

    __slots__ = ("bulk", "done", "error", "linger", "op", "publish_to", "result", "staged_at_bulk", "where")

    def __init__(self, op: Callable[[Db], T], where: str, publish_to: str | None = None, *,
                 bulk: bool = False, linger: bool = False) -> None:
        self.op = op
        self.where = where
        #: session whose subscribers get the op's result (a list of stored events) after commit
        self.publish_to = publish_to
        #: part of a long stream: committed in bulk transactions, which take turns with the others
        self.bulk = bulk
        #: may wait a little for other sessions' requests to share its transaction (the module's "Linger")
        self.linger = linger
        #: ``WriterStats.bulk_transactions`` when it was queued as ordinary work (-1: it goes in bulk turns)
        self.staged_at_bulk = -1
        self.done = trio.Event()
        self.result: T | None = None
        self.error: BaseException | None = None

    def value(self) -> T:
        if self.error is not None:
            raise self.error
        return self.result  # type: ignore[return-value]


@dataclass
class WriterStats:
    transactions: int = 0
    requests: int = 0
    largest_batch: int = 0
    bulk_transactions: int = 0  # transactions of bulk requests (streams), taking turns with the others
    bulk_requests: int = 0
    #: the most bulk transactions committed between an ordinary request's queueing and its own transaction: the
    #: turn-taking promise is that this never exceeds 1, however long the streams' backlog
    most_bulk_waited: int = 0
    lingers: int = 0  # transactions whose start waited for company
    # When a session's ordinary append was last committed, and whose it was (None: several sessions' at once, or
    # none yet); and the last one of any session but that one. Two slots answer "when did a session other than S
    # last append" for every S, without a map that grows with the sessions (see ``last_ordinary_of_others``).
    _last_append_at: float = field(default=float("-inf"), init=False, repr=False)
    _last_append_by: str | None = field(default=None, init=False, repr=False)
    _other_append_at: float = field(default=float("-inf"), init=False, repr=False)

    def note_ordinary(self, now: float, sessions: set[str]) -> None:
        """An ordinary transaction was committed at ``now`` (``trio.current_time()``) with appends of ``sessions``."""
        if not sessions:
            return
        by = next(iter(sessions)) if len(sessions) == 1 else None
        if by is None or by != self._last_append_by:
            self._other_append_at = self._last_append_at
        self._last_append_at, self._last_append_by = now, by

    def last_ordinary_of_others(self, session_id: str) -> float:
        """trio.current_time() when an ordinary append of a session other than ``session_id`` was last committed
        (-inf: never): how the engine tells that others are writing while a stream ingests. The session's own
        appends (its ordinary ones before it became a stream, say) do not count, nor do writes that belong to no
        session (task and session rows, blobs, approvals, the watchdog's ping): those go with some session's
        appends when another tenant is active, and are mostly the stream's own task's when it is alone."""
        return self._last_append_at if self._last_append_by != session_id else self._other_append_at


class _Company:
    """The lingering requests that arrived within the last COMPANY_WINDOW_S, by session: how many of other
    sessions' a linger of a given length may expect, at their recent rate."""

    def __init__(self) -> None:
        self._arrived: deque[tuple[float, str | None]] = deque()
        self._by_session: Counter[str | None] = Counter()

    def note(self, now: float, session: str | None) -> None:
        self._forget_before(now - COMPANY_WINDOW_S)
        if len(self._arrived) >= COMPANY_KEPT:
            self._forget_oldest()
        self._arrived.append((now, session))
        self._by_session[session] += 1

    def expected(self, now: float, session: str | None, within_s: float) -> float:
        """Other sessions' lingering requests expected within ``within_s`` from now."""
        self._forget_before(now - COMPANY_WINDOW_S)
        others = len(self._arrived) - self._by_session[session]
        return others * within_s / COMPANY_WINDOW_S

    def _forget_before(self, horizon: float) -> None:
        while self._arrived and self._arrived[0][0] < horizon:
            self._forget_oldest()

    def _forget_oldest(self) -> None:
        _, session = self._arrived.popleft()
        self._by_session[session] -= 1
        if not self._by_session[session]:
            del self._by_session[session]


def run_batch(conn: Db, batch: list[WriteRequest[Any]]) -> None:
    """Run ``batch`` in one transaction (worker thread). Sets ``result``/``error`` on every request."""
    try:
        conn.ready()
        conn.begin(pipelined=True)
    except BaseException as exc:  # noqa: BLE001 - every request must get an outcome
        error = conn.translate(exc, "starting a write transaction")
        for request in batch:
            request.error = error
        return
    try:
        if len(batch) == 1:  # alone: no savepoint to isolate it, and its errors may surface at the commit
            [request] = batch
            try:
                request.result = request.op(conn)
                _announce_and_commit(conn, batch)
            except Exception as exc:  # noqa: BLE001 - its transaction is its own: nothing of it is kept
                conn.rollback()
                request.result, request.error = None, conn.translate(exc, request.where)
            return
        for request in batch:
            conn.execute("SAVEPOINT request")
            try:
                request.result = request.op(conn)
                conn.sync()  # its statements' errors surface by here: blamed on it, never on the next request
            except Exception as exc:  # noqa: BLE001 - isolate a failing request from its batch
                conn.sync(quiet=True)  # (what it sent after the failure was skipped; the rollback below undoes it)
                conn.execute("ROLLBACK TO request")
                request.result, request.error = None, conn.translate(exc, request.where)
            conn.execute("RELEASE request")
        _announce_and_commit(conn, batch)
    except BaseException as exc:  # noqa: BLE001 - every request must get an outcome
        conn.rollback()
        error = conn.translate(exc, "committing a write transaction")
        for request in batch:
            request.result = None
            request.error = error  # nothing of this transaction was stored


def _announce_and_commit(conn: Db, batch: list[WriteRequest[Any]]) -> None:
    conn.announce({request.publish_to for request in batch
                   if request.publish_to is not None and request.error is None and request.result})
    conn.commit()


class Writer:
    def __init__(
        self,
        conn: Db,
        publish: Callable[[str, list[StoredEvent]], None],
        *,
        max_batch: int,
        queue_size: int = 1024,
        linger_s: float = 0.0,
        unblock: tuple[Callable[[], object], float] | None = None,
    ) -> None:
        self._conn = conn
        #: (what ends the stalled transactions blocking a batch, how long a batch runs before and between calls)
        self._unblock = unblock
        #: the longest a lingering request waits for company (0: never); ``EventStore.commit_linger_s`` sets it
        self.linger_s = linger_s
        self._company = _Company()
        self._publish = publish
        self._max_batch = max_batch
        self._queue_size = queue_size
        self._send, self._receive = trio.open_memory_channel[WriteRequest[Any]](queue_size)
        # Taken off the channel, waiting for their turn (at most queue_size): ordinary and bulk work.
        self._ordinary: deque[WriteRequest[Any]] = deque()
        self._bulk: deque[WriteRequest[Any]] = deque()
        self._bulk_of: Counter[str | None] = Counter()  # session -> its requests in _bulk (keeps its order)
        self._last_was_bulk = False
        self._limiter = trio.CapacityLimiter(1)  # belt and braces: the connection is never shared
        self.stats = WriterStats()

    async def submit(self, request: WriteRequest[T]) -> T:
        """Queue ``request`` and wait for its outcome.

        Once queued, a request is carried out even if the caller is cancelled while waiting.
        """
        try:
            await self._send.send(request)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            raise StoreClosed(request.where) from None
        await request.done.wait()
        return request.value()

    def close(self) -> None:
        """Stop accepting requests; ``run`` finishes what is queued, then returns."""
        self._send.close()

    async def run(self) -> None:
        try:
            while True:
                if not self._ordinary and not self._bulk:
                    try:
                        first = await self._receive.receive()
                    except trio.EndOfChannel:
                        return
                    self._stage(first)
                    if self._company_expected(first):
                        await self._linger()
                self._stage_queued()
                await self._run(self._next_batch())
        finally:
            self._fail_leftovers()

    def _company_expected(self, request: WriteRequest[Any]) -> bool:
        """Worth a linger: it may wait, and other sessions' lingering requests are expected within it."""
        return (request.linger and self.linger_s > 0
                and self._company.expected(trio.current_time(), request.publish_to, self.linger_s) >= 1)

    async def _linger(self) -> None:
        """Take what arrives for up to ``linger_s`` into the coming transaction; a request that does not linger
        (a tool call's record, a task's end: somebody waits on it) or a full batch ends the wait at once."""
        self.stats.lingers += 1
        with trio.move_on_after(self.linger_s):
            while len(self._ordinary) + len(self._bulk) < self._max_batch:
                try:
                    request = await self._receive.receive()
                except trio.EndOfChannel:
                    return
                self._stage(request)
                if not request.linger:
                    return

    def _stage(self, request: WriteRequest[Any]) -> None:
        if request.linger:
            self._company.note(trio.current_time(), request.publish_to)
        key = request.publish_to
        if request.bulk or self._bulk_of[key]:  # behind a bulk request of its session: keeps its place
            self._bulk.append(request)
            self._bulk_of[key] += 1
        else:
            request.staged_at_bulk = self.stats.bulk_transactions
            self._ordinary.append(request)

    def _stage_queued(self) -> None:
        while len(self._ordinary) + len(self._bulk) < self._queue_size:
            try:
                self._stage(self._receive.receive_nowait())
            except (trio.WouldBlock, trio.EndOfChannel):
                return

    def _next_batch(self) -> list[WriteRequest[Any]]:
        """The next transaction: ordinary and bulk work take turns when both wait."""
        if self._bulk and (not self._ordinary or not self._last_was_bulk):
            self._last_was_bulk = True
            return self._bulk_turn()
        self._last_was_bulk = False
        return [self._ordinary.popleft() for _ in range(min(self._max_batch, len(self._ordinary)))]

    def _bulk_turn(self) -> list[WriteRequest[Any]]:
        """One bulk request per session, in queue order, with the ordinary requests queued right behind it in
        the same session; a session's later requests wait for the next turn, so its order holds."""
        batch: list[WriteRequest[Any]] = []
        kept: deque[WriteRequest[Any]] = deque()
        seen: set[str | None] = set()
        closed: set[str | None] = set()
        for request in self._bulk:
            key = request.publish_to
            if len(batch) >= self._max_batch or key in closed or (request.bulk and key in seen):
                closed.add(key)
                kept.append(request)
                continue
            if request.bulk:
                seen.add(key)
            batch.append(request)
            self._bulk_of[key] -= 1
            if not self._bulk_of[key]:
                del self._bulk_of[key]
        self._bulk = kept
        self.stats.bulk_transactions += 1
        return batch

    async def _run(self, batch: list[WriteRequest[Any]]) -> None:
        try:
            # not abandonable: a cancelled writer still waits for the transaction to finish
            if self._unblock is None:
                await trio.to_thread.run_sync(run_batch, self._conn, batch, limiter=self._limiter)
            else:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._unblock_while_blocked, *self._unblock)
                    await trio.to_thread.run_sync(run_batch, self._conn, batch, limiter=self._limiter)
                    nursery.cancel_scope.cancel()
        except BaseException as exc:  # a bug in run_batch: fail the batch loudly, then stop the writer
            for request in batch:
                if request.error is None:
                    request.result, request.error = None, exc
            raise
        finally:
            self.stats.transactions += 1
            self.stats.requests += len(batch)
            bulk = sum(1 for request in batch if request.bulk)
            self.stats.bulk_requests += bulk
            if bulk < len(batch):
                self.stats.note_ordinary(trio.current_time(), {
                    r.publish_to for r in batch if not r.bulk and r.publish_to is not None})
            if not self._last_was_bulk:
                waited = max((self.stats.bulk_transactions - r.staged_at_bulk for r in batch if r.staged_at_bulk >= 0),
                             default=0)
                self.stats.most_bulk_waited = max(self.stats.most_bulk_waited, waited)
            self.stats.largest_batch = max(self.stats.largest_batch, len(batch))
            for request in batch:
                if request.error is None and request.publish_to is not None and request.result:
                    self._publish(request.publish_to, request.result)
                request.done.set()

    @staticmethod
    async def _unblock_while_blocked(unblock: Callable[[], object], every_s: float) -> None:
        """While a batch runs past ``every_s``, and as often again: end what blocks it that stalled (``unblock``)."""
        limiter = trio.CapacityLimiter(1)
        while True:
            await trio.sleep(every_s)
            await trio.to_thread.run_sync(unblock, limiter=limiter)

    def _fail_leftovers(self) -> None:
        leftovers = [*self._ordinary, *self._bulk]
        self._ordinary.clear()
        self._bulk.clear()
        self._bulk_of.clear()
        while True:
            try:
                leftovers.append(self._receive.receive_nowait())
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                break
        for request in leftovers:
            request.error = StoreClosed(request.where)
            request.done.set()
        # Nobody will read again (the writer ended, maybe cancelled from outside): later submits must fail
        # at once with StoreClosed instead of queueing for a reader that is gone.
        self._receive.close()
