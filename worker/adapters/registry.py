"""Every runtime this worker can host, each under its own name."""

from __future__ import annotations

from pathlib import Path

from .runtime_process import RuntimeAhead
from .acp import AcpAdapter, agent_profiles
from .base import AdapterRegistry
from .claude.adapter import ClaudeAdapter
from .codex.adapter import CodexAdapter
from .scripted import ScriptedAdapter


def default_registry(scenario_dir: Path | None = None, ahead: RuntimeAhead | None = None) -> AdapterRegistry:
    """Every adapter; ``ahead``: a runtime's program started ahead of the first task, for its adapter to adopt."""
    registry = AdapterRegistry()
    registry.add(ScriptedAdapter(scenario_dir))
    registry.add(ClaudeAdapter(ahead if ahead is not None and ahead.runtime == ClaudeAdapter.name else None))
    registry.add(CodexAdapter(ahead if ahead is not None and ahead.runtime == CodexAdapter.name else None))
    for profile in agent_profiles():
        registry.add(AcpAdapter(profile))
    return registry
