"""Tool manifest and tool-call identity: what a runtime may call, and how one call attempt is named."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import Field

from ._base import Model


class ToolClass(StrEnum):
    """Risk class that the permission policy keys on."""

    READ_ONLY = "read_only"
    WRITE = "write"
    DANGEROUS = "dangerous"
    #: Reaches the network from the supervisor's host (``http.fetch``): asks in every permission mode.
    NETWORK = "network"


class ToolSpec(Model):
    """One tool a runtime may call. ``input_schema`` is a JSON Schema object."""

    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.\-]+$")
    description: str = ""
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    tool_class: ToolClass = ToolClass.READ_ONLY


class ToolManifest(Model):
    """The tools offered to a runtime for one task (names unique)."""

    tools: tuple[ToolSpec, ...] = ()

    def get(self, name: str) -> ToolSpec | None:
        return next((tool for tool in self.tools if tool.name == name), None)

    def names(self) -> list[str]:
        return [tool.name for tool in self.tools]


class ExecutedBy(StrEnum):
    """Who runs a tool: the supervisor (owned tools) or the runtime itself (its built-ins)."""

    SUPERVISOR = "supervisor"
    RUNTIME = "runtime"


class ToolCallIdentity(Model):
    """Names one attempt of one tool call.

    ``tool_call_id`` is unique within a task; ``attempt`` grows when a runtime retries the same call;
    ``input_hash`` (canonical sha256 of the input) lets a replay be recognised as identical.
    """

    tool_call_id: str = Field(min_length=1, max_length=200)
    runtime_tool_call_id: str | None = None
    attempt: int = Field(default=1, ge=1)
    input_hash: str
