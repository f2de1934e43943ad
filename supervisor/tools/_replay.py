"""Replay safety: may a call identical to a completed one be answered from the store without running?

Only read-only tools: answering again returns what was read, and nothing changes. Writing or running
something again is a new effect in a world that may have moved on, so it needs a fresh policy decision.
"""

from __future__ import annotations

from typing import Any

from codesdk.protocol import ToolClass, ToolSpec, canonical_hash


def is_replay_safe(tool_spec: ToolSpec) -> bool:
    """True when a completed call with the same (tool_name, input_hash) may be answered from the store."""
    return tool_spec.tool_class is ToolClass.READ_ONLY


def input_hash(tool_input: Any) -> str:
    """``sha256:<hex>`` of the canonical JSON of a tool input (the ``input_hash`` of its identity)."""
    return canonical_hash(tool_input)
