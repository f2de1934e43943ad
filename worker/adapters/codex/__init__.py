"""The Codex runtime: the pinned ``codex app-server`` (npm ``@openai/codex``, installed into ``runtimes/``) driven
over its JSON-RPC stdio protocol.

``CodexAdapter`` is imported on first use, so that ``_launch`` stays light (see ``worker.adapters``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._adapter import CodexAdapter

__all__ = ["CodexAdapter"]


def __getattr__(name: str) -> object:
    if name == "CodexAdapter":
        from ._adapter import CodexAdapter

        return CodexAdapter
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
