"""What a program is started with, as one value: two equal launches start the same program in the same state.

Used wherever a process started early is later adopted only if it was started exactly as its adopter would start it
now: a namespace's worker launched by the ``codesdk`` command before its supervisor runs (``Headstart``), a
runtime's program launched by the worker before its task runs (``worker._ahead``). The standard library only: both
happen before the heavy imports.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Launch:
    """Everything the operating system is told when a program starts, and what it is sent first."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str
    #: Run as this uid / gid with exactly these supplementary groups (None: the starter's own).
    user: int | None = None
    group: int | None = None
    extra_groups: tuple[int, ...] | None = None
    #: Written to the program's stdin as soon as it starts, before anyone waits for it (Claude Code's and Codex's
    #: ``initialize``): a program started early has read it by the time it is adopted. Part of what must be equal.
    opening: bytes = b""

    def differences(self, other: Launch) -> list[str]:
        """Which parts of two launches differ: names only, never values (the environment holds credentials)."""
        parts = [name for name in ("argv", "cwd", "user", "group", "extra_groups", "opening")
                 if getattr(self, name) != getattr(other, name)]
        return parts + [f"env[{key}]" for key in sorted(set(self.env) | set(other.env))
                        if self.env.get(key) != other.env.get(key)]
