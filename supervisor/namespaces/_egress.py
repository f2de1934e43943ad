"""Each namespace's own narrowing of ``http.fetch``'s hosts, in ``<data-dir>/namespace-egress.json``.

A namespace with an entry may fetch only from hosts that one of its patterns *and* one of the operator's
(``--allow-fetch``) allow: it narrows the operator's list, it can never widen it. No entry: the operator's list as is.
An empty list: no host at all. Kept like the other per-namespace settings (0600, written whole under a lock).
"""

from __future__ import annotations

from pathlib import Path

from ..egress import HostPattern, PatternError
from ._limits import JsonLimitFile, LimitTable, LimitTableUnreadable
from ._pg_errors import NamespaceStateUnavailable
from ._names import Namespace

EGRESS_FILE = "namespace-egress.json"
#: Patterns one namespace may keep: enough for any honest list, bounded for the file's size.
MAX_NAMESPACE_PATTERNS = 100


class NamespaceEgressError(ValueError):
    """The stored file or a list to store cannot be used; the message says what to do."""


class NamespaceEgress:
    """The per-namespace host lists: of one data dir, or of ``table`` (``LimitTable``: the shared database)."""

    def __init__(self, data_dir: Path, table: LimitTable | None = None) -> None:
        self.path = Path(data_dir) / EGRESS_FILE
        self.table: LimitTable = table if table is not None else JsonLimitFile(self.path)

    def all(self) -> dict[str, tuple[HostPattern, ...]]:
        where = self.table.location
        try:
            raw = self.table.load()
        except (OSError, ValueError, LimitTableUnreadable, NamespaceStateUnavailable) as exc:
            raise NamespaceEgressError(f"{where} cannot be read ({exc}): fix or remove it") from exc
        if not all(isinstance(v, list) for v in raw.values()):
            raise NamespaceEgressError(f"{where} is not a namespace egress file: fix or remove it")
        try:
            return {name: tuple(HostPattern.parse(str(p)) for p in patterns) for name, patterns in raw.items()}
        except PatternError as exc:
            raise NamespaceEgressError(f"{where}: {exc}: fix or remove it") from exc

    def get(self, namespace: str) -> tuple[HostPattern, ...] | None:
        """The namespace's own patterns; None when it has none (the operator's list applies as is)."""
        return self.all().get(Namespace.parse(namespace).name)

    def set(self, namespace: str, patterns: tuple[HostPattern, ...] | None) -> tuple[HostPattern, ...] | None:
        """Store the namespace's patterns (None: drop its entry); returns what is now stored."""
        name = Namespace.parse(namespace).name
        if patterns is not None and len(patterns) > MAX_NAMESPACE_PATTERNS:
            raise NamespaceEgressError(f"{len(patterns)} patterns for namespace {namespace!r}; at most "
                                       f"{MAX_NAMESPACE_PATTERNS} are kept")
        kept = None if patterns is None else tuple(dict.fromkeys(patterns))
        try:
            self.table.store(name, None if kept is None else [str(p) for p in kept])
        except (LimitTableUnreadable, NamespaceStateUnavailable) as exc:
            raise NamespaceEgressError(f"{self.table.location} cannot be written ({exc})") from exc
        return kept
