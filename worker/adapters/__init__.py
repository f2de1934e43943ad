"""Runtime adapters the worker can host.

Names are imported on first use (module ``__getattr__``): a light submodule (``claude._launch``, used before the
worker's heavy imports) must be importable without the protocol's models that the adapters themselves need.
"""

from __future__ import annotations

from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._process import RuntimeAhead
    from .acp import AcpAdapter
    from .base import AdapterRegistry, RuntimeAdapter, StartTaskRefused, TaskHandle, TaskIO, TaskOutcome
    from .claude import ClaudeAdapter
    from .codex import CodexAdapter
    from .scripted._adapter import ScriptedAdapter

__all__ = ["AcpAdapter", "AdapterRegistry", "ClaudeAdapter", "CodexAdapter", "RuntimeAdapter", "ScriptedAdapter", "StartTaskRefused", "TaskHandle",
           "TaskIO", "TaskOutcome", "default_registry"]

_HOMES = {"AcpAdapter": ".acp", "AdapterRegistry": ".base", "RuntimeAdapter": ".base", "StartTaskRefused": ".base", "TaskHandle": ".base",
          "TaskIO": ".base", "TaskOutcome": ".base", "ClaudeAdapter": ".claude", "CodexAdapter": ".codex",
          "ScriptedAdapter": ".scripted"}


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(home, __name__), name)


def default_registry(scenario_dir: Path | None = None, ahead: RuntimeAhead | None = None) -> AdapterRegistry:
    """Every adapter; ``ahead``: a runtime's program started ahead of the first task, for its adapter to adopt."""
    from .acp import AcpAdapter, agent_profiles
    from .base import AdapterRegistry
    from .claude import ClaudeAdapter
    from .codex import CodexAdapter
    from .scripted._adapter import ScriptedAdapter

    registry = AdapterRegistry()
    registry.add(ScriptedAdapter(scenario_dir))
    registry.add(ClaudeAdapter(ahead if ahead is not None and ahead.runtime == ClaudeAdapter.name else None))
    registry.add(CodexAdapter(ahead if ahead is not None and ahead.runtime == CodexAdapter.name else None))
    for profile in agent_profiles():
        registry.add(AcpAdapter(profile))
    return registry
