"""Risk classes for tools a runtime runs itself (its built-ins), so the same policy table decides them.

The supervisor never trusts a runtime's word for how risky its own tool is: names it knows are classed here,
anything else counts as dangerous.
"""

from __future__ import annotations

from codesdk.protocol import ToolClass, ToolSpec

_CLASSES: dict[str, ToolClass] = {
    # Claude Code
    "read": ToolClass.READ_ONLY, "glob": ToolClass.READ_ONLY, "grep": ToolClass.READ_ONLY, "ls": ToolClass.READ_ONLY,
    "notebookread": ToolClass.READ_ONLY, "todowrite": ToolClass.READ_ONLY,
    "write": ToolClass.WRITE, "edit": ToolClass.WRITE, "multiedit": ToolClass.WRITE,
    "notebookedit": ToolClass.WRITE,
    "bash": ToolClass.DANGEROUS, "webfetch": ToolClass.DANGEROUS, "websearch": ToolClass.DANGEROUS,
    "task": ToolClass.DANGEROUS, "agent": ToolClass.DANGEROUS,
    # generic names (scripted runtime, ACP agents' tool kinds)
    "read_file": ToolClass.READ_ONLY, "search": ToolClass.READ_ONLY, "fetch": ToolClass.DANGEROUS,
    "write_file": ToolClass.WRITE, "execute": ToolClass.DANGEROUS, "shell": ToolClass.DANGEROUS,
}


def runtime_tool_spec(name: str) -> ToolSpec:
    """The spec the policy uses for a runtime's own tool ``name`` (unknown names are dangerous)."""
    tool_class = _CLASSES.get(name.lower(), ToolClass.DANGEROUS)
    safe_name = "".join(c if c.isalnum() or c in "._-" else "_" for c in name)[:128] or "unnamed"
    return ToolSpec(name=safe_name, description=f"runtime built-in tool {name}", tool_class=tool_class)
