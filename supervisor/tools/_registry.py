"""The registry of owned tools: which are enabled, their manifest, and the one entry point to run them.

``execute`` never raises for a bad call: unknown tool, invalid input, a refused path, a failed command all
come back as an error ``ToolResult``. Only cancellation propagates.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from codesdk.procs.children import Children
from codesdk.protocol import ToolManifest, ToolSpec, canonical_hash

from ..groups import ResourceGroups
from ._base import ErrorCode, Tool, ToolContext, ToolError, ToolResult
from ._exec import ExecPolicy, make_exec_tool
from ._fetch import FETCH_TOOL_NAME, FetchPolicy, make_fetch_tool
from ._files import LIST_TOOL, READ_TOOL, WRITE_TOOL
from ._grants import PATH_FIELDS
from ._patch import PATCH_TOOL
from ._paths import lexical_refusal
from ._sandbox import SandboxProber

log = logging.getLogger(__name__)

EXEC_TOOL_NAME = "workspace.exec"


@dataclass(frozen=True)
class ToolsConfig:
    """Operator configuration: ``exec`` and ``fetch`` are off unless enabled there; ``disabled`` turns off others by
    name."""

    exec: ExecPolicy = field(default_factory=ExecPolicy)
    fetch: FetchPolicy = field(default_factory=FetchPolicy)
    disabled: frozenset[str] = frozenset()


def _validation_message(exc: ValidationError) -> tuple[str, list[Any]]:
    details = [
        {
            "loc": ".".join(str(part) for part in error["loc"]) or "<input>",
            "msg": error["msg"],
            "type": error["type"],
        }
        for error in exc.errors(include_url=False)
    ]
    text = "; ".join(f"{item['loc']}: {item['msg']}" for item in details)
    return f"invalid input: {text}", details


class ToolRegistry:
    """The tools of one configuration. Build once per supervisor (or per session if configs differ)."""

    def __init__(self, config: ToolsConfig | None = None, *, prober: SandboxProber | None = None,
                 children: Children | None = None, groups: ResourceGroups | None = None) -> None:
        """``children``: the registry of this process's children, where the commands it runs are owned (see
        ``ExecTool``); ``groups``: the namespaces' resource groups exec calls run in."""
        self.config = config or ToolsConfig()
        every: list[Tool[Any]] = [READ_TOOL, WRITE_TOOL, PATCH_TOOL, LIST_TOOL]
        if self.config.exec.enabled:
            every.append(make_exec_tool(self.config.exec, prober, children, groups))
        if self.config.fetch.enabled:
            every.append(make_fetch_tool(self.config.fetch))
        self._tools: dict[str, Tool[Any]] = {
            tool.name: tool for tool in every if tool.name not in self.config.disabled
        }
        self._manifest = ToolManifest(tools=tuple(tool.spec() for tool in self._tools.values()))
        # The manifest is frozen and fixed for the registry's life, so its hash is too: computed once here rather
        # than on every tool call's policy decision (canonicalizing it costs about 0.27 ms).
        self._manifest_hash = canonical_hash(self._manifest)

    @property
    def tools(self) -> Mapping[str, Tool[Any]]:
        return dict(self._tools)

    def manifest(self) -> ToolManifest:
        """The enabled tools, as offered to a runtime."""
        return self._manifest

    def manifest_hash(self) -> str:
        """Canonical hash of the manifest: names the exact tool set a policy decision was made against."""
        return self._manifest_hash

    def spec(self, name: str) -> ToolSpec | None:
        return self._manifest.get(name)

    @property
    def unattended_network(self) -> bool:
        """The operator lets ``yolo`` tasks run network tools unasked (``--allow-fetch-unattended``)."""
        return self.config.fetch.enabled and self.config.fetch.unattended

    def input_problems(self, name: str, input: Any) -> list[dict[str, Any]]:
        """What is wrong with ``input`` for tool ``name`` (``loc``/``msg``/``type`` each; empty: valid), checked
        as ``execute`` would — for an input an approver edits, refused before the call is allowed."""
        tool = self._tools.get(name)
        if tool is None:
            return [{"loc": "<tool>", "msg": f"tool {name!r} is not enabled", "type": "unknown_tool"}]
        try:
            tool.input_model.model_validate(input)
        except ValidationError as exc:
            return _validation_message(exc)[1]
        for name_of_path in PATH_FIELDS.get(name, ()):  # what confinement would refuse whatever the workspace holds
            given = input.get(name_of_path)
            if isinstance(given, str) and (why := lexical_refusal(given)) is not None:
                return [{"loc": name_of_path, "msg": f"path {given!r} refused: {why}", "type": "path_refused"}]
        return []

    async def execute(self, name: str, input: Any, ctx: ToolContext) -> ToolResult:
        """Validate ``input`` against the tool's model and run it; every failure is an error result."""
        tool = self._tools.get(name)
        if tool is None:
            why = {
                EXEC_TOOL_NAME: "is disabled (the operator enables it with --allow-exec)",
                FETCH_TOOL_NAME: "is disabled (the operator enables it with --allow-fetch)",
            }.get(name, "is not enabled")
            known = ", ".join(self._tools) or "none"
            return ToolResult.error(ErrorCode.UNKNOWN_TOOL, f"tool {name!r} {why}; available: {known}")
        sandbox, env = tool.refusal_sandbox(ctx), tool.execution_env
        try:
            args = tool.input_model.model_validate(input)
        except ValidationError as exc:
            message, details = _validation_message(exc)
            return ToolResult.error(
                ErrorCode.INVALID_INPUT,
                f"{name}: {message}",
                details=details,
                sandbox=sandbox,
                execution_env=env,
            )
        try:
            return await tool.run(args, ctx)
        except ToolError as exc:
            return ToolResult.error(exc.code, exc.message, sandbox=sandbox, execution_env=env)
        except OSError as exc:
            message = f"{name}: {exc.strerror or exc}"
            return ToolResult.error(ErrorCode.IO_ERROR, message, sandbox=sandbox, execution_env=env)
        except Exception as exc:  # a bug in a tool must not take the task down with it
            log.exception("tool %s failed unexpectedly", name)
            message = f"{name} failed unexpectedly: {type(exc).__name__}: {exc}"
            return ToolResult.error(ErrorCode.INTERNAL, message, sandbox=sandbox, execution_env=env)
