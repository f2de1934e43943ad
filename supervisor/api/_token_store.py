"""Where the API's tokens are kept: a file in the data dir (one host), or a PostgreSQL table (several).

- ``FileTokenStore``: ``<data_dir>/api-tokens.json``, hashes only, rewritten whole (0600) at each change; a
  supervisor notices a change by the file's mtime, at its next request.
- ``PostgresTokenStore``: the ``api_tokens`` table (``store.open_token_table``), hashes only, the admin token a
  row like the others. Each change is announced (NOTIFY ``codesdk_tokens``, in the changing transaction) and every
  supervisor's ``TokenAuth`` re-reads the table at each notice, at each (re)connect of its listener, and every
  ``REREAD_S`` besides. So a revoke or a rotation is in force on every host as soon as its notice arrives (well
  under a second while the listener is connected), within ``REREAD_S`` if a notice was missed, and at most
  ``STALE_AFTER_S`` after it whatever happens: a supervisor that could not read the table for that long refuses
  every tenant's token (fail closed) until it reads it again; the operator's tokens (the admin's, metrics tokens)
  still work from the last table read, so the service can be looked at and repaired.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ..namespaces import Namespace, write_private
from ..store import Listening, TokenRow, TokenTable
from ._principal import Principal, TokenEntry, TokenFileInvalid, clashes

log = logging.getLogger("codesdk.supervisor.api.auth")

TOKENS_FILE = "api-tokens.json"

#: Seconds between two reads of a shared token table besides those its notices cause (the safety net).
REREAD_S = 5.0
#: Seconds without a successful read of a shared token table after which tenants' tokens are refused.
STALE_AFTER_S = 15.0

Change = Callable[[list[TokenEntry]], list[TokenEntry]]


class TokenStore(Protocol):
    """A token table's home. Blocking: called from threads by a trio program."""

    #: What messages name: the tokens file, or the database (never its password).
    where: str
    #: Whether the table is shared by several supervisors, which must hear of each other's changes (``listener``)
    #: and may lose the table for a while (``STALE_AFTER_S``); else it is this host's file, re-read when it changed.
    shared: bool

    def load(self) -> list[TokenEntry]:
        """Every token; ``TokenFileInvalid`` or ``StoreError`` saying why not."""
        ...

    def edit(self, change: Change) -> list[TokenEntry]:
        """Replace the table by ``change(entries now)`` in one step (nothing changed if ``change`` raises); the
        entries now."""
        ...

    def changed(self) -> bool:
        """Whether the table may have changed since this store last loaded or edited it (a file's mtime)."""
        ...

    def listener(self, changed: Callable[[], None]) -> Listening | None:
        """What tells of other supervisors' changes (``changed`` on the trio thread), if they can make any."""
        ...


# -- the file ----------------------------------------------------------------------------------------------------


class _TokenRecord(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    id: str | None = Field(default=None, pattern=r"^tok_[0-9a-z]{1,64}$")  # absent in files from before ids
    name: str = Field(min_length=1, max_length=200)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    admin: bool = False  # strict: "false" (a string) is an error, never a truthy grant
    namespaces: list[str] = Field(default_factory=list)
    metrics: bool = False  # reads /metrics only

    @model_validator(mode="after")
    def _metrics_alone(self) -> _TokenRecord:
        if self.metrics and (self.admin or self.namespaces):
            raise ValueError("a metrics token has no namespaces and is not the admin's")
        return self

    @field_validator("namespaces")
    @classmethod
    def _valid_namespaces(cls, namespaces: list[str]) -> list[str]:
        for namespace in namespaces:
            Namespace.parse(namespace)
        return namespaces


class _TokenFile(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    version: int = 1
    tokens: list[_TokenRecord] = Field(default_factory=list)


def read_token_file(path: Path) -> list[TokenEntry]:
    """The tokens of a tokens file; ``TokenFileInvalid`` (saying what is wrong) if it is not a token table."""
    try:
        table = _TokenFile.model_validate_json(path.read_bytes())
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'file'}: {e['msg']}"
                             for e in exc.errors(include_url=False))
        raise TokenFileInvalid(f"{path} is not a valid token table ({problems})") from None
    entries = [TokenEntry(r.sha256, Principal(name=r.name, admin=r.admin, namespaces=frozenset(r.namespaces),
                                              metrics=r.metrics),
                          r.id or "tok_" + r.sha256[:12])  # a stable id for a record written before ids
               for r in table.tokens]
    for i, entry in enumerate(entries):  # written before names were unique: both work; say so, lock nobody out
        for other in entries[:i]:
            if clashes(entry.principal, other.principal):
                log.warning("%s: tokens %s and %s are both named %r for one namespace; revoke or rotate one "
                            "(`codesdk-supervisor token list`)", path, other.id, entry.id, entry.principal.name)
    return entries


class FileTokenStore:
    """``<data_dir>/api-tokens.json``: this host's tokens."""

    shared = False

    def __init__(self, path: Path) -> None:
        self.path = path
        self.where = str(path)
        self._mtime: int | None = None
        self._seen = False

    def load(self) -> list[TokenEntry]:
        self._mtime, self._seen = self._stat(), True  # before the read: a write after it is noticed next time
        return read_token_file(self.path)

    def edit(self, change: Change) -> list[TokenEntry]:
        entries = change(self.load())  # what the file says now: the CLI may have changed it under a service
        self.save(entries)
        return entries

    def save(self, entries: list[TokenEntry]) -> None:
        doc = {"version": 1, "tokens": [
            {"id": e.id, "name": e.principal.name, "sha256": e.digest, "admin": e.principal.admin,
             "namespaces": sorted(e.principal.namespaces)} | ({"metrics": True} if e.principal.metrics else {})
            for e in entries]}
        write_private(self.path, json.dumps(doc, indent=2) + "\n")
        self._mtime, self._seen = self._stat(), True

    def changed(self) -> bool:
        return not self._seen or self._stat() != self._mtime

    def listener(self, changed: Callable[[], None]) -> None:
        return None

    def _stat(self) -> int | None:
        try:
            return self.path.stat().st_mtime_ns
        except OSError:
            return None


# -- the database ------------------------------------------------------------------------------------------------


def _entry(row: TokenRow) -> TokenEntry:
    return TokenEntry(row.sha256, Principal(name=row.name, admin=row.admin, namespaces=frozenset(row.namespaces),
                                            metrics=row.metrics), row.token_id)


def _row(entry: TokenEntry) -> TokenRow:
    p = entry.principal
    return TokenRow(entry.id, p.name, entry.digest, p.admin, p.metrics, tuple(sorted(p.namespaces)))


class PostgresTokenStore:
    """The ``api_tokens`` table every supervisor of one PostgreSQL database shares."""

    shared = True

    def __init__(self, table: TokenTable) -> None:
        self.table = table
        self.where = f"the database {table.location}"

    def load(self) -> list[TokenEntry]:
        return [_entry(row) for row in self.table.rows()]

    def edit(self, change: Change) -> list[TokenEntry]:
        def on_rows(rows: list[TokenRow]) -> list[TokenRow]:
            return [_row(e) for e in change([_entry(r) for r in rows])]

        return [_entry(row) for row in self.table.edit(on_rows)]

    def changed(self) -> bool:
        return False  # announced instead: ``listener``

    def listener(self, changed: Callable[[], None]) -> Listening:
        return self.table.listener(changed)

    def import_entries(self, entries: list[TokenEntry]) -> list[tuple[TokenEntry, str]]:
        """Add a data dir's tokens (``MovedTokens`` says what the outcomes mean)."""

        def refuse(live: list[TokenRow], row: TokenRow) -> str | None:
            principal = _entry(row).principal
            for other in live:
                if clashes(_entry(other).principal, principal):
                    return (f"the database has a token named {principal.name!r} for the same namespaces "
                            f"({other.token_id}); revoke one of them (`codesdk-supervisor token revoke ID`, with "
                            "--store for the database's) and move again")
            return None

        return [(_entry(row), outcome) for row, outcome in self.table.import_rows([_row(e) for e in entries], refuse)]


@dataclass(frozen=True)
class MovedTokens:
    """What moving a data dir's tokens into a database did, by token id (never a token or its hash)."""

    source: Path
    moved: tuple[str, ...] = ()
    present: tuple[str, ...] = ()  # in the database already (rotated there since, maybe: the database's stands)
    moved_before: tuple[str, ...] = ()  # moved by an earlier run and revoked since: never brought back
    refused: tuple[tuple[str, str], ...] = ()  # (id, why)

    def lines(self) -> list[str]:
        if not self.source.exists():
            return [f"tokens: none to move (no {self.source})"]
        said = [f"tokens: moved {len(self.moved)}" + (f" ({', '.join(self.moved)})" if self.moved else "")
                + f"; {len(self.present)} in the database already"
                + (f"; {len(self.moved_before)} moved before and revoked since, not brought back "
                   f"({', '.join(self.moved_before)})" if self.moved_before else "")]
        if not self.moved and not self.refused:
            said[0] += ": nothing to move"
        said += [f"tokens: {token_id} NOT moved: {why}" for token_id, why in self.refused]
        return said


def move_tokens(data_dir: Path, target: PostgresTokenStore) -> MovedTokens:
    """Move the tokens of ``data_dir``'s tokens file into the database (blocking); moving again moves nothing.
    ``TokenFileInvalid`` when the file is not a token table: nothing is moved then."""
    source = Path(data_dir) / TOKENS_FILE
    if not source.exists():
        return MovedTokens(source)
    outcomes = target.import_entries(read_token_file(source))
    ids = {kind: tuple(e.id for e, outcome in outcomes if outcome == kind) for kind in ("moved", "present",
                                                                                       "moved before")}
    return MovedTokens(source, ids["moved"], ids["present"], ids["moved before"],
                       tuple((e.id, outcome) for e, outcome in outcomes
                             if outcome not in ("moved", "present", "moved before")))
