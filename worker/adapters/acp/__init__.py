"""Agent Client Protocol agents (Gemini CLI, OpenCode, Codex through codex-acp, ...): one generic adapter
(``AcpAdapter``) and one small profile per agent (``AgentProfile``: its program, environment, config files and
quirks)."""

from __future__ import annotations

from ._adapter import AcpAdapter
from ._codex_acp import CodexAcpProfile
from ._gemini import GeminiProfile
from ._opencode import OpenCodeProfile
from ._profile import AgentProfile

__all__ = ["AcpAdapter", "AgentProfile", "agent_profiles"]


def agent_profiles() -> list[AgentProfile]:
    """One profile per ACP agent CodeSDK hosts (each is a runtime of its own name)."""
    return [GeminiProfile(), OpenCodeProfile(), CodexAcpProfile()]
