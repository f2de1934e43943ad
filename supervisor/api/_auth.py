"""Bearer-token authorization for the HTTP API.

``<data_dir>/api-tokens.json`` holds only sha256 hashes of tokens::

    {"version": 1, "tokens": [{"name": "admin", "sha256": "<hex>", "admin": true, "namespaces": []},
                              {"name": "alice", "sha256": "<hex>", "admin": false, "namespaces": ["user:alice"]}]}

The admin may do anything; a principal only sees and touches sessions of the namespaces it is bound to.
The bootstrap admin token (plain text) is written once to ``<data_dir>/admin.token`` with mode 0600.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

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

    def can_access(self, namespace: str) -> bool:
        return self.admin or namespace in self.namespaces


class TokenFileInvalid(ValueError):
    """The tokens file is not a valid token table (syntax, or a field of the wrong type)."""


class _TokenRecord(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    name: str = Field(min_length=1, max_length=200)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    admin: bool = False  # strict: "false" (a string) is an error, never a truthy grant
    namespaces: list[str] = Field(default_factory=list)

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
    return [_Entry(r.sha256, Principal(name=r.name, admin=r.admin, namespaces=frozenset(r.namespaces)))
            for r in table.tokens]


@dataclass(frozen=True)
class _Entry:
    digest: str
    principal: Principal


class TokenAuth:
    """Looks bearer tokens up by their sha256 hash (compared in constant time)."""

    def __init__(self, entries: list[_Entry] | None = None, path: Path | None = None) -> None:
        self._entries = list(entries or [])
        self.path = path

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

    def add_principal(self, name: str, namespaces: list[str] | tuple[str, ...], *, admin: bool = False) -> str:
        """Bind a new token to ``namespaces``; returns the token (only its hash is kept). Saves if file-backed."""
        for namespace in namespaces:
            Namespace.parse(namespace)  # InvalidNamespace with a clear message
        token = new_token()
        self._entries.append(_Entry(hash_token(token), Principal(name=name, admin=admin,
                                                                 namespaces=frozenset(namespaces))))
        if self.path is not None:
            self.save()
        return token

    def save(self) -> None:
        if self.path is None:
            raise ValueError("this TokenAuth has no file to save to")
        doc = {"version": 1, "tokens": [
            {"name": e.principal.name, "sha256": e.digest, "admin": e.principal.admin,
             "namespaces": sorted(e.principal.namespaces)} for e in self._entries]}
        write_private(self.path, json.dumps(doc, indent=2) + "\n")

    def _reload_if_changed(self) -> None:
        """Tokens added by `codesdk-supervisor token add` take effect without a restart."""
        if self.path is None:
            return
        try:
            mtime = self.path.stat().st_mtime_ns
        except OSError:
            return
        if mtime != getattr(self, "_mtime", None):
            self._mtime = mtime
            try:
                self._entries = _read_entries(self.path)
            except (TokenFileInvalid, OSError) as exc:  # keep the last good table: no lock-out, no 500s
                log.error("%s; the tokens loaded before stay in force until it is fixed", exc)

    def authenticate(self, token: str | None) -> Principal | None:
        if not token:
            return None
        self._reload_if_changed()
        digest = hash_token(token)
        found: Principal | None = None
        for entry in self._entries:
            if hmac.compare_digest(entry.digest, digest):
                found = entry.principal
        return found


