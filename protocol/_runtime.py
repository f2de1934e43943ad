"""What a runtime adapter declares about itself, its auth state, and the environment it runs in."""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from enum import StrEnum

from pydantic import Field

from ._base import Model
from ._steering import SteeringSupport
from ._questions import QuestionSource
from ._budgets import BudgetGate
from ._grants import GrantScope

#: What a runtime may be called: the names adapters register (``scripted``, ``claude``, ``codex``, ``codex-acp``,
#: ``gemini``, ``opencode``), and so all a session or a task may name. One rule, so that the API (which refuses a
#: request) and the engine (which refuses a session or a task) never disagree about a name.
RUNTIME_NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,63}$"
#: ``RUNTIME_NAME_PATTERN`` in words, for refusals (a regular expression is no answer to a user).
RUNTIME_NAME_RULE = "lowercase letters, digits, '.', '_' and '-' (at most 64, the first a letter or a digit)"
_RUNTIME_NAME = re.compile(RUNTIME_NAME_PATTERN)


def is_runtime_name(name: object) -> bool:
    """Whether ``name`` may name a runtime (``RUNTIME_NAME_PATTERN``)."""
    return isinstance(name, str) and _RUNTIME_NAME.fullmatch(name) is not None


def check_runtime_name(name: str) -> str:
    """``name``, if it may name a runtime; else ``ValueError`` saying what a runtime's name may hold."""
    if not is_runtime_name(name):
        raise ValueError(f"not a runtime name: {name[:100]!r} (a runtime's name is {RUNTIME_NAME_RULE})")
    return name


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


class AuthModel(StrEnum):
    """How the runtime is logged in: a local OAuth login (a cache in its HOME), an API key, either, or none."""

    OAUTH_LOCAL = "oauth_local"
    API_KEY = "api_key"
    BOTH = "both"
    NONE = "none"
    UNKNOWN = "unknown"


class ToolExecution(StrEnum):
    """Where a task's tool calls run."""

    EXTERNAL = "external_mcp"  # all in the supervisor (reached by MCP or the adapter's in-band relay)
    RUNTIME_INTERNAL = "runtime_internal"  # in the runtime itself
    HYBRID = "hybrid"  # the supervisor's, and built-ins of the runtime an operator may enable


class PermissionModel(StrEnum):
    """Who decides whether a call may run."""

    CODESDK = "codesdk"  # the supervisor's policy decides every call (the runtime's own prompts are sent to it)
    RUNTIME = "runtime"
    HYBRID = "hybrid"


class StateModel(StrEnum):
    """Where the runtime keeps a conversation between tasks."""

    IN_PROCESS = "in_process"
    LOCAL_DISK = "local_disk"  # files under its HOME (the namespace's, or the session's)
    SERVER_SIDE = "server_side"
    HYBRID = "hybrid"
    UNKNOWN = "unknown"


class ResumeModel(StrEnum):
    """How a session's next task continues its conversation."""

    NATIVE = "native"  # the runtime takes its own session up again (while its state is there; else reconstruct)
    RECONSTRUCT = "reconstruct"  # the runtime is given the transcript, always
    NONE = "none"


class ReplaySafety(StrEnum):
    """What a tool call sent again (a runtime retrying after a crash or a resume) needs."""

    SAFE_REPLAY = "safe_replay"  # answered from the store by its identity: it never runs twice
    REQUIRES_REAPPROVAL = "requires_reapproval"  # some calls (a runtime's built-ins) are decided again
    UNKNOWN = "unknown"


class McpSupport(StrEnum):
    """What the runtime is in MCP's terms."""

    NONE = "none"
    CLIENT_ONLY = "client_only"  # it uses MCP servers it is given
    SERVER_ONLY = "server_only"
    BOTH = "both"


class McpTransport(StrEnum):
    STDIO = "stdio"
    SSE = "sse"
    HTTP = "http"  # streamable HTTP


class CancellationModel(StrEnum):
    """What the runtime's own cancel promises (the supervisor ends the process tree after a grace either way)."""

    BEST_EFFORT = "best_effort"  # it is asked to stop; a tool or request under way may finish first
    GUARANTEED = "guaranteed"  # nothing of the task runs once the cancel returns
    UNKNOWN = "unknown"


class RuntimeCapabilities(Model):
    """Everything the supervisor needs to know to drive a runtime without special cases, and what an app needs to
    know to feature-detect without guessing (the "models" below: docs/protocol.md, "Capabilities")."""

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
    #: The ``runtime_config`` keys a task may give it (None: not declared; the runtime checks them as a task starts).
    config_keys: tuple[str, ...] | None = None
    #: Keys whose string value is one of a closed set, with that set (the scripted runtime's ``scenario``).
    config_choices: dict[str, tuple[str, ...]] = Field(default_factory=dict)
    #: What the runtime has but does not offer here, and why (a predicate: "is a test instrument, off on …"): a key
    #: (``"scenario_inline"``) or one value of a choice (``"scenario=hang"``). A refusal of it says why, not "unknown".
    config_withheld: dict[str, str] = Field(default_factory=dict)
    auth_model: AuthModel = AuthModel.UNKNOWN
    tool_execution: ToolExecution = ToolExecution.EXTERNAL
    #: The grant scopes the runtime itself is told of and honours for its own tools (``once`` always; e.g. Codex's
    #: accept-for-session is ``session``). The supervisor enforces every scope for the calls it decides anyway.
    approval_scopes: tuple[GrantScope, ...] = (GrantScope.ONCE,)
    permission_model: PermissionModel = PermissionModel.CODESDK
    state_model: StateModel = StateModel.UNKNOWN
    resume_model: ResumeModel = ResumeModel.RECONSTRUCT
    tool_replay: ReplaySafety = ReplaySafety.UNKNOWN
    mcp_support: McpSupport = McpSupport.NONE
    #: The MCP transports it can take a server by (CodeSDK's own tools come by ``stdio``: the mcp-bridge).
    mcp_transports: tuple[McpTransport, ...] = ()
    cancellation_model: CancellationModel = CancellationModel.UNKNOWN
    #: The isolation level a host should run it at (``namespaced``: a HOME per credential namespace).
    recommended_isolation: IsolationLevel = IsolationLevel.NAMESPACED
    #: The most tool calls of one task it has waiting at once (None: no fixed bound; 1: one at a time).
    max_outstanding_tool_calls: int | None = Field(default=None, ge=1)
    #: It hands back files of its own (images, patches) as artifacts: none of today's adapters do.
    artifacts: bool = False
    #: A running task can be stopped (``runtime.stop``).
    stop: bool = True
    #: What it does with a user's input sent while a task runs (``runtime.sendInput``): takes it into the running
    #: turn, or keeps it for its next turn (the session's next task).
    steering: SteeringSupport = SteeringSupport.NEXT_TURN
    #: The questions to its user it forwards as ``question.requested`` (answered by ``runtime.sendAnswer``), by
    #: source; empty: it asks none (its questions, if any, are declined or never asked).
    user_questions: tuple[QuestionSource, ...] = ()
    #: Where the supervisor can check a task's budget: before each model request (``before_request``: the
    #: runtime's next request waits on the supervisor and its usage so far is known) or only once usage is reported
    #: (``after_usage``). See docs/sessions.md, "Budgets".
    budget_gate: BudgetGate = BudgetGate.AFTER_USAGE

    @property
    def non_interactive(self) -> bool:
        """A task can run with nobody to ask (``interaction_mode: non_interactive``)."""
        return InteractionMode.NON_INTERACTIVE in self.interaction_modes


def capability_conflicts(capabilities: RuntimeCapabilities) -> list[str]:
    """What a runtime's declaration says against itself (an adapter's bug: the contract suite fails on any)."""
    c = capabilities
    found = []
    if c.resume_model == ResumeModel.NATIVE and not c.session_resume:
        found.append("resume_model is native but session_resume is false")
    if c.resume_model == ResumeModel.RECONSTRUCT and not c.transcript_input:
        found.append("resume_model is reconstruct but transcript_input is false")
    if c.mcp_support in (McpSupport.CLIENT_ONLY, McpSupport.BOTH) and not c.mcp_transports:
        found.append("it uses MCP servers but names no transport")
    if c.mcp_support == McpSupport.NONE and c.mcp_transports:
        found.append("it names MCP transports but supports no MCP")
    if ToolRouting.MCP in c.tool_routing and McpTransport.STDIO not in c.mcp_transports:
        found.append("its tools come through the stdio mcp-bridge, but stdio is not among its MCP transports")
    if c.tool_execution == ToolExecution.HYBRID and not c.builtin_tools:
        found.append("tool_execution is hybrid but it names no built-in tools")
    if c.tool_execution == ToolExecution.EXTERNAL and c.builtin_tools_default_enabled:
        found.append("tool_execution is external_mcp but its built-in tools are on by default")
    if c.max_outstanding_tool_calls is not None and c.max_outstanding_tool_calls > 1 and not c.parallel_tool_calls:
        found.append("more than one outstanding tool call, but parallel_tool_calls is false")
    if c.parallel_tool_calls and c.max_outstanding_tool_calls == 1:
        found.append("parallel_tool_calls, but at most one outstanding tool call")
    if c.auth_model == AuthModel.NONE and c.requires_auth:
        found.append("auth_model is none but requires_auth is true")
    if c.tool_replay == ReplaySafety.SAFE_REPLAY and c.tool_execution != ToolExecution.EXTERNAL:
        found.append("safe_replay, but some of its calls run inside the runtime")
    return found


class McpRoute(Model):
    """One row of the MCP transport matrix: the transports a runtime can take an MCP server by, the one CodeSDK's
    tools reach it by (None: they do not come by MCP), and why."""

    runtime: str
    supports: tuple[McpTransport, ...]
    chosen: McpTransport | None
    why: str


def mcp_route(runtime: str, capabilities: RuntimeCapabilities) -> McpRoute:
    """How CodeSDK's tools reach ``runtime``, read from what it declares (support bundles' transport matrix)."""
    c = capabilities
    others = ", ".join(t for t in c.mcp_transports if t != McpTransport.STDIO)
    if ToolRouting.MCP in c.tool_routing and McpTransport.STDIO in c.mcp_transports:
        why = ("CodeSDK's tools come from its own MCP server (`codesdk-worker mcp-bridge`), the runtime's child on "
               "stdio: no port is opened and nothing outside the worker can reach it")
        return McpRoute(runtime=runtime, supports=c.mcp_transports, chosen=McpTransport.STDIO,
                        why=why + (f"; {others} not used: any other MCP server is turned off" if others else ""))
    if ToolRouting.MCP in c.tool_routing:
        return McpRoute(runtime=runtime, supports=c.mcp_transports, chosen=None,
                        why="its tools would come through the stdio mcp-bridge, but it declares no stdio transport: "
                            "no transport both sides speak")
    if ToolRouting.IN_BAND in c.tool_routing:
        why = "CodeSDK's tools reach it in band (its adapter relays each call): no MCP server is given to it"
        return McpRoute(runtime=runtime, supports=c.mcp_transports, chosen=None,
                        why=why + ("; its own MCP client is left without servers" if c.mcp_transports else ""))
    return McpRoute(runtime=runtime, supports=c.mcp_transports, chosen=None, why="it takes no tools")


def config_refusal(capabilities: RuntimeCapabilities, runtime_config: Mapping[str, object]) -> str | None:
    """Why a task's ``runtime_config`` cannot go to this runtime, as a sentence — said before anything is stored —
    or None. Only what the offer declares is checked here; the runtime checks the values when the task starts."""
    name = capabilities.name
    if capabilities.config_keys is not None:
        unknown = sorted(set(runtime_config) - set(capabilities.config_keys))
        for key in unknown:
            if key in capabilities.config_withheld:
                return f"runtime_config.{key} {capabilities.config_withheld[key]}"
        if unknown:
            return (f"runtime_config has {'a key' if len(unknown) == 1 else 'keys'} {name} does not take: "
                    f"{', '.join(map(repr, unknown))} (it takes: {', '.join(capabilities.config_keys) or 'none'})")
    for key, choices in sorted(capabilities.config_choices.items()):
        value = runtime_config.get(key)
        if isinstance(value, str) and value not in choices:
            if (why := capabilities.config_withheld.get(f"{key}={value}")) is not None:
                return f"runtime_config.{key} {value!r} {why}"
            return (f"runtime_config.{key} {value!r} is not one {name} has (it has: "
                    f"{', '.join(sorted(choices)) or 'none'})")
    return None


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
