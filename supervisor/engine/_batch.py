"""The plain events of one batch from a worker, on their way to the store: grouped per task, stored fairly.

A run of plain events (deltas, usage, ...) becomes one append per task, so a fast stream is group-committed.
Whatever must be stored after them (a tool request, a terminal event, the wait for ``model.input``) flushes them
first, which keeps each task's events in the order its worker sent them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence

import trio

from ..store import DatabaseError
from ._recorder import RunRecorder
from ._runs import Blobs, PendingEvent, TaskRun

#: A task whose runtime has sent more events than this is a stream: its plain events are stored as bulk appends
#: (at most the pool's EVENT_BATCH each), which the store's writer commits taking turns with every other write.
STREAM_AFTER_EVENTS = 256
#: While another session's write was committed this recently, a stream's events go in parts of SHARE_QUANTUM
#: events, each followed by a pause as long as it took (``PendingBatch._share``).
SHARE_WINDOW_S = 0.1
SHARE_QUANTUM = 32

#: Called when a task's events could not be stored (the disk failed).
LostEvents = Callable[[TaskRun, DatabaseError], Awaitable[None]]


class PendingBatch:
    """Plain events not stored yet, per task in arrival order, with the small raw blobs they name."""

    def __init__(self, recorder: RunRecorder, lost: LostEvents, pause_factor: float = 0.0) -> None:
        self._recorder = recorder
        #: per second a stream's part took, the seconds it owes as a pause while other namespaces are active (their
        #: weights over its own: ``FairTurns.pause_factor``; 0: none is) — or 1 while other sessions write
        self._pause_factor = pause_factor
        self._lost = lost
        self._events: dict[str, tuple[TaskRun, list[PendingEvent]]] = {}
        self._blobs: dict[str, Blobs] = {}
        #: seconds a stream's parts owe as pauses (``_share``): taken after the namespace's turn, not inside it,
        #: so that another namespace's turn never waits for a flood's pause
        self.owed_pause_s = 0.0

    def add(self, run: TaskRun, event: PendingEvent) -> None:
        self._events.setdefault(run.task_id, (run, []))[1].append(event)

    def blobs_for(self, run: TaskRun) -> Blobs:
        """Where the small raw blobs of ``run``'s pending events go (committed with them)."""
        return self._blobs.setdefault(run.task_id, {})

    def drop(self, run: TaskRun) -> None:
        """Forget ``run``'s pending events: they cannot be stored (its task is ending)."""
        self._events.pop(run.task_id, None)
        self._blobs.pop(run.task_id, None)

    async def flush(self, *, linger: bool = False) -> None:
        """Store everything pending. Short runs first. A stream's events are bulk appends: the writer commits
        them taking turns with everyone else's writes, and while others are writing they go in small parts, each
        followed by a pause as long as it took (``_share``, owed in ``owed_pause_s``): a flood slows only itself.
        ``linger``: nothing of these tasks waits behind the events (the end of a worker's batch, not a tool request
        or a task's end), so their commits may wait a little for other sessions' (the store writer's "Linger")."""
        pending = sorted(self._events.values(), key=lambda entry: _is_stream(entry[0]))
        self._events.clear()
        for run, events in pending:
            blobs = self._blobs.pop(run.task_id, None)
            try:
                if _is_stream(run):
                    await self._store_stream(run, events, blobs, linger)
                else:
                    await self._recorder.append(run, events, blobs=blobs, linger=linger)
            except DatabaseError as exc:  # the disk failed: what was not stored was never acknowledged
                await self._lost(run, exc)

    async def _store_stream(self, run: TaskRun, events: list[PendingEvent], blobs: Blobs | None,
                            linger: bool) -> None:
        # A stream that keeps up with its runtime (a paced one: its events come one or two at a time) takes no
        # more than its share whatever it does, and pausing it only made it late; one with a backlog (a flood)
        # shares. Judged by this batch alone, so a stream that falls behind starts sharing at its next batch.
        backlogged = len(events) >= SHARE_QUANTUM
        while events:
            part_size = SHARE_QUANTUM if self._pause_factor > 0 or self._others_writing(run) else len(events)
            part, events = events[:part_size], events[part_size:]
            started = trio.current_time()
            if not await self._recorder.append(run, part, blobs=_named_blobs(part, blobs), bulk=True,
                                               linger=linger and not backlogged):
                return
            if backlogged:
                await self._share(run, started)

    def _others_writing(self, run: TaskRun) -> bool:
        """Another session's ordinary (not bulk) append was committed within the last SHARE_WINDOW_S. The stream's
        own appends do not count: its first STREAM_AFTER_EVENTS events are ordinary ones, and counting them made a
        stream that is alone pause itself for its first SHARE_WINDOW_S as a stream."""
        last = self._recorder.store.writer_stats.last_ordinary_of_others(run.session_id)
        return trio.current_time() - last <= SHARE_WINDOW_S

    async def _share(self, run: TaskRun, started: float) -> None:
        """After a stream's part: while others are writing, owe a pause as long as the part took (times the pause
        factor: the other active namespaces' weights over its own), so a flood gets at most its weighted share of
        the event loop, the GIL and the writer, and others' small steps find them free. A
        stream alone never pauses. The pause is taken by the intake once the namespace's turn is over."""
        if self._pause_factor > 0 or self._others_writing(run):
            took = trio.current_time() - started
            self.owed_pause_s = min(self.owed_pause_s + took * (self._pause_factor or 1.0), SHARE_WINDOW_S)
        await trio.lowlevel.checkpoint()


def _is_stream(run: TaskRun) -> bool:
    return run.next_n > STREAM_AFTER_EVENTS


def _named_blobs(events: Sequence[PendingEvent], blobs: Mapping[str, tuple[bytes, str]] | None) -> Blobs | None:
    """The small raw blobs these events name (a stream's part is committed with its own events' blobs)."""
    if not blobs:
        return None
    refs = {event.runtime.raw_ref for event in events if event.runtime is not None}
    return {ref: blob for ref, blob in blobs.items() if ref in refs} or None
