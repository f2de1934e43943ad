"""Shared vocabulary of the owned tools: context, limits, results, errors, and the tool definition.

A tool never raises for something the caller (a model) got wrong: it raises ``ToolError`` internally and
the registry turns that into an error ``ToolResult``, so a bad call costs one error message, not a task.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Generic, TypeVar

from pydantic import BaseModel, ConfigDict, JsonValue, field_validator

from codesdk.protocol import SandboxSummary, ToolClass, ToolSpec

PREVIEW_MAX_CHARS = 500


class ErrorCode(StrEnum):
    """Stable error codes in ``content["error"]["code"]`` so callers can branch without parsing text."""

    INVALID_INPUT = "invalid_input"
    UNKNOWN_TOOL = "unknown_tool"
    PATH_REFUSED = "path_refused"
    NOT_FOUND = "not_found"
    ALREADY_EXISTS = "already_exists"
    NOT_A_FILE = "not_a_file"
    NOT_A_DIRECTORY = "not_a_directory"
    NOT_TEXT = "not_text"
    TOO_LARGE = "too_large"
    PATCH_INVALID = "patch_invalid"
    PATCH_MISMATCH = "patch_mismatch"
    COMMAND_REFUSED = "command_refused"
    SANDBOX_UNAVAILABLE = "sandbox_unavailable"
    IO_ERROR = "io_error"
    EGRESS_REFUSED = "egress_refused"  # http.fetch: the egress policy forbids that URL, address or method
    NETWORK_ERROR = "network_error"  # http.fetch: the remote, or the way to it, failed
    TIMEOUT = "timeout"  # http.fetch: no complete answer in time
    DISK_FULL = "disk_full"  # the namespace's disk quota (or the workspace's file system) is full
    INTERNAL = "internal_error"


class ToolError(Exception):
    """A failure the caller caused or can act on; becomes an error result with ``code`` and message."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def clip(text: str, limit: int = PREVIEW_MAX_CHARS) -> str:
    """Shorten ``text`` to ``limit`` characters, marking the cut with an ellipsis."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass(frozen=True)
class ToolLimits:
    """How much one call may read, write, list or run. Per call, so a session can tighten them."""

    read_max_bytes: int = 256 * 1024
    write_max_bytes: int = 8 * 1024 * 1024
    patch_max_bytes: int = 8 * 1024 * 1024
    list_max_entries: int = 1000
    exec_timeout_s: float = 60.0
    exec_memory_mb: int = 1024
    exec_output_max_bytes: int = 64 * 1024
    fetch_timeout_s: float = 30.0
    fetch_max_bytes: int = 1024 * 1024


@dataclass(frozen=True)
class ToolContext:
    """Where a call runs: the session workspace (every path is relative to it) and the limits."""

    workspace: Path
    limits: ToolLimits = field(default_factory=ToolLimits)
    #: The namespace the call is made for: ``workspace.exec`` runs in its resource group (None: in none).
    namespace: str | None = None
    #: Stores a blob the call's result names (``http.fetch``'s body) in the task's session; returns its ref.
    #: None where there is no store (the tool then returns no ref).
    put_blob: Callable[[bytes, str], Awaitable[str]] | None = None


class ToolResult(BaseModel):
    """What a tool call produced. ``content`` goes back to the runtime; the rest feeds events/audit."""

    model_config = ConfigDict(frozen=True, defer_build=True)  # its JsonValue schema is costly: built on first use

    content: JsonValue
    is_error: bool = False
    preview: str = ""
    sandbox: SandboxSummary = SandboxSummary()
    execution_env: str = "supervisor:workspace"
    stdout: str | None = None
    stderr: str | None = None
    #: A blob the tool stored through ``ToolContext.put_blob`` (``http.fetch``'s body): named by the call's
    #: ``tool.call.completed`` so the session's readers may download it.
    output_ref: str | None = None

    @field_validator("preview")
    @classmethod
    def _short_preview(cls, value: str) -> str:
        return clip(value)

    @classmethod
    def error(
        cls,
        code: ErrorCode,
        message: str,
        *,
        sandbox: SandboxSummary | None = None,
        execution_env: str = "supervisor:workspace",
        details: JsonValue = None,
    ) -> ToolResult:
        body: dict[str, JsonValue] = {"code": code.value, "message": message}
        if details is not None:
            body["details"] = details
        return cls(
            content={"error": body},
            is_error=True,
            preview=f"error ({code.value}): {message}",
            sandbox=sandbox or SandboxSummary(),
            execution_env=execution_env,
        )


def workspace_sandbox(ctx: ToolContext) -> SandboxSummary:
    """The sandbox summary of an in-process file tool: confined to the workspace, no network."""
    return SandboxSummary(kind="workspace", network=False, workspace=str(ctx.workspace))


InputT = TypeVar("InputT", bound=BaseModel)

ToolRunner = Callable[[InputT, ToolContext], Awaitable[ToolResult]]


class ToolInput(BaseModel):
    """Base of tool input models: unknown fields are errors (a misspelt argument must not be ignored)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True)
class Tool(Generic[InputT]):
    """One owned tool: its contract (name, description, input model, class) and its implementation."""

    name: str
    description: str
    input_model: type[InputT]
    tool_class: ToolClass
    run: ToolRunner[InputT]
    execution_env: str = "supervisor:workspace"  # reported on results that carry none of their own
    sandbox_kind: str = "workspace"

    def refusal_sandbox(self, ctx: ToolContext) -> SandboxSummary:
        """The sandbox summary for an error raised before or instead of running."""
        return SandboxSummary(kind=self.sandbox_kind, network=False, workspace=str(ctx.workspace))

    def spec(self) -> ToolSpec:
        return ToolSpec(
            name=self.name,
            description=self.description,
            input_schema=self.input_model.model_json_schema(),
            tool_class=self.tool_class,
        )
