"""Agent Client Protocol agents (Gemini CLI, OpenCode, Codex through codex-acp, ...): one generic adapter
(``AcpAdapter``) and one small profile per agent (``AgentProfile``: its program, environment, config files and
quirks).

``AcpAdapter`` is imported on first use, so that the profiles stay light (see ``worker.adapters``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._profile import AgentProfile

if TYPE_CHECKING:
    from ._adapter import AcpAdapter

__all__ = ["AcpAdapter", "AgentProfile", "agent_profiles"]


def agent_profiles() -> list[AgentProfile]:
    """One profile per ACP agent CodeSDK hosts (each is a runtime of its own name)."""
    from ._codex_acp import CodexAcpProfile
    from ._gemini import GeminiProfile
    from ._opencode import OpenCodeProfile

    return [GeminiProfile(), OpenCodeProfile(), CodexAcpProfile()]


def __getattr__(name: str) -> object:
    if name == "AcpAdapter":
        from ._adapter import AcpAdapter

        return AcpAdapter
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
