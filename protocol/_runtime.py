"""What a runtime adapter declares about itself, its auth state, and the environment it runs in."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import Field

from ._base import Model


class IsolationMode(StrEnum):
    """Where the runtime's agent loop runs relative to the worker."""

    IN_PROCESS = "in_process"  # inside the worker process (scripted; tests only for real runtimes)
    SUBPROCESS = "subprocess"  # a child process of the worker (CLI / SDK)
    SERVER_SIDE = "server_side"  # a long-lived server the worker talks to (opencode serve)


class IsolationLevel(StrEnum):
    SHARED = "shared"
    NAMESPACED = "namespaced"
    EPHEMERAL = "ephemeral"


class ToolRouting(StrEnum):
    """How supervisor-owned tools reach the runtime."""

    IN_BAND = "in_band"  # the adapter relays calls itself (scripted, SDK hooks, app-server dynamic tools)
    MCP = "mcp"  # through the `codesdk-worker mcp-bridge` stdio MCP server
    NONE = "none"


class PermissionMode(StrEnum):
    ASK = "ask"
    AUTO = "auto"
    YOLO = "yolo"


class InteractionMode(StrEnum):
    NON_INTERACTIVE = "non_interactive"
    INTERACTIVE = "interactive"


class CancellationSupport(StrEnum):
    COOPERATIVE = "cooperative"  # the runtime stops when asked
    KILL = "kill"  # only by ending its process


class RuntimeCapabilities(Model):
    """Everything the supervisor needs to know to drive a runtime without special cases."""

    name: str
    version: str
    isolation_modes: tuple[IsolationMode, ...] = (IsolationMode.SUBPROCESS,)
    requires_auth: bool = True
    auth_methods: tuple[str, ...] = ()
    streaming_text: bool = True
    streaming_thinking: bool = False
    streaming_tool_output: bool = False
    tool_calls: bool = True
    parallel_tool_calls: bool = False
    tool_routing: tuple[ToolRouting, ...] = (ToolRouting.MCP,)
    builtin_tools: tuple[str, ...] = ()
    builtin_tools_default_enabled: bool = False
    permission_prompts: bool = False
    permission_modes: tuple[PermissionMode, ...] = tuple(PermissionMode)
    interaction_modes: tuple[InteractionMode, ...] = (InteractionMode.NON_INTERACTIVE,)
    session_create: bool = False
    session_resume: bool = False
    session_fork: bool = False
    transcript_input: bool = True  # accepts prior messages in startTask (else only resume)
    #: Tokens of context its default model takes (None: unknown, no budget unless a task sets one).
    context_window_tokens: int | None = Field(default=None, ge=1)
    cancellation: CancellationSupport = CancellationSupport.COOPERATIVE
    usage_reporting: bool = True
    cost_reporting: bool = False
    models: tuple[str, ...] = ()
    default_model: str | None = None
    max_concurrent_tasks: int | None = Field(default=None, ge=1)


class AuthState(StrEnum):
    AUTHENTICATED = "authenticated"
    UNAUTHENTICATED = "unauthenticated"
    NOT_REQUIRED = "not_required"
    EXPIRED = "expired"
    UNKNOWN = "unknown"
    ERROR = "error"


class AuthStatus(Model):
    """A runtime's login state in one namespace. Never carries a secret, only hints about it."""

    runtime: str
    state: AuthState
    method: str | None = None  # api_key | oauth | none
    account_hint: str | None = None  # e.g. a masked e-mail, never a token
    expires_at: datetime | None = None
    message: str = ""
    checked_at: datetime | None = None


class RuntimeEnv(Model):
    """The environment a worker runs in. The *safe view* sent on the wire names variables, never values."""

    namespace: str
    isolation: IsolationLevel = IsolationLevel.NAMESPACED
    mode: IsolationMode = IsolationMode.SUBPROCESS
    home: str
    xdg_config_home: str | None = None
    xdg_state_home: str | None = None
    xdg_cache_home: str | None = None
    xdg_data_home: str | None = None
    tmpdir: str | None = None
    path: str | None = None
    variable_names: tuple[str, ...] = ()
