"""Which credential namespace a worker serves, read from its HOME (the pool's layout), for messages that tell an
operator what to run for it."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def namespace_of(env: Mapping[str, str] | os._Environ[str]) -> tuple[str, Path] | None:
    """The credential namespace and data dir a worker's HOME belongs to (``<data-dir>/namespaces/<ns>/home``)."""
    home = Path(env.get("HOME", "")) if env.get("HOME") else None
    if home is None or home.name != "home" or home.parent.parent.name != "namespaces":
        return None
    safe = home.parent.name
    name = safe if safe == "default" else safe.replace(".", ":", 1)
    return name, home.parent.parent.parent
