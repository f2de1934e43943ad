"""Namespace leases: each namespace's worker runs on exactly one supervisor at a time.

With SQLite there is one supervisor (the data dir's lock says so), so every namespace is its own
(``SoleLeases``). On PostgreSQL (``PostgresLeases``) a supervisor registers itself (``supervisors``: where its API
is, its heartbeat) and takes a namespace's lease (``namespace_leases``) before it creates a session or starts a
task there, that is before the namespace's worker is spawned. A lease lasts ``lease_s`` past its holder's last
renewal; the holder renews all of its leases every ``lease_s / 3``. The database's clock decides expiry, so the
hosts' clocks need not agree.

- A request for a namespace another live supervisor holds is refused with where to go (``Claim.holder``).
- A supervisor whose leases expired (it died, or lost the database for ``lease_s``) has lost them: another takes
  them over (``Claim.taken_over``) and fails the tasks it left running, once each (the store's task-row lock makes
  that exactly once, whoever else tries). The one that lost them learns it at its next renewal — or, cut off from
  the database (its calls failing, or hanging), at ``deadline``: ``lease_s`` after its last successful renewal
  began, which is before anyone else can take them — and stops its workers there without recording anything
  (``forfeit``). Leases it let go of are not renewed; they expire, and whoever takes them over (itself included)
  fails what was left running.

Each claim takes a new epoch (``namespace_lease_epochs``, a sequence: never reused), and the holder keeps the epoch
of each namespace it holds (``epochs``): its writes for a namespace carry it and are refused by the database once
the lease has moved on (``_fencing``). A refused write lets the namespace go (``let_go``) as a lost lease does.

A fenced write locks its namespace's lease row until it commits, and a claim waits for that lock. A holder stopped
(SIGSTOP, a hung host) in the middle of a write would hold it for as long as it stays stopped: the server's
idle-in-transaction timeout does not cover it (a pipelined transaction, or a COPY, leaves the server waiting for the
rest of a request, where no timer runs). So a claim blocked for ``lease_s * TAKEOVER_WAIT`` ends the backends that
block it, if they are CodeSDK supervisors' connections not themselves waiting for a lock and the lease they hold it
for has expired (``_end_blockers``): their transactions roll back, nothing of them is kept (they were fenced anyway),
and the old holder's store reconnects if it ever resumes. This needs the supervisors to share one database role (or
the claiming one to be a member of ``pg_signal_backend``).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import trio

from ._errors import StoreError
from ._fencing import SUPERVISOR_APPLICATION
from ._time import now_text

log = logging.getLogger(__name__)

#: Seconds a lease outlives its holder's last renewal, unless the operator says otherwise (``--lease-s``).
LEASE_S = 15.0

#: How long a claim waits for the lease row's lock before it ends an expired holder's transactions that hold it, as a
#: share of the lease (then again as often while still blocked): what bounds how long a stopped supervisor can hold
#: up a takeover of a namespace whose lease it lost.
TAKEOVER_WAIT = 0.25



@dataclass(frozen=True)
class Holder:
    """A supervisor that holds a lease: who, and where its API is (what a refused request is told)."""

    supervisor_id: str
    host: str
    pid: int
    api: tuple[str, ...]

    def to_json_obj(self) -> dict[str, Any]:
        return {"supervisor_id": self.supervisor_id, "host": self.host, "pid": self.pid, "api": list(self.api)}


@dataclass(frozen=True)
class Claim:
    """The outcome of asking for a namespace's lease."""

    #: another supervisor's live lease (the request goes there); None: the lease is ours
    holder: Holder | None = None
    #: ours from now, after nobody's or a lost one's: tasks left running in the namespace are orphans to fail
    taken_over: bool = False
    #: the lease's epoch (None: not ours, or a store with one supervisor, where nothing is fenced)
    epoch: int | None = None


@dataclass(frozen=True)
class Renewal:
    """What a renewal found: the namespaces still ours, and those that are not any more."""

    held: frozenset[str]
    lost: frozenset[str]


class Leases(Protocol):
    """Who runs which namespace (see the module's docstring)."""

    @property
    def supervisor_id(self) -> str: ...

    #: set when a renewal should not wait for its time (the API was announced)
    renewal_wanted: trio.Event

    @property
    def renew_every_s(self) -> float | None:
        """How often ``renew`` must run (None: never, the leases cannot be lost)."""

    @property
    def failure(self) -> str | None:
        """Why the last renewal failed, until one succeeds (what readiness reports)."""

    @property
    def deadline(self) -> float | None:
        """``trio.current_time()`` from which our leases may have expired unless renewed (None: they cannot)."""

    def forfeit(self) -> frozenset[str]:
        """Past ``deadline``: let go of every lease at once, whether or not the database answers; what was held."""

    @property
    def epochs(self) -> Mapping[str, int] | None:
        """The epoch of each namespace held (a snapshot: never changed in place); None where writes are not fenced
        (one supervisor)."""

    def let_go(self, namespace: str, epoch: int | None) -> bool:
        """Stop holding the namespace if it is held as ``epoch`` (a write of ours was refused: the lease moved on);
        whether it was. It is not renewed any more, so it expires unless another supervisor has it already."""

    async def claim(self, namespace: str) -> Claim: ...

    async def renew(self) -> Renewal: ...

    async def expired(self) -> list[str]:
        """Namespaces whose leases have expired: their holders are gone, and someone should take them over."""

    async def drop_expired(self, namespaces: Sequence[str]) -> None:
        """Delete these leases if they are still expired (nothing runs there: the next request takes them)."""

    def announce(self, api: Sequence[str]) -> None:
        """Where this supervisor's API listens (what requests refused elsewhere are told)."""

    async def aclose(self) -> None:
        """Give every lease up (a clean shutdown: others may take the namespaces at once)."""


class SoleLeases:
    """One supervisor per store (SQLite): every namespace is ours; the first claim of each is a takeover, since
    whatever a previous process left running there is an orphan."""

    renew_every_s = None
    failure = None
    deadline = None

    def __init__(self) -> None:
        self.supervisor_id = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self.renewal_wanted = trio.Event()
        self._held: set[str] = set()

    async def claim(self, namespace: str) -> Claim:
        taken_over = namespace not in self._held
        self._held.add(namespace)
        return Claim(taken_over=taken_over)

    async def renew(self) -> Renewal:
        return Renewal(frozenset(self._held), frozenset())

    def forfeit(self) -> frozenset[str]:
        return frozenset()

    epochs = None

    def let_go(self, namespace: str, epoch: int | None) -> bool:
        return False  # nothing is fenced: no write is refused

    async def expired(self) -> list[str]:
        return []

    async def drop_expired(self, namespaces: Sequence[str]) -> None:
        """Nothing expires here."""

    def announce(self, api: Sequence[str]) -> None:
        """The data dir's lock file tells the CLI where the API is (``DataDirLock.announce``)."""

    async def aclose(self) -> None:
        self._held.clear()


class PostgresLeases:
    """Leases in the shared PostgreSQL database, on a connection of their own (renewals never queue behind the
    event writer). Open with ``PostgresLeases.open``."""

    def __init__(self, db: Any, lease_s: float, unblocker: Any = None) -> None:
        self._db = db  # a PostgresDb (imported only with psycopg)
        #: a connection of its own for ending what blocks a claim (``_end_blockers``; None: claims just wait)
        self._unblocker = unblocker
        self._unblocker_limiter = trio.CapacityLimiter(1)
        self.lease_s = lease_s
        self.supervisor_id = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self._host = socket.gethostname()
        #: namespace -> epoch, replaced (never changed in place) on every change: writes keep the one they saw
        self._held: Mapping[str, int] = {}
        self._limiter = trio.CapacityLimiter(1)  # one thread at a time on the connection
        self._api: tuple[str, ...] = ()
        self._last_renewal_began = trio.current_time()
        self.failure: str | None = None
        #: set when a renewal should not wait for its time (the API was announced)
        self.renewal_wanted = trio.Event()

    @property
    def renew_every_s(self) -> float:
        return self.lease_s / 3

    @property
    def deadline(self) -> float:
        return self._last_renewal_began + self.lease_s

    def forfeit(self) -> frozenset[str]:
        if trio.current_time() < self.deadline or not self._held:
            return frozenset()
        lost = frozenset(self._held)
        self._held = {}
        self.failure = (f"the namespace leases were not renewed for {self.lease_s:g} s (the database does not "
                        "answer): this supervisor let go of its namespaces")
        return lost

    @property
    def epochs(self) -> Mapping[str, int]:
        return self._held

    def let_go(self, namespace: str, epoch: int | None) -> bool:
        if epoch is None or self._held.get(namespace) != epoch:
            return False
        self._held = {held: e for held, e in self._held.items() if held != namespace}
        return True

    @classmethod
    async def open(cls, url: str, location: str, lease_s: float = LEASE_S) -> PostgresLeases:
        from ._pg import PostgresDb

        if not lease_s > 0:
            raise ValueError(f"a lease lasts more than 0 seconds, not {lease_s}")
        leases = cls(PostgresDb(url, location, origin="leases"), lease_s, PostgresDb(url, location, origin="leases"))
        try:
            await leases._run("registering this supervisor", leases._register)
        except BaseException:
            leases._close()
            raise
        return leases

    async def _run(self, where: str, function: Any, *args: Any) -> Any:
        def guarded() -> Any:
            try:
                self._db.ready()
                try:
                    return function(*args)
                except Exception as exc:
                    if not self._db.lost_connection(exc):
                        raise
                    self._db.ready()  # dropped since its last use (the server restarted): each step may repeat
                    return function(*args)
            except Exception as exc:
                self._db.rollback()
                translated = self._db.translate(exc, where)
                if translated is exc:
                    raise
                raise translated from exc

        return await trio.to_thread.run_sync(guarded, limiter=self._limiter)

    def _register(self) -> None:
        self._db.execute(  # supervisors long gone that hold nothing
            "DELETE FROM supervisors s WHERE heartbeat_at < now() - interval '1 day' AND NOT EXISTS "
            "(SELECT 1 FROM namespace_leases l WHERE l.supervisor_id = s.supervisor_id)")
        self._db.execute(
            "INSERT INTO supervisors(supervisor_id, host, pid, api, started_at, heartbeat_at) "
            "VALUES (?, ?, ?, ?, ?, now())", (self.supervisor_id, self._host, os.getpid(), "[]", now_text()))

    def _close(self) -> None:
        self._db.close()
        if self._unblocker is not None:
            self._unblocker.close()

    async def claim(self, namespace: str) -> Claim:
        if namespace in self._held:
            return Claim()
        claim: Claim = await self._unblocked(f"taking the lease of namespace {namespace!r}", [namespace],
                                             self._claim, namespace)
        if claim.holder is None and claim.epoch is not None:
            self._held = {**self._held, namespace: claim.epoch}
        return claim

    async def _unblocked(self, where: str, namespaces: Sequence[str], function: Any, *args: Any) -> Any:
        """``_run`` for a statement that locks the lease rows of ``namespaces`` (a claim, a drop): while it is blocked,
        what blocks it for an expired lease is ended (``_unblock``)."""
        result: Any = None
        async with trio.open_nursery() as nursery:
            if self._unblocker is not None:
                nursery.start_soon(self._unblock, namespaces)

            async def run() -> None:
                nonlocal result
                result = await self._run(where, function, *args)
                nursery.cancel_scope.cancel()

            nursery.start_soon(run)
        return result

    async def _unblock(self, namespaces: Sequence[str]) -> None:
        """Every ``lease_s * TAKEOVER_WAIT`` the statement on our connection is still blocked, end what blocks it for
        an expired lease of ``namespaces`` (``_end_blockers``). A failure here is logged; the statement waits on."""
        while True:
            await trio.sleep(self.lease_s * TAKEOVER_WAIT)
            waiting = self._db.backend_pid
            if waiting is None:
                continue
            try:
                ended = await trio.to_thread.run_sync(self._end_blockers, waiting, list(namespaces),
                                                      limiter=self._unblocker_limiter)
            except Exception as exc:
                await trio.to_thread.run_sync(self._unblocker.rollback, limiter=self._unblocker_limiter)
                log.warning("namespace leases %s: blocked, and what blocks them could not be ended: %s",
                            ", ".join(namespaces), self._unblocker.translate(exc, "ending a stopped holder's "
                                                                             "transactions"))
                continue
            if ended:
                log.warning("namespace leases %s: blocked by %d connection(s) of a supervisor whose lease expired "
                            "(stopped in a transaction?): ended them", ", ".join(namespaces), ended)

    def _end_blockers(self, waiting: int, namespaces: list[str]) -> int:
        """End the backends that block the ``waiting`` backend if they are supervisors' connections in no lock wait
        of their own (a fellow claimer waiting in line is left alone) and a lease of ``namespaces`` has expired and
        is another supervisor's; how many were ended."""
        self._unblocker.ready()
        return int(self._unblocker.scalar(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(a.pid)) FROM pg_stat_activity a "
            "WHERE a.pid = ANY(pg_blocking_pids(?)) AND a.application_name = ? "
            "AND a.wait_event_type IS DISTINCT FROM 'Lock' AND EXISTS (SELECT 1 FROM namespace_leases l "
            "WHERE l.namespace = ANY(?) AND l.expires_at < now() AND l.supervisor_id <> ?)",
            (waiting, SUPERVISOR_APPLICATION, namespaces, self.supervisor_id)) or 0)

    def _claim(self, namespace: str) -> Claim:
        """One statement: insert the lease, or take it over where it expired (or is already ours); else say who
        holds it. A holder that gave it up between the two is asked about once more. Either way the lease gets a
        new epoch (the sequence's next, which ``excluded.epoch`` carries)."""
        for _ in range(2):
            row = self._db.execute(
                "INSERT INTO namespace_leases AS l (namespace, supervisor_id, expires_at, taken_at) "
                "VALUES (?, ?, now() + make_interval(secs => ?), now()) "
                "ON CONFLICT (namespace) DO UPDATE SET supervisor_id = excluded.supervisor_id, "
                "expires_at = excluded.expires_at, taken_at = excluded.taken_at, epoch = excluded.epoch "
                "WHERE l.expires_at < now() OR l.supervisor_id = excluded.supervisor_id "
                "RETURNING epoch", (namespace, self.supervisor_id, self.lease_s)).fetchall()
            if row:
                return Claim(taken_over=True, epoch=int(row[0][0]))
            for supervisor_id, host, pid, api in self._db.execute(
                    "SELECT s.supervisor_id, s.host, s.pid, s.api FROM namespace_leases l "
                    "JOIN supervisors s USING (supervisor_id) WHERE l.namespace = ?", (namespace,)):
                return Claim(holder=Holder(supervisor_id, host, int(pid), tuple(json.loads(api))))
        raise StoreError(f"namespace {namespace!r} is leased to a supervisor that is not registered")

    async def renew(self) -> Renewal:
        began = trio.current_time()
        asked = frozenset(self._held)  # a claim that lands while this renewal waits is not this renewal's to judge
        try:
            held: set[str] = await self._run("renewing this supervisor's namespace leases", self._renew,
                                             sorted(asked))
        except StoreError as exc:
            self.failure = str(exc)
            lost = self.forfeit()  # past the deadline others may take them: let go first
            if lost:
                return Renewal(frozenset(), lost)
            raise
        self.failure = None
        self._last_renewal_began = began
        lost = asked - held
        if lost:
            self._held = {namespace: epoch for namespace, epoch in self._held.items() if namespace not in lost}
        return Renewal(frozenset(self._held), lost)

    def _renew(self, held: list[str]) -> set[str]:
        """Extend the leases we hold (those still ours come back). Any other lease in our name is one we let go of
        (cut off too long): left to expire, so that whoever takes it over fails the tasks we dropped there."""
        self._db.execute("UPDATE supervisors SET heartbeat_at = now(), api = ? WHERE supervisor_id = ?",
                         (json.dumps(list(self._api)), self.supervisor_id))
        return {namespace for (namespace,) in self._db.execute(
            "UPDATE namespace_leases SET expires_at = now() + make_interval(secs => ?) "
            "WHERE supervisor_id = ? AND namespace = ANY(?) RETURNING namespace",
            (self.lease_s, self.supervisor_id, held))}

    async def expired(self) -> list[str]:
        return list(await self._run("listing expired namespace leases", self._expired))

    async def drop_expired(self, namespaces: Sequence[str]) -> None:
        for namespace in namespaces:  # one at a time: what blocks a drop is ended only for the lease it waits for
            await self._unblocked(f"dropping the expired lease of namespace {namespace!r}", [namespace],
                                  self._drop_expired, [namespace])

    def _drop_expired(self, namespaces: list[str]) -> None:
        self._db.execute("DELETE FROM namespace_leases WHERE namespace = ANY(?) AND expires_at < now()",
                         (namespaces,))

    def _expired(self) -> list[str]:
        return [namespace for (namespace,) in self._db.execute(
            "SELECT namespace FROM namespace_leases WHERE expires_at < now() ORDER BY namespace")]

    def announce(self, api: Sequence[str]) -> None:
        self._api = tuple(api)  # written by the next renewal, which comes at once
        self.renewal_wanted.set()

    async def aclose(self) -> None:
        try:
            await self._run("giving up this supervisor's namespace leases", self._give_up)
        finally:
            self._held = {}
            self._close()

    def _give_up(self) -> None:
        self._db.execute("DELETE FROM namespace_leases WHERE supervisor_id = ?", (self.supervisor_id,))
        self._db.execute("DELETE FROM supervisors WHERE supervisor_id = ?", (self.supervisor_id,))
