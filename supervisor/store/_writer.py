"""The single writer: one connection, one trio task, group commit.

Callers queue ``WriteRequest``s; the writer task takes everything queued (up to ``max_batch``) and runs it
in one transaction on a worker thread, each request inside its own SAVEPOINT so one failing request is
rolled back alone. Only after COMMIT returns are the requests answered and their events published, so
no subscriber ever sees an event that is not durable. Fast producers therefore share fsyncs instead of
queueing behind one each.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import apsw
import trio

from protocol import NormalizedEvent

from ._errors import StoreClosed, translate

T = TypeVar("T")


class WriteRequest(Generic[T]):
    """One unit of work for the writer: ``op(conn)`` runs inside the group transaction."""

    __slots__ = ("done", "error", "op", "publish_to", "result", "where")

    def __init__(self, op: Callable[[apsw.Connection], T], where: str, publish_to: str | None = None) -> None:
        self.op = op
        self.where = where
        #: session whose subscribers get the op's result (a list of stored events) after commit
        self.publish_to = publish_to
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


def run_batch(conn: apsw.Connection, batch: list[WriteRequest[Any]]) -> None:
    """Run ``batch`` in one transaction (worker thread). Sets ``result``/``error`` on every request."""
    try:
        conn.execute("BEGIN IMMEDIATE")
    except BaseException as exc:  # noqa: BLE001 - every request must get an outcome
        error = translate(exc, "starting a write transaction")
        for request in batch:
            request.error = error
        return
    try:
        for request in batch:
            conn.execute("SAVEPOINT request")
            try:
                request.result = request.op(conn)
            except Exception as exc:  # noqa: BLE001 - isolate a failing request from its batch
                conn.execute("ROLLBACK TO request")
                request.error = translate(exc, request.where)
            conn.execute("RELEASE request")
        conn.execute("COMMIT")
    except BaseException as exc:  # noqa: BLE001 - every request must get an outcome
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        error = translate(exc, "committing a write transaction")
        for request in batch:
            request.result = None
            request.error = error  # nothing of this transaction was stored


class Writer:
    def __init__(
        self,
        conn: apsw.Connection,
        publish: Callable[[str, list[NormalizedEvent]], None],
        *,
        max_batch: int,
        queue_size: int = 1024,
    ) -> None:
        self._conn = conn
        self._publish = publish
        self._max_batch = max_batch
        self._send, self._receive = trio.open_memory_channel[WriteRequest[Any]](queue_size)
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
            async for first in self._receive:
                batch = [first]
                while len(batch) < self._max_batch:
                    try:
                        batch.append(self._receive.receive_nowait())
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                await self._run(batch)
        finally:
            self._fail_leftovers()

    async def _run(self, batch: list[WriteRequest[Any]]) -> None:
        try:
            # not abandonable: a cancelled writer still waits for the transaction to finish
            await trio.to_thread.run_sync(run_batch, self._conn, batch, limiter=self._limiter)
        except BaseException as exc:  # a bug in run_batch: fail the batch loudly, then stop the writer
            for request in batch:
                if request.error is None:
                    request.result, request.error = None, exc
            raise
        finally:
            self.stats.transactions += 1
            self.stats.requests += len(batch)
            self.stats.largest_batch = max(self.stats.largest_batch, len(batch))
            for request in batch:
                if request.error is None and request.publish_to is not None and request.result:
                    self._publish(request.publish_to, request.result)
                request.done.set()

    def _fail_leftovers(self) -> None:
        while True:
            try:
                request = self._receive.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                break
            request.error = StoreClosed(request.where)
            request.done.set()
        # Nobody will read again (the writer ended, maybe cancelled from outside): later submits must fail
        # at once with StoreClosed instead of queueing for a reader that is gone.
        self._receive.close()
