"""Each namespace's own narrowing of ``http.fetch``'s hosts, in ``<data-dir>/namespace-egress.json``.

A namespace with an entry may fetch only from hosts that one of its patterns *and* one of the operator's
(``--allow-fetch``) allow: it narrows the operator's list, it can never widen it. No entry: the operator's list as is.
An empty list: no host at all. Kept like the other per-namespace settings (0600, written whole under a lock).
"""

from __future__ import annotations

import json
from pathlib import Path

from ..egress import HostPattern, PatternError
from ._files import locked, write_private
from ._names import Namespace

EGRESS_FILE = "namespace-egress.json"
#: Patterns one namespace may keep: enough for any honest list, bounded for the file's size.
MAX_NAMESPACE_PATTERNS = 100


class NamespaceEgressError(ValueError):
    """The stored file or a list to store cannot be used; the message says what to do."""


class NamespaceEgress:
    """The per-namespace host lists of one data dir."""

    def __init__(self, data_dir: Path) -> None:
        self.path = Path(data_dir) / EGRESS_FILE

    def all(self) -> dict[str, tuple[HostPattern, ...]]:
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise NamespaceEgressError(f"{self.path} cannot be read ({exc}): fix or remove it") from exc
        if not isinstance(raw, dict) or not all(isinstance(v, list) for v in raw.values()):
            raise NamespaceEgressError(f"{self.path} is not a namespace egress file: fix or remove it")
        try:
            return {name: tuple(HostPattern.parse(str(p)) for p in patterns) for name, patterns in raw.items()}
        except PatternError as exc:
            raise NamespaceEgressError(f"{self.path}: {exc}: fix or remove it") from exc

    def get(self, namespace: str) -> tuple[HostPattern, ...] | None:
        """The namespace's own patterns; None when it has none (the operator's list applies as is)."""
        return self.all().get(Namespace.parse(namespace).name)

    def set(self, namespace: str, patterns: tuple[HostPattern, ...] | None) -> tuple[HostPattern, ...] | None:
        """Store the namespace's patterns (None: drop its entry); returns what is now stored."""
        name = Namespace.parse(namespace).name
        if patterns is not None and len(patterns) > MAX_NAMESPACE_PATTERNS:
            raise NamespaceEgressError(f"{len(patterns)} patterns for namespace {namespace!r}; at most "
                                       f"{MAX_NAMESPACE_PATTERNS} are kept")
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with locked(self.path.with_suffix(".lock")):
            every = self.all()
            if patterns is None:
                every.pop(name, None)
            else:
                every[name] = tuple(dict.fromkeys(patterns))
            write_private(self.path, json.dumps({k: [str(p) for p in v] for k, v in sorted(every.items())},
                                                indent=1) + "\n")
        return every.get(name)
