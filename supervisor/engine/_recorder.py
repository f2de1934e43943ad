"""Storing a running task's events: the one path by which they reach the store, closed at the task's end."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence

import trio

from ..store import BudgetChange, EventDraft, Fenced, QuotaExceeded, Quotas, Recorder
from ._runs import PendingEvent, TaskRun

log = logging.getLogger("codesdk.supervisor.engine")

#: Ends a task whose events would pass a quota (the engine's failure and stop; see ``RunRecorder``).
OverQuota = Callable[[TaskRun, QuotaExceeded], Awaitable[None]]


class RunRecorder:
    """Appends a task's events with its trace and runtime info, under the tenant's quotas.

    Refuses (False) once the task has ended, so nothing is stored after a terminal event. Events that would pass
    a quota are not stored at all and the task ends there, once (``over_quota``)."""

    def __init__(self, store: Recorder, quotas: Quotas, over_quota: OverQuota) -> None:
        self.store = store
        self.quotas = quotas
        self._over_quota = over_quota

    async def append(self, run: TaskRun, events: Sequence[PendingEvent],
                     blobs: Mapping[str, tuple[bytes, str]] | None = None, *, bulk: bool = False,
                     linger: bool = False, budget_change: BudgetChange | None = None) -> bool:
        """Store ``events`` and the small ``blobs`` they name in one commit; False if the task has ended (or
        ends now, over a quota). ``bulk``: part of a long stream (see ``EventStore.append``); ``linger``: nothing
        waits behind them, so their commit may wait a little for company (``EventStore.append_events``)."""
        if run.ended:
            return False
        run.appending += 1  # the task's end waits for this append before it reads which calls are open
        commit = run.telemetry.store_commit(len(events))
        outcome = "error"
        try:
            try:
                # Shielded: a queued write is carried out even if its caller is cancelled (a tool's run, cut short
                # by the task's end), so the count must come down only once its outcome is known.
                with trio.CancelScope(shield=True):
                    await self.store.append_events(run.session_id, [
                        EventDraft(type=event.type, runtime=event.runtime or run.runtime, payload=event.payload,
                                   trace=run.trace) for event in events], blobs=blobs, bulk=bulk,
                        quotas=self.quotas, linger=linger, budget_change=budget_change)
                outcome = "ok"
            finally:
                commit.end(outcome)
                run.appending -= 1
                if not run.appending:
                    run.appends_settled.unpark_all()
        except Fenced as exc:  # the namespace moved to another supervisor (``Leasing.fenced`` lets it go)
            log.warning("task %s: %d event(s) refused, not stored: %s", run.task_id, len(events), exc)
            return False  # not ours to end: the new holder fails the task
        except QuotaExceeded as exc:  # nothing of these was stored; the task ends here, once
            log.warning("task %s: %s", run.task_id, exc)
            await self._over_quota(run, exc)
            return False
        return True
