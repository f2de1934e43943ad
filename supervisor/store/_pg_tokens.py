"""The API's tokens in PostgreSQL: one table every supervisor of the database reads (``api_tokens``).

Reads are whole-table (a few rows per tenant); a change is a read-modify-write of the whole table in one
transaction that holds the table's lock against other writers (readers go on) and announces the ids it changed
on ``TOKENS_CHANNEL`` before it commits: the notice is delivered only if the change is. The admin token is a row
like the others (``admin`` true). Synchronous: called from worker threads, one statement at a time per table.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection
from typing import TypeVar

from ._errors import StoreError
from ._pg import PostgresDb, redacted
from ._pg_listen import Channel, Listener
from ._pg_schema import migrate
from ._time import now_text
from ._tokens import TOKENS_CHANNEL, TokenRow

T = TypeVar("T")

_COLUMNS = "token_id, name, sha256, admin, metrics, namespaces"


class PostgresTokenTable:
    """The ``api_tokens`` table of the database at ``url``, on a connection of its own (made on first use)."""

    def __init__(self, url: str) -> None:
        self._url = url
        self.location = redacted(url)
        self._db = PostgresDb(url, self.location, origin="")
        self._lock = threading.Lock()

    def open(self) -> None:
        """Connect, and create or migrate the schema (a command may be the database's first user)."""
        with self._lock:
            self._guarded("opening the token table", lambda: migrate(self._ready()))

    def rows(self) -> list[TokenRow]:
        """Every token, oldest first."""
        with self._lock:
            return self._guarded("reading the API tokens", self._read)

    def edit(self, change: Callable[[list[TokenRow]], list[TokenRow]]) -> list[TokenRow]:
        """Replace the table by ``change(rows)`` in one transaction under the table's lock, announcing the ids it
        changed; the rows now. An exception from ``change`` changes nothing."""
        with self._lock:
            return self._guarded("changing the API tokens", lambda: self._edit(change), again=False)

    def import_rows(self, rows: list[TokenRow],
                    refuse: Callable[[list[TokenRow], TokenRow], str | None]) -> list[tuple[TokenRow, str]]:
        """Add the rows of a data dir not moved here before (by id), each unless ``refuse(rows now, row)`` says why
        not, in one transaction, announced; each row's outcome: "moved", "present", "moved before" (and revoked
        since: never brought back) or why it was refused."""
        with self._lock:
            return self._guarded("moving API tokens into the database", lambda: self._import(rows, refuse),
                                 again=False)

    def listener(self, changed: Callable[[], None]) -> Listener:
        """A listener calling ``changed`` (on the trio thread) at each announced change and at each (re)connect."""

        def act(_ids: Collection[str]) -> None:
            changed()

        return Listener(self._url, self.location, [Channel(TOKENS_CHANNEL, lambda ids: ids, act, changed)])

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _ready(self) -> PostgresDb:
        self._db.ready()
        return self._db

    def _guarded(self, where: str, work: Callable[[], T], *, again: bool = True) -> T:
        """``work``; psycopg's errors as the store's. ``again``: tried once more on a fresh connection if the one it
        used was found dead (reads only: a commit cut off may have been made, so a change is never sent twice;
        ``begin`` replaces a connection found dead before anything of the change was sent)."""
        for attempt in (1, 2):
            try:
                self._ready()
                return work()
            except Exception as exc:
                self._db.rollback()
                if again and attempt == 1 and self._db.lost_connection(exc):
                    continue
                translated = self._db.translate(exc, where)
                if translated is exc or not isinstance(translated, StoreError):
                    raise
                raise translated from exc
        raise AssertionError("unreachable")

    def _read(self) -> list[TokenRow]:
        return [TokenRow(r[0], r[1], r[2], bool(r[3]), bool(r[4]), tuple(r[5]))
                for r in self._db.execute(f"SELECT {_COLUMNS} FROM api_tokens ORDER BY rowid").fetchall()]

    def _import(self, rows: list[TokenRow],
                refuse: Callable[[list[TokenRow], TokenRow], str | None]) -> list[tuple[TokenRow, str]]:
        db = self._db
        db.begin()
        try:
            db.execute("LOCK TABLE api_tokens IN SHARE ROW EXCLUSIVE MODE")
            live = self._read()
            present = {row.token_id for row in live}
            moved_before = {r[0] for r in db.execute("SELECT token_id FROM api_token_imports").fetchall()}
            now = now_text()
            outcomes: list[tuple[TokenRow, str]] = []
            for row in rows:
                if row.token_id in present:
                    outcome = "present"
                elif row.token_id in moved_before:
                    outcome = "moved before"
                elif (why := refuse(live, row)) is not None:
                    outcome = why
                else:
                    db.execute(f"INSERT INTO api_tokens({_COLUMNS}, created_at, updated_at) "
                               "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                               (row.token_id, row.name, row.sha256, row.admin, row.metrics, list(row.namespaces),
                                now, now))
                    db.execute("INSERT INTO api_token_imports(token_id, imported_at) VALUES (?, ?)",
                               (row.token_id, now))
                    live.append(row)
                    present.add(row.token_id)
                    outcome = "moved"
                outcomes.append((row, outcome))
            if moved := [row.token_id for row, outcome in outcomes if outcome == "moved"]:
                db.execute("SELECT pg_notify(?, ?)", (TOKENS_CHANNEL, " ".join(moved)[:7000]))
            db.commit()
        except BaseException:
            db.rollback()
            raise
        return outcomes

    def _edit(self, change: Callable[[list[TokenRow]], list[TokenRow]]) -> list[TokenRow]:
        db = self._db
        db.begin()
        try:
            db.execute("LOCK TABLE api_tokens IN SHARE ROW EXCLUSIVE MODE")  # writers in turn; readers go on
            before = {row.token_id: row for row in self._read()}
            after = change(list(before.values()))
            kept = {row.token_id: row for row in after}
            if len(kept) != len(after):
                raise ValueError("two tokens of one id")
            now = now_text()
            changed = sorted({*before} - {*kept} | {i for i, row in kept.items() if before.get(i) != row})
            for token_id in changed:
                row = kept.get(token_id)
                if row is None:
                    db.execute("DELETE FROM api_tokens WHERE token_id = ?", (token_id,))
                elif token_id in before:
                    db.execute("UPDATE api_tokens SET name = ?, sha256 = ?, admin = ?, metrics = ?, namespaces = ?, "
                               "updated_at = ? WHERE token_id = ?",
                               (row.name, row.sha256, row.admin, row.metrics, list(row.namespaces), now, token_id))
                else:
                    db.execute(f"INSERT INTO api_tokens({_COLUMNS}, created_at, updated_at) "
                               "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                               (row.token_id, row.name, row.sha256, row.admin, row.metrics, list(row.namespaces),
                                now, now))
            if changed:  # delivered to every listener once this commits, never if it does not
                db.execute("SELECT pg_notify(?, ?)", (TOKENS_CHANNEL, " ".join(changed)[:7000]))
            db.commit()
        except BaseException:
            db.rollback()
            raise
        return self._read() if changed else list(before.values())
