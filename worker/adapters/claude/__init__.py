"""The Claude Code runtime: the pinned CLI (bundled in the ``claude-agent-sdk`` wheel) driven directly over its
stream-json control protocol; the SDK itself is never imported."""

from ._adapter import ClaudeAdapter

__all__ = ["ClaudeAdapter"]
