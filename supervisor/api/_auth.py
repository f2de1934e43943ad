"""Bearer-token authorization for the HTTP API.

``<data_dir>/api-tokens.json`` holds only sha256 hashes of tokens::

    {"version": 1, "tokens": [{"id": "tok_…", "name": "admin", "sha256": "<hex>", "admin": true, "namespaces": []},
                              {"id": "tok_…", "name": "alice", "sha256": "<hex>", "admin": false,
                               "namespaces": ["user:alice"]}]}

The admin may do anything; a principal only sees and touches sessions of the namespaces it is bound to. Each
token has an id (``token list|revoke|rotate``); a name is unique per namespace. The bootstrap admin token (plain
text) is written once to ``<data_dir>/admin.token`` with mode 0600. A tokens file that fails to parse fails
closed: no tenant token is valid until it is fixed; the admin token still is, by its own file.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ..config import ADMIN_TOKEN_FILE
from ..namespaces import Namespace, write_private

log = logging.getLogger("codesdk.supervisor.api.auth")

TOKENS_FILE = "api-tokens.json"


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def new_token() -> str:
    return "csk_" + secrets.token_urlsafe(32)


@dataclass(frozen=True)
class Principal:
    name: str
    admin: bool = False
    namespaces: frozenset[str] = field(default_factory=frozenset)
    #: A token for Prometheus: it reads /metrics and nothing else (no namespace, not the admin).
    metrics: bool = False

    def can_access(self, namespace: str) -> bool:
        return self.admin or namespace in self.namespaces

    @property
    def identity(self) -> str:
        """Who this is, the same for each of its tokens (a rotated one too) and no other principal's: a name is
        unique per namespace only, so a name alone could be another tenant's. What is kept per principal (its
        idempotency keys) is kept by this."""
        if self.metrics:
            return f"{self.name}@metrics"
        return "admin" if self.admin else f"{self.name}@{','.join(sorted(self.namespaces))}"


class TokenFileInvalid(ValueError):
    """The tokens file is not a valid token table (syntax, or a field of the wrong type)."""


class TokenNotFound(ValueError):
    """No token has that id or name (or a name matches several: give the id)."""


class TokenNameTaken(ValueError):
    """A token of that name is already bound to one of the namespaces asked for."""


def _new_id() -> str:
    return "tok_" + secrets.token_hex(6)


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


class _TokenTable(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    version: int = 1
    tokens: list[_TokenRecord] = Field(default_factory=list)


def _read_entries(path: Path) -> list[_Entry]:
    try:
        table = _TokenTable.model_validate_json(path.read_bytes())
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'file'}: {e['msg']}"
                             for e in exc.errors(include_url=False))
        raise TokenFileInvalid(f"{path} is not a valid token table ({problems})") from None
    entries = [_Entry(r.sha256, Principal(name=r.name, admin=r.admin, namespaces=frozenset(r.namespaces),
                                          metrics=r.metrics),
                      r.id or "tok_" + r.sha256[:12])  # a stable id for a record written before ids
               for r in table.tokens]
    for i, entry in enumerate(entries):  # written before names were unique: both work; say so, lock nobody out
        for other in entries[:i]:
            if _clashes(entry.principal, other.principal):
                log.warning("%s: tokens %s and %s are both named %r for one namespace; revoke or rotate one "
                            "(`codesdk-supervisor token list`)", path, other.id, entry.id, entry.principal.name)
    return entries


@dataclass(frozen=True)
class _Entry:
    digest: str
    principal: Principal
    id: str = field(default_factory=_new_id)


def _clashes(a: Principal, b: Principal) -> bool:
    """Two tokens of one name for one namespace (the admin's namespaces: all of them), or two metrics tokens."""
    return a.name == b.name and (a.admin or b.admin or bool(a.namespaces & b.namespaces) or (a.metrics and b.metrics))


class TokenAuth:
    """Looks bearer tokens up by their sha256 hash (compared in constant time)."""

    def __init__(self, entries: list[_Entry] | None = None, path: Path | None = None) -> None:
        self._entries = list(entries or [])
        self.path = path
        #: Why the tokens file failed to load at the last (re)load, while it fails closed; None once it loads.
        self.broken: str | None = None

    @classmethod
    def load(cls, data_dir: Path) -> TokenAuth:
        """The token table of ``data_dir``; ``TokenFileInvalid`` (saying what is wrong) if the file is not one."""
        path = Path(data_dir) / TOKENS_FILE
        return cls(_read_entries(path), path)

    @classmethod
    def bootstrap(cls, data_dir: Path) -> TokenAuth:
        """Load the tokens file; create it, with a fresh admin token in ``admin.token`` (0600), if absent."""
        data_dir = Path(data_dir)
        data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        if (data_dir / TOKENS_FILE).exists():
            return cls.load(data_dir)
        token = new_token()
        write_private(data_dir / ADMIN_TOKEN_FILE, token + "\n")
        auth = cls([_Entry(hash_token(token), Principal(name="admin", admin=True))], data_dir / TOKENS_FILE)
        auth.save()
        return auth

    def add_principal(self, name: str, namespaces: list[str] | tuple[str, ...], *, admin: bool = False,
                      metrics: bool = False) -> str:
        """Bind a new token to ``namespaces`` (``metrics``: a token that reads /metrics alone, bound to none);
        returns the token (only its hash is kept). Saves if file-backed."""
        for namespace in namespaces:
            Namespace.parse(namespace)  # InvalidNamespace with a clear message
        if metrics and (admin or namespaces):
            raise ValueError("a metrics token reads /metrics alone: give it no namespace")
        principal = Principal(name=name, admin=admin, namespaces=frozenset(namespaces), metrics=metrics)
        for entry in self._entries:
            if _clashes(entry.principal, principal):
                raise TokenNameTaken(f"a token named {name!r} already exists for "
                                     f"{', '.join(sorted(entry.principal.namespaces)) or 'all namespaces (admin)'} "
                                     f"({entry.id}); rotate or revoke it, or choose another name")
        token = new_token()
        self._entries.append(_Entry(hash_token(token), principal))
        if self.path is not None:
            self.save()
        return token

    def records(self) -> list[tuple[str, Principal]]:
        """(id, principal) of every token, in the file's order; never a token or its hash."""
        return [(e.id, e.principal) for e in self._entries]

    def tenants(self) -> list[str]:
        """Why the service is multi-user, if it is: the names of its tenants' tokens (those bound to namespaces),
        or the tokens file that does not load (its tokens are unknown: taken as tenants'); empty when only the
        admin's (and metrics) tokens exist."""
        self._reload_if_changed()
        if self.broken is not None:
            return [f"those of the tokens file that does not load ({self.path})"]
        return [e.principal.name for e in self._entries if not e.principal.admin and not e.principal.metrics]

    def _find(self, id_or_name: str) -> int:
        matches = [i for i, e in enumerate(self._entries) if id_or_name in (e.id, e.principal.name)]
        if not matches:
            raise TokenNotFound(f"no token has the id or name {id_or_name!r}; `codesdk-supervisor token list` "
                                "shows them")
        if len(matches) > 1:
            raise TokenNotFound(f"{len(matches)} tokens are named {id_or_name!r} (in different namespaces); "
                                "give the id from `codesdk-supervisor token list`")
        return matches[0]

    def revoke(self, id_or_name: str) -> tuple[str, Principal]:
        """Remove the token; it stops working at the service's next request. Saves if file-backed."""
        entry = self._entries.pop(self._find(id_or_name))
        if self.path is not None:
            self.save()
        return entry.id, entry.principal

    def rotate(self, id_or_name: str) -> tuple[str, Principal, str]:
        """A new token in place of the old one (same id, name, namespaces); the old one stops working."""
        index = self._find(id_or_name)
        old = self._entries[index]
        token = new_token()
        self._entries[index] = _Entry(hash_token(token), old.principal, old.id)
        if self.path is not None:
            self.save()
        return old.id, old.principal, token

    def save(self) -> None:
        if self.path is None:
            raise ValueError("this TokenAuth has no file to save to")
        doc = {"version": 1, "tokens": [
            {"id": e.id, "name": e.principal.name, "sha256": e.digest, "admin": e.principal.admin,
             "namespaces": sorted(e.principal.namespaces)} | ({"metrics": True} if e.principal.metrics else {})
            for e in self._entries]}
        write_private(self.path, json.dumps(doc, indent=2) + "\n")

    def reload(self) -> int:
        """Read the tokens file again (SIGHUP); the number of tokens in force. A file that fails to parse fails
        closed: only the admin token (``admin.token`` beside it) stays valid until the file is fixed."""
        if self.path is None:
            return len(self._entries)
        try:
            self._mtime: int | None = self.path.stat().st_mtime_ns
        except OSError:
            self._mtime = None
        try:
            self._entries = _read_entries(self.path)
            self.broken = None
        except (TokenFileInvalid, OSError) as exc:
            self._entries = self._admin_only()
            self.broken = str(exc)
            log.error("%s; no tenant token is valid until it is fixed (the admin token in %s still is)", exc,
                      self.path.parent / ADMIN_TOKEN_FILE)
        return len(self._entries)

    def _admin_only(self) -> list[_Entry]:
        assert self.path is not None
        try:
            token = (self.path.parent / ADMIN_TOKEN_FILE).read_text().strip()
        except OSError:
            return []
        return [_Entry(hash_token(token), Principal(name="admin", admin=True), "tok_admin")] if token else []

    def _reload_if_changed(self) -> None:
        """Tokens added by `codesdk-supervisor token add` take effect without a restart."""
        if self.path is None:
            return
        try:
            mtime: int | None = self.path.stat().st_mtime_ns
        except OSError:
            mtime = None
        if mtime != getattr(self, "_mtime", None):
            self.reload()

    def authenticate(self, token: str | None) -> Principal | None:
        if not token:
            return None
        return self.authenticate_hash(hash_token(token))

    def authenticate_hash(self, digest: str) -> Principal | None:
        """The principal of the token with this sha256 (a console session keeps the hash, never the token): None
        once that token is revoked or rotated."""
        self._reload_if_changed()
        found: Principal | None = None
        for entry in self._entries:
            if hmac.compare_digest(entry.digest, digest):
                found = entry.principal
        return found


