"""A small pool of read connections, used from worker threads.

SQLite's WAL (and PostgreSQL's MVCC) let readers run while the writer commits, so reads never wait for a write
transaction; each connection is used by one thread at a time (neither driver shares a connection across threads
safely). A connection that broke (PostgreSQL restarted) reconnects before its next read.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

import trio

from ._db import Db
from ._errors import StoreClosed

T = TypeVar("T")


class ReaderPool:
    def __init__(self, connections: list[Db]) -> None:
        self._free = list(connections)
        self._all = list(connections)
        self._slots = trio.Semaphore(len(connections))
        self._closed = False

    async def run(self, where: str, function: Callable[[Db], T]) -> T:
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


def _guarded(where: str, function: Callable[[Db], T], conn: Db) -> T:
    try:
        conn.ready()
        try:
            return function(conn)
        except Exception as exc:
            if not conn.lost_connection(exc):
                raise
            conn.ready()  # a connection the server dropped since its last use: reads are safe to repeat
            return function(conn)
    except Exception as exc:
        translated = conn.translate(exc, where)
        if translated is exc:
            raise
        raise translated from exc


class _Closable(Protocol):
    def close(self) -> None: ...


def close_all(connections: Sequence[_Closable]) -> None:
    for conn in connections:
        conn.close()
