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
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from .._private_files import write_private
from ..namespaces import Namespace

TOKENS_FILE = "api-tokens.json"
ADMIN_TOKEN_FILE = "admin.token"


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
        path = Path(data_dir) / TOKENS_FILE
        raw = json.loads(path.read_text(encoding="utf-8"))
        entries = [_Entry(str(item["sha256"]), Principal(
            name=str(item["name"]), admin=bool(item.get("admin", False)),
            namespaces=frozenset(str(n) for n in item.get("namespaces", []))))
            for item in raw.get("tokens", [])]
        return cls(entries, path)

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
            self._entries = TokenAuth.load(self.path.parent)._entries
            self._mtime = mtime

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


