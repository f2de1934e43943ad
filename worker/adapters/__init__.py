"""Runtime adapters the worker can host."""

from pathlib import Path

from .base import AdapterRegistry, RuntimeAdapter, StartTaskRefused, TaskHandle, TaskIO, TaskOutcome
from .claude import ClaudeAdapter
from .scripted import ScriptedAdapter

__all__ = ["AdapterRegistry", "RuntimeAdapter", "ScriptedAdapter", "StartTaskRefused", "TaskHandle", "TaskIO",
           "TaskOutcome", "default_registry"]


def default_registry(scenario_dir: Path | None = None) -> AdapterRegistry:
    registry = AdapterRegistry()
    registry.add(ScriptedAdapter(scenario_dir))
    registry.add(ClaudeAdapter())
    return registry
