"""Where per-namespace limits are kept: one table per kind of limit, namespace -> a JSON value.

``LimitTable`` is all the budgets, the egress narrowing and the disk-quota overrides need of their storage:
``JsonLimitFile`` keeps one kind in a data-dir file (0600, written whole under a lock: one host), and
``PostgresLimitTable`` (``_pg_state``) keeps it in the database several supervisors share. The classes over them
(``NamespaceBudgets``, ``NamespaceEgress``, ``NamespaceDisks``) check and convert values the same way on both.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol

from ._files import locked, write_private

#: The kinds of limit, as the database names them.
BUDGET = "budget"
EGRESS = "egress"
DISK = "disk"
KINDS = (BUDGET, EGRESS, DISK)


class LimitTable(Protocol):
    """One kind of per-namespace limit. ``load`` raises ``LimitTableUnreadable`` when the storage can't be read."""

    location: str

    def load(self) -> dict[str, Any]:
        """Every namespace's value (JSON: what ``store`` was given)."""
        ...

    def store(self, namespace: str, value: Any | None) -> None:
        """Set (None: remove) one namespace's value."""
        ...


class LimitTableUnreadable(RuntimeError):
    """The storage holds something that isn't a limit table; the message says where."""


class JsonLimitFile:
    """One kind of limit in ``<data-dir>/<file>``: ``{namespace: value}`` (``wrap``/``unwrap`` keep older layouts)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.location = str(self.path)

    def load(self) -> dict[str, Any]:
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        if not isinstance(raw, dict):
            raise LimitTableUnreadable(f"{self.path} is not a namespace settings file")
        return raw

    def store(self, namespace: str, value: Any | None) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with locked(self.path.with_suffix(".lock")):
            every = self.load()
            if value is None:
                every.pop(namespace, None)
            else:
                every[namespace] = value
            write_private(self.path, json.dumps(dict(sorted(every.items())), indent=1) + "\n")
