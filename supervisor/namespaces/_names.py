"""Namespace names: the grammar (``default``, ``user:<id>``, ``ci:<job>``) and the directory name each maps to."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

_KINDS = ("user", "ci")
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")


class InvalidNamespace(ValueError):
    """A namespace name that is not ``default``, ``user:<id>`` or ``ci:<job>``."""


@dataclass(frozen=True)
class Namespace:
    name: str

    @classmethod
    def parse(cls, name: str) -> Namespace:
        if name == "default":
            return cls(name)
        kind, sep, ident = name.partition(":")
        if not sep or kind not in _KINDS:
            raise InvalidNamespace(
                f"invalid namespace {name!r}: use 'default', 'user:<id>' or 'ci:<job>'")
        if not _ID.fullmatch(ident) or ".." in ident:
            raise InvalidNamespace(
                f"invalid namespace {name!r}: the id must be 1-64 characters of letters, digits, '_', '.', '@', '-', "
                "start with a letter or digit, and not contain '..'")
        return cls(name)

    @property
    def safe_name(self) -> str:
        """Directory name: ':' becomes '.', which kinds and ids can't otherwise produce, so it's unique."""
        return self.name.replace(":", ".", 1)

    def root(self, data_dir: Path) -> Path:
        return data_dir / "namespaces" / self.safe_name
