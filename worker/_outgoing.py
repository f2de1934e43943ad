"""The worker's outgoing lines: a bounded queue between its emitters (tasks, the request reader) and its one writer.

Why not a ``trio`` memory channel: a channel's ``send`` is a schedule point even when there is room, so an emitter
streaming events hands the loop to the writer after every line, and the writer writes that one line — one system
call, two task switches and a wake-up of the supervisor's reader per event (measured: one ``write`` per line,
~30k lines/s). Here a line is queued without yielding while there is room: the writer is woken and runs at the
emitter's next schedule point (its next ``await`` of anything that waits: a lone line goes out at once, a flood's
lines go out together, up to the bound per write). When the queue is full the emitter waits until the writer has
taken lines: the supervisor reading slowly still slows the runtime down, never grows a queue.

Same guarantees as the channel it replaces: lines leave in the order they were queued; ``put`` raises
``trio.Cancelled`` before queuing (never after), so a cancelled emitter has queued nothing; a marker (``trio.Event``)
is set by the writer once every line queued before it is written.
"""

from __future__ import annotations

from collections import deque

import trio

Item = bytes | trio.Event


class OutgoingLines:
    def __init__(self, max_lines: int) -> None:
        self.max_lines = max_lines
        self._items: deque[Item] = deque()
        self._space = trio.lowlevel.ParkingLot()  # emitters waiting for room
        self._ready = trio.lowlevel.ParkingLot()  # the writer waiting for lines
        self._closed = False

    def __len__(self) -> int:
        return len(self._items)

    async def put(self, item: Item) -> None:
        """Queue ``item``; wait only while the queue is full. Raises ``trio.Cancelled`` only before queuing."""
        await trio.lowlevel.checkpoint_if_cancelled()
        while len(self._items) >= self.max_lines:
            if self._closed:
                raise trio.ClosedResourceError("the worker's output is closed")
            await self._space.park()  # cancellable: nothing is queued yet
        if self._closed:
            raise trio.ClosedResourceError("the worker's output is closed")
        self._items.append(item)
        if self._ready:
            self._ready.unpark_all()

    def close(self) -> None:
        """No more items: the writer drains what is queued, then ``take`` returns nothing."""
        self._closed = True
        self._ready.unpark_all()
        self._space.unpark_all()

    async def take(self, max_bytes: int) -> tuple[list[bytes], trio.Event | None]:
        """The lines queued in front (at least one unless closed and drained; up to ``max_bytes`` joined), and the
        marker that follows them (to set once they are written), if one does. Waits while the queue is empty;
        ``([], None)``: closed and drained."""
        while not self._items:
            if self._closed:
                return [], None
            await self._ready.park()
        items, size = self._items, 0
        lines: list[bytes] = []
        marker = None
        while items:
            item = items[0]
            if isinstance(item, trio.Event):
                items.popleft()
                marker = item
                break
            if lines and size + len(item) > max_bytes:
                break
            items.popleft()
            lines.append(item)
            size += len(item)
        if self._space:
            self._space.unpark_all()
        return lines, marker
