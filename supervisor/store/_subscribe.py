"""Subscriptions: the stored past after a cursor, then the live tail, without gaps or duplicates.

A subscriber registers its feed *before* its first read, so every event is either already readable when
it reads, or is pushed to the feed after commit (or both; duplicates are dropped by seq). The feed is
bounded: when a slow subscriber's feed would overflow it is emptied and marked, and the subscriber
re-reads from the store after the last seq it handed out. Appends never wait for subscribers, and a
subscriber never misses or repeats an event.

Events another process committed (a second supervisor on the same PostgreSQL database) are not pushed: the hub
is *nudged* for their session (``nudge``; everyone after a lost connection: ``nudge_all``) and the subscriber
reads them from the store, the one source of truth. Without a nudge, an idle subscriber still looks every
``poll_interval_s``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable

import trio

from codesdk.protocol import NormalizedEvent

from ._errors import StoreClosed
from ._stored import StoredEvent

ReadPage = Callable[[int, int], Awaitable[list[StoredEvent]]]


class Feed:
    """One subscriber's mailbox, filled by the writer task after each commit."""

    __slots__ = ("buffer", "capacity", "closed", "ended", "overflowed", "stale", "wake")

    def __init__(self, capacity: int) -> None:
        self.buffer: deque[StoredEvent] = deque()
        self.capacity = capacity
        self.overflowed = False
        self.stale = False  # the store has events the feed was not given: read them there
        self.wake = trio.Event()
        self.closed = False
        self.ended = False  # its session was deleted: no event will follow

    def push(self, events: list[StoredEvent]) -> None:
        if not self.overflowed:
            if len(self.buffer) + len(events) > self.capacity:
                self.buffer.clear()  # the store has them; the subscriber will re-read
                self.overflowed = True
            else:
                self.buffer.extend(events)
        self.wake.set()


class Hub:
    """Which feeds listen to which session."""

    def __init__(self) -> None:
        self._feeds: dict[str, set[Feed]] = {}
        self._closed = False

    def add(self, session_id: str, capacity: int) -> Feed:
        if self._closed:
            raise StoreClosed("subscribe")
        feed = Feed(capacity)
        self._feeds.setdefault(session_id, set()).add(feed)
        return feed

    def remove(self, session_id: str, feed: Feed) -> None:
        feeds = self._feeds.get(session_id)
        if feeds is not None:
            feeds.discard(feed)
            if not feeds:
                del self._feeds[session_id]

    def publish(self, session_id: str, events: list[StoredEvent]) -> None:
        for feed in self._feeds.get(session_id, ()):
            feed.push(events)

    def nudge(self, session_id: str) -> None:
        """Another process stored events of this session: its subscribers read them from the store."""
        for feed in self._feeds.get(session_id, ()):
            feed.stale = True
            feed.wake.set()

    def nudge_all(self) -> None:
        """Events may have been stored unseen (the nudges' connection was lost): every subscriber reads."""
        for session_id in list(self._feeds):
            self.nudge(session_id)

    def end(self, session_id: str) -> None:
        """The session was deleted: its subscribers' iterations end once they have what was stored."""
        for feed in self._feeds.get(session_id, ()):
            feed.ended = True
            feed.wake.set()

    def close(self) -> None:
        self._closed = True
        for feeds in self._feeds.values():
            for feed in feeds:
                feed.closed = True
                feed.wake.set()

    def count(self, session_id: str) -> int:
        return len(self._feeds.get(session_id, ()))


class Subscription:
    """Async iterator over a session's events after ``after_seq``; see ``EventStore.subscribe``."""

    def __init__(
        self, read_page: ReadPage, feed: Feed, after_seq: int, *, until_terminal: bool, page_size: int,
        poll_interval_s: float,
    ) -> None:
        self._read_page = read_page
        self._feed = feed
        self._cursor = after_seq  # highest seq handed out or queued in _ready
        self._ready: deque[StoredEvent] = deque()
        self._until_terminal = until_terminal
        self._page_size = page_size
        self._poll_interval_s = poll_interval_s
        self._catching_up = True
        self._finished = False
        #: times this subscriber fell behind its bounded feed and re-read from the store
        self.overflows = 0

    @property
    def ready(self) -> int:
        """Events the next iterations hand out without waiting (a sender writes them out together)."""
        return len(self._ready)

    @property
    def last_seq(self) -> int:
        """The seq of the last event queued for delivery (``after_seq`` before any)."""
        return self._cursor

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> NormalizedEvent:
        return (await self.next_stored()).model()

    async def next_stored(self) -> StoredEvent:
        """The next event as stored (``StopAsyncIteration`` at the end): what a stream sends on, its model unbuilt."""
        while True:
            if self._ready:
                event = self._ready.popleft()
                if self._until_terminal and event.is_terminal:
                    self._finished = True
                    self._ready.clear()
                return event
            if self._finished:
                raise StopAsyncIteration
            feed = self._feed
            if feed.overflowed:
                feed.overflowed = False
                feed.buffer.clear()
                self._catching_up = True
                self.overflows += 1
            if feed.stale:
                feed.stale = False
                self._catching_up = True
            if self._catching_up:
                page = await self._read_page(self._cursor, self._page_size)
                self._queue(page)
                self._catching_up = len(page) >= self._page_size
                continue
            while feed.buffer:
                event = feed.buffer.popleft()
                if event.seq <= self._cursor:
                    continue  # already read from the store
                if event.seq != self._cursor + 1:
                    self._catching_up = True  # not expected to happen; the store fills any hole
                    break
                self._queue([event])
            if self._ready or self._catching_up:
                continue
            if feed.ended:
                raise StopAsyncIteration
            if feed.closed:
                raise StoreClosed(f"following events after seq {self._cursor}")
            feed.wake = trio.Event()  # no checkpoint between the emptiness check and the wait
            with trio.move_on_after(self._poll_interval_s):
                await feed.wake.wait()
                continue
            # Nothing pushed for a while: look in the store too, so events committed by another process
            # sharing this data dir (a second CLI, a supervisor) reach a follower here as well.
            self._catching_up = True

    def _queue(self, events: list[StoredEvent]) -> None:
        if events:
            self._ready.extend(events)
            self._cursor = events[-1].seq
