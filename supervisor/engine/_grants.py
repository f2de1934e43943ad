"""A session's grants: rebuilt from its ``grant.created``/``grant.revoked`` events, kept live for the policy.

The events are the truth (so grants survive a supervisor restart: the first call of a session after one reads
them back); this book is their index, per session, for the calls of the session's tasks. A grant is created by
the tool flow, in the commit of the answer it came from (``noted`` here after), and revoked over the API
(``revoke``, appended to the session's stream outside any task). A fork's copies of its parent's grant events
(up to its fork point) are history, not grants of the fork: a grant never reaches another session.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import trio

from codesdk.protocol import (
    EventType,
    GrantCreated,
    GrantRevoked,
    NormalizedEvent,
    RuntimeInfo,
    Trace,
    utc_now,
)

from ..store import EventDraft, EventLogReader, Quotas, Recorder, SessionRecord
from ._errors import EngineError

_TYPES = (EventType.GRANT_CREATED.value, EventType.GRANT_REVOKED.value)
_PAGE = 1000


class UnknownGrant(EngineError, LookupError):
    def __init__(self, session_id: str, grant_id: str) -> None:
        super().__init__(f"session {session_id} has no grant {grant_id} (its grants: `codesdk grants {session_id}`)")


class GrantAlreadyRevoked(EngineError):
    def __init__(self, grant_id: str, revoked_by: str) -> None:
        super().__init__(f"grant {grant_id} is already revoked (by {revoked_by or 'someone'}); it decides nothing")


@dataclass(frozen=True)
class GrantEntry:
    """One grant as its events tell it: created (when, at which seq), and revoked or not."""

    created: GrantCreated
    created_at: datetime
    created_seq: int | None
    revoked: GrantRevoked | None = None
    revoked_at: datetime | None = None

    @property
    def live(self) -> bool:
        return self.revoked is None


def entries_of(events: list[NormalizedEvent], forked_at: int | None) -> dict[str, GrantEntry]:
    """The grants ``events`` (a session's grant events, in order) tell of; copies before ``forked_at`` skipped."""
    found: dict[str, GrantEntry] = {}
    for event in events:
        if forked_at is not None and event.seq <= forked_at:
            continue
        payload = event.payload
        if isinstance(payload, GrantCreated):
            found.setdefault(payload.grant_id, GrantEntry(payload, event.time, event.seq))
        elif isinstance(payload, GrantRevoked) and (entry := found.get(payload.grant_id)) is not None \
                and entry.live:
            found[payload.grant_id] = GrantEntry(entry.created, entry.created_at, entry.created_seq, payload,
                                                 event.time)
    return found


async def read_grants(store: EventLogReader, session: SessionRecord) -> list[GrantEntry]:
    """Every grant of ``session`` as its stored events tell, oldest first (a reader beside the writer will do)."""
    events: list[NormalizedEvent] = []
    after = 0
    while page := await store.read_types(session.session_id, _TYPES, after, _PAGE):
        events += page
        after = page[-1].seq
        if len(page) < _PAGE:
            break
    forked_at = session.forked_from.seq if session.forked_from is not None else None
    return list(entries_of(events, forked_at).values())


class GrantBook:
    def __init__(self, store: Recorder, quotas: Quotas | None = None) -> None:
        self.store = store
        self.quotas = quotas
        self._live: dict[str, dict[str, GrantCreated]] = {}
        self._revoked: dict[str, set[str]] = {}  # revoked here (a session being indexed drops them after)
        self._pending: dict[str, dict[str, GrantCreated]] = {}  # created while the session was not indexed
        self._lock = trio.Lock()

    async def entries(self, session: SessionRecord) -> list[GrantEntry]:
        """Every grant of the session, oldest first (from the store: what a listing shows)."""
        return await read_grants(self.store, session)

    async def live(self, session: SessionRecord) -> tuple[GrantCreated, ...]:
        """The session's grants that decide calls now."""
        grants = self._live.get(session.session_id)
        if grants is None:
            loaded = {e.created.grant_id: e.created for e in await self.entries(session) if e.live}
            grants = self._live.setdefault(session.session_id, loaded)
            grants.update(self._pending.pop(session.session_id, {}))
            for grant_id in self._revoked.get(session.session_id, set()):
                grants.pop(grant_id, None)
        return tuple(grants.values())

    def noted(self, session_id: str, created: GrantCreated) -> None:
        """A grant the tool flow just stored (a session not indexed yet reads it from the store when it is)."""
        if created.grant_id in self._revoked.get(session_id, set()):
            return
        grants = self._live.get(session_id)
        (grants if grants is not None else self._pending.setdefault(session_id, {}))[created.grant_id] = created

    async def revoke(self, session: SessionRecord, grant_id: str, by: str, reason: str = "") -> GrantEntry:
        """Store ``grant.revoked`` in the session's stream; the grant decides nothing from now on.
        ``UnknownGrant``; ``GrantAlreadyRevoked``."""
        async with self._lock:  # one revocation of a grant, however many ask at once
            entry = next((e for e in await self.entries(session) if e.created.grant_id == grant_id), None)
            if entry is None:
                raise UnknownGrant(session.session_id, grant_id)
            if entry.revoked is not None:
                raise GrantAlreadyRevoked(grant_id, entry.revoked.revoked_by)
            # Out of the policy's sight first: a call decided from here on is not decided by it.
            self._revoked.setdefault(session.session_id, set()).add(grant_id)
            if (grants := self._live.get(session.session_id)) is not None:
                grants.pop(grant_id, None)
            revoked = GrantRevoked(grant_id=grant_id, revoked_by=by, reason=reason)
            stored = await self.store.append(session.session_id, [EventDraft(
                type=EventType.GRANT_REVOKED, runtime=RuntimeInfo(name=session.runtime), payload=revoked,
                trace=Trace(session_id=session.session_id))], quotas=self.quotas)
            at = stored[-1].time if stored else utc_now()
            return GrantEntry(entry.created, entry.created_at, entry.created_seq, revoked, at)

    def forget(self, session_id: str) -> None:
        """The session is gone (deleted)."""
        self._live.pop(session_id, None)
        self._revoked.pop(session_id, None)
        self._pending.pop(session_id, None)
