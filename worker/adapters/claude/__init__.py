"""The Claude Code runtime, driven through the pinned ``claude-agent-sdk`` (which bundles the CLI)."""

from ._adapter import ClaudeAdapter

__all__ = ["ClaudeAdapter"]
