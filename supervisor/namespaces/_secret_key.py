"""The deployment's secret key: what namespace variables kept in PostgreSQL are encrypted under.

One key per deployment (every supervisor sharing the database has the same), 32 random bytes given base64-encoded
in a file (``--secret-key-file``) or ``$CODESDK_SECRET_KEY``. It never reaches the database, a log or an event: the
database holds only a *key id* (a hash of the key) beside each ciphertext, so a row says which key it needs.

Each value is sealed with AES-256-GCM under a fresh random 12-byte nonce; the associated data binds the row
(namespace, name, key id), so a ciphertext moved to another namespace or name, or altered, is refused. Fingerprints
(what a listing shows instead of a value) are HMAC-SHA256 under a key *derived* from the secret key, never the key
itself: they change when the key is rotated (compare fingerprints taken under the same key only).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
from dataclasses import dataclass, field
from collections.abc import Mapping, Sequence
from pathlib import Path

KEY_ENV = "CODESDK_SECRET_KEY"
#: Old keys (base64, separated by commas or whitespace) a supervisor still opens rows with during a rotation.
OLD_KEYS_ENV = "CODESDK_OLD_SECRET_KEYS"
KEY_BYTES = 32
NONCE_BYTES = 12
MAKE_ONE = "make one with `head -c32 /dev/urandom | base64 > FILE` (chmod 600 FILE) and give every supervisor the same"


class SecretKeyError(ValueError):
    """The secret key is missing or unusable (the operator's to fix: the message says how)."""


class UndecryptableVariable(RuntimeError):
    """A stored value cannot be opened: another key sealed it, or the row was altered or moved."""


class KeyNotHeld(UndecryptableVariable):
    """A namespace's rows are sealed under a key this process holds neither as primary nor as old key.

    The message is the operator's (it names key ids); ``TENANT_MESSAGE`` is what an API client is told."""

    TENANT_MESSAGE = ("the namespace's variables cannot be read or changed now: the operator must check the "
                      "deployment's secret key")


@dataclass(frozen=True)
class SecretKey:
    """One deployment key; ``repr`` shows its id only."""

    raw: bytes = field(repr=False)

    def __post_init__(self) -> None:
        if len(self.raw) != KEY_BYTES:
            raise SecretKeyError(f"a secret key is {KEY_BYTES} bytes, this one is {len(self.raw)}; {MAKE_ONE}")

    @property
    def key_id(self) -> str:
        """Names the key in each row it sealed; a hash, so it tells nothing of the key."""
        return hashlib.sha256(b"codesdk key id\0" + self.raw).hexdigest()[:16]

    def fingerprint_key(self) -> bytes:
        return hmac.new(self.raw, b"codesdk variable fingerprint", hashlib.sha256).digest()

    def fingerprint(self, value: str) -> str:
        return "hmac-sha256:" + hmac.new(self.fingerprint_key(), value.encode(), hashlib.sha256).hexdigest()[:16]

    def seal(self, namespace: str, name: str, value: str) -> tuple[bytes, bytes]:
        """(nonce, ciphertext with its tag) for ``value`` stored as ``namespace``'s ``name``."""
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        nonce = os.urandom(NONCE_BYTES)
        return nonce, AESGCM(self.raw).encrypt(nonce, value.encode(), _bound(self.key_id, namespace, name))

    def open(self, namespace: str, name: str, nonce: bytes, ciphertext: bytes) -> str:
        from cryptography.exceptions import InvalidTag
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        try:
            plain = AESGCM(self.raw).decrypt(nonce, ciphertext, _bound(self.key_id, namespace, name))
        except (InvalidTag, ValueError):
            raise UndecryptableVariable(
                f"variable {name} of namespace {namespace!r} does not open under key {self.key_id}: the row was "
                "altered or copied from another variable; set it again (`codesdk-supervisor namespace env set`)"
            ) from None
        return plain.decode()


def _bound(key_id: str, namespace: str, name: str) -> bytes:
    return b"\0".join((b"codesdk-variable", key_id.encode(), namespace.encode(), name.encode()))


def parse_key(text: str | bytes, origin: str) -> SecretKey:
    """The key written as base64 in ``text`` (surrounding whitespace ignored); ``origin`` names where it came from."""
    try:
        raw = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise SecretKeyError(f"{origin} is not base64; {MAKE_ONE}") from None
    if len(raw) != KEY_BYTES:
        raise SecretKeyError(f"{origin} holds {len(raw)} bytes, a secret key is {KEY_BYTES}; {MAKE_ONE}")
    return SecretKey(raw)


def read_key_file(path: Path) -> SecretKey:
    """The key in ``path``; refused, like ssh refuses a private key, when the group or others may read it."""
    try:
        with open(path, "rb") as file:
            mode = os.fstat(file.fileno()).st_mode
            text = file.read()
    except OSError as exc:
        raise SecretKeyError(f"the secret key file {path} cannot be read ({exc.strerror or exc}); {MAKE_ONE}") from exc
    if mode & 0o077:
        raise SecretKeyError(f"the secret key file {path} may be read by others (mode {mode & 0o777:o}); "
                             f"`chmod 600 {path}` and keep it owned by the service's user")
    return parse_key(text, f"the secret key file {path}")


def load_old_keys(paths: Sequence[Path] = (), environ: Mapping[str, str] | None = None) -> tuple[SecretKey, ...]:
    """The old keys from ``paths`` if any, else from ``$CODESDK_OLD_SECRET_KEYS``: opened with, never sealed under."""
    if paths:
        return tuple(read_key_file(path) for path in paths)
    text = (os.environ if environ is None else environ).get(OLD_KEYS_ENV, "")
    return tuple(parse_key(part, f"${OLD_KEYS_ENV}") for part in text.replace(",", " ").split())


def load_secret_key(path: Path | None, environ: Mapping[str, str] | None = None) -> SecretKey | None:
    """The key from ``path`` if given, else from ``$CODESDK_SECRET_KEY``; None when neither is set."""
    if path is not None:
        return read_key_file(path)
    text = (os.environ if environ is None else environ).get(KEY_ENV, "")
    return parse_key(text, f"${KEY_ENV}") if text.strip() else None


def require_secret_key(key: SecretKey | None, why: str) -> SecretKey:
    if key is None:
        raise SecretKeyError(f"{why} needs the deployment's secret key: give --secret-key-file FILE or set "
                             f"${KEY_ENV} (base64 of {KEY_BYTES} bytes); {MAKE_ONE}")
    return key
