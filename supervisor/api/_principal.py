"""Who a token is (``Principal``) and what a token table holds (``TokenEntry``: a hash, never the token)."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass, field


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def new_token() -> str:
    return "csk_" + secrets.token_urlsafe(32)


def new_token_id() -> str:
    return "tok_" + secrets.token_hex(6)


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

    @property
    def operator(self) -> bool:
        """The operator's own (the admin's, or a metrics token): no tenant's."""
        return self.admin or self.metrics


@dataclass(frozen=True)
class TokenEntry:
    digest: str  # sha256 of the token, hex
    principal: Principal
    id: str = field(default_factory=new_token_id)


def clashes(a: Principal, b: Principal) -> bool:
    """Two tokens of one name for one namespace (the admin's namespaces: all of them), or two metrics tokens."""
    return a.name == b.name and (a.admin or b.admin or bool(a.namespaces & b.namespaces) or (a.metrics and b.metrics))


class TokenFileInvalid(ValueError):
    """The tokens file is not a valid token table (syntax, or a field of the wrong type)."""


class TokensNotMoved(TokenFileInvalid):
    """The data dir has tokens and the database, which is to hold them, has none: they must be moved first."""


class TokenNotFound(ValueError):
    """No token has that id or name (or a name matches several: give the id)."""


class TokenNameTaken(ValueError):
    """A token of that name is already bound to one of the namespaces asked for."""
