"""A small pool of read-only connections, used from worker threads.

WAL lets readers run while the writer commits, so reads never wait for a write transaction; each
connection is used by one thread at a time (apsw refuses concurrent use of a connection).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import apsw
import trio

from ._errors import StoreClosed, translate

T = TypeVar("T")


class ReaderPool:
    def __init__(self, connections: list[apsw.Connection]) -> None:
        self._free = list(connections)
        self._all = list(connections)
        self._slots = trio.Semaphore(len(connections))
        self._closed = False

    async def run(self, where: str, function: Callable[[apsw.Connection], T]) -> T:
        """Run ``function(conn)`` on a free connection in a worker thread."""
        if self._closed:
            raise StoreClosed(where)
        async with self._slots:
            if self._closed:
                raise StoreClosed(where)
            conn = self._free.pop()
            try:
                return await trio.to_thread.run_sync(_guarded, where, function, conn)
            finally:
                self._free.append(conn)

    async def aclose(self) -> None:
        """Wait for reads in flight, then close every connection."""
        self._closed = True
        for _ in self._all:
            await self._slots.acquire()
        await trio.to_thread.run_sync(close_all, self._all)


def _guarded(where: str, function: Callable[[apsw.Connection], T], conn: apsw.Connection) -> T:
    try:
        return function(conn)
    except Exception as exc:
        translated = translate(exc, where)
        if translated is exc:
            raise
        raise translated from exc


def close_all(connections: list[apsw.Connection]) -> None:
    for conn in connections:
        conn.close()
