"""Each namespace's own variables (API keys, base URLs, ...), kept outside the event store and never shown again.

``<data-dir>/namespace-env/<safe-name>.json`` (0600, in a 0700 directory owned by the supervisor) holds one
namespace's variables; they are added to that namespace's worker environment when its next worker starts. Values
are never returned by anything: a listing shows each name with a *fingerprint* — an HMAC of the value under a key
that never leaves the data dir — so an operator can tell whether two values are the same without either being
readable, and a short or guessable value cannot be recovered from it by trying candidates offline.

Writers (the CLI and the service's API) take a file lock for each read-modify-write and replace files atomically,
so readers never see half a file. A namespace's ``stamp`` changes with every write: the worker pool compares it
to the one its worker started with to know that the worker is out of date.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ._env import RECORD_STREAMS_ENV, RUNTIME_AHEAD_ENV
from ._files import locked, write_private
from ._names import Namespace

ENV_DIR = "namespace-env"
_KEY_FILE = ".fingerprint-key"
_LOCK_FILE = ".lock"
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
#: Set by CodeSDK for every worker: the namespace's isolation rests on them, so nobody may override them here.
RESERVED = frozenset({"HOME", "XDG_CONFIG_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME", "TMPDIR",
                      "PATH", "LANG", "LC_ALL", RUNTIME_AHEAD_ENV})
#: Bytes of one value, and variables per namespace: generous for keys and URLs, bounded for a hostile caller.
MAX_VALUE_BYTES = 32 * 1024
MAX_VARIABLES = 200


class NamespaceEnvError(ValueError):
    """A variable that can't be stored (bad name, reserved, too large, NUL byte); the message says which."""


@dataclass(frozen=True)
class EnvEntry:
    """What may be shown of one stored variable."""

    name: str
    fingerprint: str

    def to_json_obj(self) -> dict[str, str]:
        return {"name": self.name, "fingerprint": self.fingerprint}


class NamespaceVariables(Protocol):
    """Where a namespace's variables are kept: ``NamespaceEnv`` (files in the data dir, one host) or
    ``PostgresVariables`` (the shared database, encrypted under the deployment key). One instance serves the pool,
    the launches, the API and bundles (``open_namespace_state``)."""

    def values(self, namespace: str) -> dict[str, str]:
        """The namespace's variables, for its worker's environment (never for display)."""
        ...

    def entries(self, namespace: str) -> list[EnvEntry]:
        """Names and fingerprints, sorted by name."""
        ...

    def stamp(self, namespace: str) -> str:
        """Changes whenever the namespace's variables are written ("" when they never were)."""
        ...

    def fingerprint(self, value: str) -> str:
        """An HMAC of ``value``: equal values, equal fingerprints, under one key."""
        ...

    def update(self, namespace: str, set_values: Mapping[str, str] | None = None,
               unset: Sequence[str] = ()) -> list[EnvEntry]:
        """Set and remove variables in one atomic change; returns the new listing."""
        ...


class NamespaceEnv:
    """The namespace variables of one data dir (``NamespaceVariables``)."""

    def __init__(self, data_dir: Path) -> None:
        self.root = Path(data_dir) / ENV_DIR

    # -- reading --------------------------------------------------------------------------------

    def values(self, namespace: str) -> dict[str, str]:
        """The namespace's variables, for its worker's environment (never for display)."""
        return dict(self._read(Namespace.parse(namespace)))

    def entries(self, namespace: str) -> list[EnvEntry]:
        """Names and fingerprints, sorted by name."""
        values = self._read(Namespace.parse(namespace))
        return [EnvEntry(name, self.fingerprint(value)) for name, value in sorted(values.items())]

    def stamp(self, namespace: str) -> str:
        """Changes whenever the namespace's variables are written ("" when it has none)."""
        try:
            info = os.stat(self._file(Namespace.parse(namespace)))
        except FileNotFoundError:
            return ""
        return f"{info.st_ino}:{info.st_mtime_ns}:{info.st_size}"

    def fingerprint(self, value: str) -> str:
        return "hmac-sha256:" + hmac.new(self._key(), value.encode(), hashlib.sha256).hexdigest()[:16]

    # -- writing --------------------------------------------------------------------------------

    def update(self, namespace: str, set_values: Mapping[str, str] | None = None,
               unset: Sequence[str] = ()) -> list[EnvEntry]:
        """Set and remove variables in one atomic change; returns the new listing. Unsetting an absent name is
        not an error (the outcome is the same)."""
        ns = Namespace.parse(namespace)
        set_values = dict(set_values or {})
        for name, value in set_values.items():
            check_variable(name, value)
        for name in unset:
            check_variable_name(name)
        with self._locked():
            values = self._read(ns)
            values.update(set_values)
            for name in unset:
                values.pop(name, None)
            if len(values) > MAX_VARIABLES:
                raise NamespaceEnvError(f"namespace {namespace!r} would have {len(values)} variables; at most "
                                        f"{MAX_VARIABLES} are kept")
            self._write(ns, values)
        return self.entries(namespace)

    # -- files ----------------------------------------------------------------------------------

    def _file(self, ns: Namespace) -> Path:
        return self.root / f"{ns.safe_name}.json"

    def _read(self, ns: Namespace) -> dict[str, str]:
        try:
            raw = json.loads(self._file(ns).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        variables = raw.get("variables") if isinstance(raw, dict) else None
        if not isinstance(variables, dict) or not all(isinstance(v, str) for v in variables.values()):
            raise NamespaceEnvError(f"{self._file(ns)} is not a namespace variables file; restore it or remove it")
        return {str(k): v for k, v in variables.items()}

    def _write(self, ns: Namespace, values: Mapping[str, str]) -> None:
        path = self._file(ns)
        if not values:
            path.unlink(missing_ok=True)
            return
        write_private(path, json.dumps({"version": 1, "variables": dict(sorted(values.items()))}, indent=1))

    def _ensure_root(self) -> None:
        self.root.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # the data dir, if it is new
        self.root.mkdir(mode=0o700, exist_ok=True)
        os.chmod(self.root, 0o700)  # also when it existed looser

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self._ensure_root()
        with locked(self.root / _LOCK_FILE):
            yield

    def _key(self) -> bytes:
        path = self.root / _KEY_FILE
        try:
            return path.read_bytes()
        except FileNotFoundError:
            pass
        with self._locked():
            if not path.exists():
                write_private(path, secrets.token_hex(32))
            return path.read_bytes()


def check_variable_name(name: str) -> None:
    if not _NAME.fullmatch(name):
        raise NamespaceEnvError(f"invalid variable name {name!r}: use letters, digits and '_', not starting with a "
                                "digit (at most 128 characters)")
    if name == RUNTIME_AHEAD_ENV:
        raise NamespaceEnvError(f"{name} is set by CodeSDK itself, only for a worker that `codesdk run` starts, and "
                                "cannot be configured per namespace")
    if name == RECORD_STREAMS_ENV:
        raise NamespaceEnvError(f"{name} makes workers record everything their tasks see; it is the operator's test "
                                "instrument and cannot be configured per namespace")
    if name in RESERVED:
        raise NamespaceEnvError(f"{name} is set by CodeSDK for every worker (the namespace's isolation rests on "
                                "it) and cannot be configured per namespace")


def check_variable(name: str, value: str) -> None:
    check_variable_name(name)
    if not isinstance(value, str):
        raise NamespaceEnvError(f"the value of {name} must be a string")
    if "\x00" in value:
        raise NamespaceEnvError(f"the value of {name} contains a NUL byte, which no environment can hold")
    if len(value.encode("utf-8", errors="surrogatepass")) > MAX_VALUE_BYTES:
        raise NamespaceEnvError(f"the value of {name} is longer than {MAX_VALUE_BYTES} bytes")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise NamespaceEnvError(f"the value of {name} is not valid text (a lone surrogate)") from None

