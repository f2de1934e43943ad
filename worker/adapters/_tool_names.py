"""CodeSDK's tool names as model APIs take them, for every adapter whose runtime passes our tools to its model under
names of its own (Codex's dynamic tools, ACP agents' MCP tools): function names there are ``[a-zA-Z0-9_-]``, at
most 64 characters, and CodeSDK's may hold dots."""

from __future__ import annotations

import re

from codesdk.protocol import ToolSpec

_NOT_ALLOWED = re.compile(r"[^a-zA-Z0-9_-]")
#: The longest function name the model APIs take, with whatever prefix the runtime puts before ours.
MAX_NAME = 64


def model_tool_names(tools: tuple[ToolSpec, ...], prefix: str = "") -> dict[str, ToolSpec]:
    """Each tool under a name the model can be offered (``workspace.read`` → ``workspace_read``): unique, and short
    enough once the runtime has put ``prefix`` before it."""
    names: dict[str, ToolSpec] = {}
    room = MAX_NAME - len(prefix)
    for spec in tools:
        base = _NOT_ALLOWED.sub("_", spec.name)[:room]
        name, n = base, 1
        while name in names:
            n += 1
            name = f"{base[:room - len(str(n)) - 1]}_{n}"
        names[name] = spec
    return names
