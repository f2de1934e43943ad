"""Bearer-token authorization for the HTTP API.

A token table holds only sha256 hashes of tokens; where it is kept is a ``TokenStore`` (``_token_store``): on one
host ``<data_dir>/api-tokens.json``::

    {"version": 1, "tokens": [{"id": "tok_…", "name": "admin", "sha256": "<hex>", "admin": true, "namespaces": []},
                              {"id": "tok_…", "name": "alice", "sha256": "<hex>", "admin": false,
                               "namespaces": ["user:alice"]}]}

and with ``--store postgresql://…`` the database's ``api_tokens`` table, which every supervisor of it shares.

The admin may do anything; a principal only sees and touches sessions of the namespaces it is bound to. Each
token has an id (``token list|revoke|rotate``); a name is unique per namespace. The bootstrap admin token (plain
text) is written once to ``<data_dir>/admin.token`` with mode 0600 (on PostgreSQL: by the supervisor that found
the table without an admin token; it is a row like the others there). A tokens file that fails to parse fails
closed: no tenant token is valid until it is fixed; the admin token still is, by its own file. A shared table that
cannot be read for ``STALE_AFTER_S`` fails closed too (``_token_store`` says the bounds).

``authenticate`` is synchronous and called on every request: it reads an in-memory view of the table, which
changes made here replace at once and which ``follow`` keeps in step with other supervisors' changes.
"""

from __future__ import annotations

import hmac
import logging
import math
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from ..config import ADMIN_TOKEN_FILE
from ..namespaces import Namespace, write_private
from ..store import open_token_table
from ._principal import (Principal, TokenEntry, TokenFileInvalid, TokenNameTaken, TokenNotFound, TokensNotMoved,
                         clashes, hash_token, new_token)
from ._token_store import (REREAD_S, STALE_AFTER_S, TOKENS_FILE, Change, FileTokenStore, PostgresTokenStore,
                           TokenStore)

__all__ = ["TOKENS_FILE", "Principal", "TokenAuth", "TokenEntry", "TokenFileInvalid", "TokenNameTaken",
           "TokenNotFound", "TokensNotMoved", "hash_token", "open_token_auth"]

log = logging.getLogger("codesdk.supervisor.api.auth")

#: How often an open event stream looks whether the token table changed (a counter and a clock compared; for a
#: file, its mtime): a revoke ends the streams of its token this long after the table here has it, at most.
RECHECK_S = 0.5


class TokenAuth:
    """Looks bearer tokens up by their sha256 hash (compared in constant time). Without a store (or ``path``) the
    table lives in memory alone."""

    def __init__(self, entries: list[TokenEntry] | None = None, path: Path | None = None, *,
                 store: TokenStore | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self._entries = list(entries or [])
        self.store: TokenStore | None = store if store is not None else (
            FileTokenStore(path) if path is not None else None)
        #: Why the table is not in force at the moment (it fails closed), or None while it is.
        self.broken: str | None = None
        self._clock = clock  # what the view's age is measured by
        self._lock = threading.Lock()  # changes and (re)loads, made from threads: one at a time
        self._as_of = -math.inf  # when (time.monotonic) the view was last read from the store: an older read loses
        self._fresh_until = math.inf  # a shared table: when tenants are refused if it has not been read again
        self._unreadable = False  # a shared table's last read failed (said once)
        self._generation = 0  # counts the views installed: what an open stream compares to know it must re-check
        self._looked_at = -math.inf  # when the open streams last had the file's mtime looked at: one look serves all

    @property
    def path(self) -> Path | None:
        """The tokens file, where the table is one."""
        return self.store.path if isinstance(self.store, FileTokenStore) else None

    @property
    def where(self) -> str:
        """Where the table is kept, as messages name it."""
        return "memory" if self.store is None else self.store.where

    @classmethod
    def load(cls, data_dir: Path) -> TokenAuth:
        """The token table of ``data_dir``; ``TokenFileInvalid`` (saying what is wrong) if the file is not one."""
        auth = cls(store=FileTokenStore(Path(data_dir) / TOKENS_FILE))
        auth.reload(fail_closed=False)
        return auth

    @classmethod
    def bootstrap(cls, data_dir: Path) -> TokenAuth:
        """Load the tokens file; create it, with a fresh admin token in ``admin.token`` (0600), if absent."""
        data_dir = Path(data_dir)
        data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        if (data_dir / TOKENS_FILE).exists():
            return cls.load(data_dir)
        token = new_token()
        write_private(data_dir / ADMIN_TOKEN_FILE, token + "\n")
        auth = cls([TokenEntry(hash_token(token), Principal(name="admin", admin=True))], data_dir / TOKENS_FILE)
        auth.save()
        return auth

    @classmethod
    def bootstrap_shared(cls, data_dir: Path, store: TokenStore) -> TokenAuth:
        """The shared table of ``store`` (blocking). If it has no admin token, one is made and written to this
        host's ``admin.token`` (0600). ``TokensNotMoved`` when the table is empty and this data dir has a tokens
        file: those tokens are to be moved first (``codesdk-supervisor import-data-dir``), not forgotten."""
        data_dir = Path(data_dir)
        data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        file = data_dir / TOKENS_FILE

        def with_an_admin(entries: list[TokenEntry]) -> list[TokenEntry]:
            if not entries and file.exists():
                raise TokensNotMoved(
                    f"{store.where} has no API tokens and this data dir has {file}: move them into the database "
                    f"first (`codesdk-supervisor import-data-dir --store URL --data-dir {data_dir}`), or remove the "
                    "file to start with a new admin token")
            if any(e.principal.admin for e in entries):
                return entries
            token = new_token()
            write_private(data_dir / ADMIN_TOKEN_FILE, token + "\n")  # before the commit: never a token unwritten
            log.warning("%s had no admin token: a new one is in %s (on this host only)", store.where,
                        data_dir / ADMIN_TOKEN_FILE)
            return [*entries, TokenEntry(hash_token(token), Principal(name="admin", admin=True))]

        auth = cls(store=store)
        started = auth._clock()
        auth._install(store.edit(with_an_admin), started)
        return auth

    def issue(self, name: str, namespaces: list[str] | tuple[str, ...], *, admin: bool = False,
              metrics: bool = False) -> tuple[str, Principal, str]:
        """Bind a new token to ``namespaces`` (``metrics``: a token that reads /metrics alone, bound to none): its
        id, principal and the token itself (only its hash is kept). Blocking where the table is kept."""
        for namespace in namespaces:
            Namespace.parse(namespace)  # InvalidNamespace with a clear message
        if metrics and (admin or namespaces):
            raise ValueError("a metrics token reads /metrics alone: give it no namespace")
        principal = Principal(name=name, admin=admin, namespaces=frozenset(namespaces), metrics=metrics)
        token = new_token()
        added = TokenEntry(hash_token(token), principal)

        def add(entries: list[TokenEntry]) -> list[TokenEntry]:
            for entry in entries:
                if clashes(entry.principal, principal):
                    raise TokenNameTaken(
                        f"a token named {name!r} already exists for "
                        f"{', '.join(sorted(entry.principal.namespaces)) or 'all namespaces (admin)'} ({entry.id}); "
                        "rotate or revoke it, or choose another name")
            return [*entries, added]

        self._edit(add)
        return added.id, principal, token

    def add_principal(self, name: str, namespaces: list[str] | tuple[str, ...], *, admin: bool = False,
                      metrics: bool = False) -> str:
        """``issue``'s token alone."""
        return self.issue(name, namespaces, admin=admin, metrics=metrics)[2]

    def records(self) -> list[tuple[str, Principal]]:
        """(id, principal) of every token, in the table's order; never a token or its hash."""
        self._reload_if_changed()
        return [(e.id, e.principal) for e in self._entries]

    def tenants(self) -> list[str]:
        """Why the service is multi-user, if it is: the names of its tenants' tokens (those bound to namespaces),
        or the tokens file that does not load (its tokens are unknown: taken as tenants'); empty when only the
        admin's (and metrics) tokens exist."""
        self._reload_if_changed()
        if self.broken is not None and not (self.store is not None and self.store.shared):
            return [f"those of the tokens file that does not load ({self.path})"]
        return [e.principal.name for e in self._entries if not e.principal.operator]

    @staticmethod
    def _find(entries: list[TokenEntry], id_or_name: str) -> int:
        matches = [i for i, e in enumerate(entries) if id_or_name in (e.id, e.principal.name)]
        if not matches:
            raise TokenNotFound(f"no token has the id or name {id_or_name!r}; `codesdk-supervisor token list` "
                                "shows them")
        if len(matches) > 1:
            raise TokenNotFound(f"{len(matches)} tokens are named {id_or_name!r} (in different namespaces); "
                                "give the id from `codesdk-supervisor token list`")
        return matches[0]

    def revoke(self, id_or_name: str) -> tuple[str, Principal]:
        """Remove the token; it stops working at the service's next request (on every host: see the module)."""
        removed: list[TokenEntry] = []

        def remove(entries: list[TokenEntry]) -> list[TokenEntry]:
            removed[:] = [entries.pop(self._find(entries, id_or_name))]
            return entries

        self._edit(remove)
        return removed[0].id, removed[0].principal

    def rotate(self, id_or_name: str) -> tuple[str, Principal, str]:
        """A new token in place of the old one (same id, name, namespaces); the old one stops working."""
        token = new_token()
        old: list[TokenEntry] = []

        def replace(entries: list[TokenEntry]) -> list[TokenEntry]:
            index = self._find(entries, id_or_name)
            old[:] = [entries[index]]
            entries[index] = TokenEntry(hash_token(token), entries[index].principal, entries[index].id)
            return entries

        self._edit(replace)
        return old[0].id, old[0].principal, token

    def save(self) -> None:
        """Write the table as it is here to the tokens file."""
        if not isinstance(self.store, FileTokenStore):
            raise ValueError("this TokenAuth has no file to save to")
        with self._lock:
            self.store.save(self._entries)

    def _edit(self, change: Change) -> None:
        with self._lock:
            if self.store is None:
                self._entries = change(list(self._entries))
                return
            entries = self.store.edit(change)
            self._install_locked(entries, self._clock())  # after the commit: any read started since sees it

    def reload(self, *, fail_closed: bool = True) -> int:
        """Read the table again (SIGHUP; blocking); the number of tokens in force. A tokens file that fails to
        parse fails closed: only the admin token (``admin.token`` beside it) stays valid until the file is fixed.
        A shared table that cannot be read keeps the view read last (``STALE_AFTER_S`` bounds it) and logs why.
        ``fail_closed=False``: raise ``TokenFileInvalid`` instead."""
        if self.store is None:
            return len(self._entries)
        started = self._clock()
        try:
            entries = self.store.load()
        except Exception as exc:
            if not fail_closed:
                raise
            if self.store.shared:  # the database's errors say what to do; the view read last stands, bounded
                if not self._unreadable:
                    log.error("reading the API tokens from %s failed: %s; tenants' tokens are refused once the last "
                              "read is %g s old", self.where, exc, STALE_AFTER_S)
                self._unreadable = True
                return len(self._entries)
            if not isinstance(exc, (TokenFileInvalid, OSError)):
                raise
            with self._lock:
                self._entries = self._admin_only()
                self._generation += 1
                self.broken = str(exc)
            log.error("%s; no tenant token is valid until it is fixed (the admin token in %s still is)", exc,
                      self._admin_file())
            return len(self._entries)
        self._unreadable = False
        self._install(entries, started)
        return len(self._entries)

    def _install(self, entries: list[TokenEntry], as_of: float) -> None:
        with self._lock:
            self._install_locked(entries, as_of)

    def _install_locked(self, entries: list[TokenEntry], as_of: float) -> None:
        if as_of < self._as_of:
            return  # read before a change made here since: that change's view stands
        self._entries, self._as_of = entries, as_of
        self._generation += 1
        if self.store is not None and self.store.shared:
            if self.broken is not None:
                log.warning("the API tokens are read from %s again: tenants' tokens work again", self.where)
            self._fresh_until = as_of + STALE_AFTER_S
        self.broken = None

    def _admin_file(self) -> Path | None:
        return None if self.path is None else self.path.parent / ADMIN_TOKEN_FILE

    def _admin_only(self) -> list[TokenEntry]:
        admin_file = self._admin_file()
        if admin_file is None:
            return []
        try:
            token = admin_file.read_text().strip()
        except OSError:
            return []
        return [TokenEntry(hash_token(token), Principal(name="admin", admin=True), "tok_admin")] if token else []

    def _reload_if_changed(self) -> None:
        """Tokens added by `codesdk-supervisor token add` take effect without a restart."""
        if self.store is not None and self.store.changed():
            self.reload()

    async def follow(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep the view in step with other supervisors' changes to a shared table, until cancelled: a read at
        each of their notices, at each (re)connect of the listener and every ``REREAD_S``. Nothing to do for a
        file (its mtime is looked at per request)."""
        wake = trio.Event()

        def changed() -> None:
            wake.set()

        listener = None if self.store is None else self.store.listener(changed)
        if listener is None:
            task_status.started()
            return
        async with trio.open_nursery() as nursery:
            nursery.start_soon(listener.run)
            task_status.started()
            try:
                while True:
                    with trio.move_on_after(REREAD_S):
                        await wake.wait()
                    wake = trio.Event()  # before the read: a notice during it causes another
                    await trio.to_thread.run_sync(self.reload)
            finally:
                listener.stop()

    def _in_force(self) -> list[TokenEntry]:
        self._reload_if_changed()
        entries = self._entries
        if self._clock() <= self._fresh_until:
            return entries
        if self.broken is None:
            self.broken = (f"the API tokens could not be read from {self.where} for {STALE_AFTER_S:g} s: tenants' "
                           "tokens are refused until they are")
            log.error("%s (the admin's and metrics tokens read last still work)", self.broken)
        return [e for e in entries if e.principal.operator]

    def authenticate(self, token: str | None) -> Principal | None:
        if not token:
            return None
        return self.authenticate_hash(hash_token(token))

    def authenticate_hash(self, digest: str) -> Principal | None:
        """The principal of the token with this sha256 (a console session keeps the hash, never the token): None
        once that token is revoked or rotated."""
        found: Principal | None = None
        for entry in self._in_force():
            if hmac.compare_digest(entry.digest, digest):
                found = entry.principal
        return found


    def _view(self) -> tuple[int, bool]:
        """What a token's validity here depends on besides the token: the view's generation, whether it is stale."""
        now = self._clock()
        if now - self._looked_at >= RECHECK_S / 2:
            self._looked_at = now
            self._reload_if_changed()
        return self._generation, now > self._fresh_until

    async def until_lapsed(self, digest: str, namespace: str) -> tuple[str, str]:
        """Return once the token with this sha256 no longer admits ``namespace`` here (revoked, rotated, narrowed,
        or the table fails closed): why, said to the holder of a long-lived request (an event stream), which then
        ends, as (code, message). Re-checks whenever the view changes (a change made here, the file changed, another
        host's notice, a re-read, the table going stale): within ``RECHECK_S`` of the bounds a new request has."""
        seen: tuple[int, bool] | None = None
        while True:
            view = self._view()
            if view != seen:
                seen = view
                principal = self.authenticate_hash(digest)
                if principal is None and self.broken is not None:
                    return "tokens_unavailable", f"{self.broken}; reconnect once they are"
                if principal is None:
                    return "token_revoked", "this stream's token was revoked or rotated; use a valid token"
                if not principal.can_access(namespace):
                    return "token_revoked", (f"this stream's token no longer covers the namespace {namespace!r}; "
                                             "use a token that does")
            await trio.sleep(RECHECK_S)


@asynccontextmanager
async def open_token_auth(data_dir: Path, store_url: str | None = None) -> AsyncIterator[TokenAuth]:
    """The service's tokens: the data dir's file, or with ``store_url`` (``postgresql://…``) the database's table,
    followed (``TokenAuth.follow``) while the body runs. ``StoreError`` when the database cannot be used,
    ``TokensNotMoved`` when this data dir's tokens were not moved into it."""
    if store_url is None:
        yield await trio.to_thread.run_sync(TokenAuth.bootstrap, data_dir)
        return
    table = await trio.to_thread.run_sync(open_token_table, store_url)
    try:
        auth = await trio.to_thread.run_sync(TokenAuth.bootstrap_shared, data_dir, PostgresTokenStore(table))
        async with trio.open_nursery() as nursery:
            await nursery.start(auth.follow)
            yield auth
            nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(table.close)
