"""The Claude Code runtime: the pinned CLI (bundled in the ``claude-agent-sdk`` wheel) driven directly over its
stream-json control protocol; the SDK itself is never imported.

``ClaudeAdapter`` is imported on first use, so that ``_launch`` stays light (see ``worker.adapters``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._adapter import ClaudeAdapter

__all__ = ["ClaudeAdapter"]


def __getattr__(name: str) -> object:
    if name == "ClaudeAdapter":
        from ._adapter import ClaudeAdapter

        return ClaudeAdapter
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
