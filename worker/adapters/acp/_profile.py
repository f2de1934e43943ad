"""What differs between Agent Client Protocol agents, as one ``AgentProfile`` per agent; everything else (the ACP
conversation, tool calls through CodeSDK's MCP bridge, events, stop) is the generic adapter's.

A profile says where the pinned program is and how it starts (command line, environment, the config files it reads
under the namespace HOME), which of its settings a task may choose, how it names CodeSDK's MCP tools, what in a
workspace would make it load tenant-controlled configuration, how its errors carry an HTTP status, and how a session
is taken up again by the next task. The standard library only: a launch may be composed before the worker's heavy
imports.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from codesdk.procs.launch import Launch
from .._grace import BadGrace, stop_grace
from .._installed import install_hint, node_modules
from .._namespace_home import namespace_of

#: What a model name may be: it reaches the agent's command line or config, so never an option or odd characters.
_MODEL_NAME = re.compile(r"[A-Za-z0-9_.:/@+][A-Za-z0-9_.:/@+-]{0,199}")
#: The name CodeSDK's MCP server has in every session: agents prefix our tools with it (``mcp_codesdk_…``).
MCP_SERVER_NAME = "codesdk"
#: Seconds the agent gets to end its turn by itself after ``session/cancel`` before its process group is ended.
DEFAULT_STOP_GRACE_S = 5.0


#: The ``runtime_config`` keys an ACP agent's task takes (``AgentProfile.config_keys``: its offer declares them).
ACP_CONFIG_KEYS = ("model", "max_retries", "stop_grace_s", "builtin_tools")


class BadAcpConfig(ValueError):
    """The task's ``runtime_config`` cannot be used (the caller's mistake); the message says which key and why."""


class UnsafeWorkspace(ValueError):
    """The workspace holds configuration the agent would load and obey (settings, plugins, an env file): a tenant
    could run code or lift the policy through it. The message names the entry and what to do."""


@dataclass(frozen=True)
class AcpSettings:
    """What a task's ``runtime_config`` asks of an ACP agent, checked."""

    model: str | None = None  # None: the agent's own default
    max_retries: int | None = None  # failed model requests the agent may retry (None: the profile's default)
    stop_grace_s: float = DEFAULT_STOP_GRACE_S


@dataclass(frozen=True)
class Credentials:
    """Whether the namespace can use the agent: ``method`` (api_key, oauth_local) or None, a sentence why, and how an
    operator gives the namespace (other) credentials."""

    method: str | None
    message: str
    how_to_configure: str = ""


class AgentProfile(ABC):
    #: The runtime's name in CodeSDK (``runtime: "gemini"``).
    name: str
    #: How messages call it.
    title: str
    #: The npm package ``runtimes/package.json`` pins, and its version (a test holds the two equal).
    package: str
    version: str
    #: Tokens of context of the agent's default model (None: the operator chooses the model; unknown).
    context_window_tokens: int | None = None
    #: It asks for a turn's tool calls together, several waiting at once (else one at a time: each is answered
    #: before it asks for the next; the contract suite holds either).
    parallel_tool_calls: bool = True
    #: Bound on each answer before the turn runs (start-up, ``initialize``, ``session/new``).
    handshake_timeout_s: float = 60.0
    #: After the turn, stdin is closed and the agent gets this long to exit by itself before SIGTERM.
    exit_grace_s: float = 2.0
    #: Retries of a failed model request when the task does not say (None: the agent cannot be told).
    default_max_retries: int | None = 2
    #: Workspace entries that would make the agent load tenant-written configuration (refused).
    unsafe_workspace_entries: tuple[str, ...] = ()
    #: Files the agent reads from the workspace's top as instructions for its model: each must be a plain file (a
    #: link would have it send the model whatever the link points at: the worker's environment, another file).
    context_files: tuple[str, ...] = ()
    #: (variable, why): an agent that keeps a tool of its own CodeSDK can neither switch off nor put before the
    #: supervisor runs in a namespace only once the operator has set ``variable=1`` in its environment (an admin's
    #: act: tenants cannot set namespace variables); ``why`` says what the operator accepts by it.
    opt_in: tuple[str, str] | None = None

    @abstractmethod
    def program(self, environ: Mapping[str, str]) -> list[str] | None:
        """The command that runs the pinned agent (before its ACP arguments), or None when it is not installed."""

    @abstractmethod
    def missing_reason(self, environ: Mapping[str, str]) -> str:
        """Why ``program`` is None, and what the operator can do about it."""

    @abstractmethod
    def installed_version(self, environ: Mapping[str, str]) -> str:
        """The installed version, read from its package files (no process started); "" if not installed."""

    @abstractmethod
    def launch(self, program: list[str], settings: AcpSettings, *, cwd: str,
               environ: Mapping[str, str]) -> Launch:
        """The agent's ACP server on stdio for one task (``prepare`` has run)."""

    @abstractmethod
    def prepare(self, settings: AcpSettings, environ: Mapping[str, str]) -> None:
        """Write the config files the agent reads under the namespace HOME, before it starts."""

    @abstractmethod
    def credentials(self, environ: Mapping[str, str]) -> Credentials: ...

    @abstractmethod
    def tool_prefix(self) -> str:
        """How the agent prefixes CodeSDK's MCP tools in its own tool names (``mcp_codesdk_``)."""

    @abstractmethod
    def implicit_sources(self, environ: Mapping[str, str], cwd: Path) -> dict[str, Any]:
        """What the agent loads on its own, and what CodeSDK does with each (recorded with the task)."""

    @property
    def config_keys(self) -> tuple[str, ...]:
        """What a task may give this agent: ``max_retries`` only where its retries can be set."""
        return tuple(k for k in ACP_CONFIG_KEYS if k != "max_retries" or self.default_max_retries is not None)

    def settings(self, config: Mapping[str, object]) -> AcpSettings:
        unknown = sorted(set(config) - set(ACP_CONFIG_KEYS))
        if unknown:
            raise BadAcpConfig(f"runtime_config has keys {self.title} does not take: {', '.join(unknown)} "
                               "(known: model, max_retries, stop_grace_s)")
        if config.get("builtin_tools"):
            raise BadAcpConfig(f"runtime_config.builtin_tools: {self.title}'s built-in tools stay off under CodeSDK; "
                               "its tools are CodeSDK's, decided and run by the supervisor")
        model = config.get("model")
        if model is not None and (not isinstance(model, str) or not _MODEL_NAME.fullmatch(model)):
            raise BadAcpConfig("runtime_config.model must be a model name (letters, digits and . _ : / @ + -, not "
                               "starting with -)")
        retries = config.get("max_retries")
        if retries is not None:
            if not isinstance(retries, int) or isinstance(retries, bool) or not 0 <= retries <= 9:
                raise BadAcpConfig("runtime_config.max_retries must be a whole number from 0 to 9")
            if self.default_max_retries is None:
                raise BadAcpConfig(f"runtime_config.max_retries: {self.title} decides its retries itself")
        try:
            grace = stop_grace(config, DEFAULT_STOP_GRACE_S)
        except BadGrace as exc:
            raise BadAcpConfig(str(exc)) from None
        return AcpSettings(model=model, max_retries=retries, stop_grace_s=float(grace))

    def not_installed(self, environ: Mapping[str, str]) -> str:
        """The pinned agent is not in the runtimes directory: where it was looked for, and what to run."""
        return (f"{self.title} {self.version} is not installed in {node_modules(environ).parent}: "
                f"{install_hint(environ)}")

    def refusal(self, environ: Mapping[str, str]) -> str | None:
        """Why the agent may not run in this namespace (not installed, or not opted in), or None."""
        if self.program(environ) is None:
            return self.missing_reason(environ)
        if self.opt_in is not None and environ.get(self.opt_in[0]) != "1":
            variable, why = self.opt_in
            return (f"{self.title} is off until the operator sets {variable}=1 in this namespace's environment: "
                    f"{why}")
        return None

    def check_workspace(self, cwd: Path) -> None:
        """Refuse a workspace holding configuration the agent would obey (see ``UnsafeWorkspace``)."""
        for entry in self.unsafe_workspace_entries:
            if os.path.lexists(cwd / entry):
                raise UnsafeWorkspace(
                    f"the workspace holds {entry!r}, which {self.title} would load as its own configuration (it "
                    f"could start programs or lift CodeSDK's policy): remove it from {cwd} to run {self.name} there")
        for name in self.context_files:
            try:
                mode = os.lstat(cwd / name).st_mode
            except OSError:
                continue  # absent (or unreadable: the agent cannot read it either)
            if not stat.S_ISREG(mode):
                raise UnsafeWorkspace(
                    f"the workspace's {name!r} is not a plain file (a link or another kind of file): {self.title} "
                    f"reads it into its model's instructions, following links to whatever they point at; make it a "
                    f"plain file in {cwd}, or remove it, to run {self.name} there")

    def own_tool(self, tool_call: Mapping[str, Any], visible: Mapping[str, object]) -> str | None:
        """The CodeSDK tool (its name as the agent sees it, a key of ``visible``) an ACP ``toolCall`` is a call
        of, or None: one of the agent's own tools."""
        call_id, title = str(tool_call.get("toolCallId") or ""), str(tool_call.get("title") or "")
        for name in visible:
            full = self.tool_prefix() + name
            if title == full or call_id == full or call_id.startswith(full + "__"):
                return name
        return None

    def tool_arguments(self, tool_call: Mapping[str, Any]) -> dict[str, Any] | None:
        """A tool call's arguments as the agent shows them in an ACP ``toolCall``: ``rawInput``, else a JSON object
        as its first content text; None when it shows none (an empty ``rawInput`` is none: OpenCode sends it before
        the arguments)."""
        raw = tool_call.get("rawInput")
        if isinstance(raw, dict) and raw:
            return raw
        text = content_text(tool_call)
        with contextlib.suppress(ValueError):
            value = json.loads(text) if text else None
            if isinstance(value, dict):
                return value
        return None

    def http_status(self, code: int, message: str, data: Any) -> int | None:
        """The model API's HTTP status behind an error answer to ``session/prompt``, if the agent says it."""
        return code if 400 <= code <= 599 else None

    def api_base_url(self, settings: AcpSettings, environ: Mapping[str, str]) -> str | None:
        """The base URL of the model API the agent calls (named when a call fails), if known."""
        return None

    def session_never_stored(self, code: int, message: str, data: Any) -> bool:
        """Whether an error answer to ``session/resume`` or ``session/load`` means the agent never stored the
        session at all (every turn of it failed before an answer). Only what the warning says depends on it: any
        refusal gives the agent a new session with the session's transcript."""
        return False

    def stored_session(self, environ: Mapping[str, str], cwd: Path, session_id: str) -> bool | None:
        """Whether the agent still has the session in this namespace (to take it up again rather than send it the
        transcript); None: only the agent can tell, and it is asked."""
        return None

    def prepare_session_reuse(self, environ: Mapping[str, str], cwd: Path, session_id: str) -> None:
        """Make the agent's stored session safe to take up again in a new process (a no-op unless the agent needs
        it)."""


def content_text(tool_call: Mapping[str, Any]) -> str:
    """The first text of an ACP ``toolCall``'s content."""
    for item in tool_call.get("content") or []:
        inner = item.get("content") if isinstance(item, dict) else None
        if isinstance(inner, dict) and inner.get("type") == "text":
            return str(inner.get("text") or "")
    return ""


class PlatformBuildProfile(AgentProfile):
    """An agent npm ships as one native build per platform (``<package>-<os>-<cpu>``), run directly: its program is
    the build's binary, its version the build's ``package.json``."""

    @abstractmethod
    def binary(self, environ: Mapping[str, str]) -> Path | None:
        """Where this platform's build keeps the binary (None: no build for this platform)."""

    def program(self, environ: Mapping[str, str]) -> list[str] | None:
        binary = self.binary(environ)
        return [str(binary)] if binary is not None and binary.is_file() else None

    def installed_version(self, environ: Mapping[str, str]) -> str:
        binary = self.binary(environ)
        try:
            return str(json.loads((binary.parents[1] / "package.json").read_text())["version"]) if binary else ""
        except (OSError, ValueError, KeyError):
            return ""


def runtime_env(environ: Mapping[str, str], cwd: str, extra: Mapping[str, str]) -> dict[str, str]:
    """The agent's environment: the namespace's own (built from scratch by the supervisor), CodeSDK's variables and
    Python's removed (the agent starts CodeSDK's MCP bridge with it), the profile's switches added."""
    env = {k: v for k, v in environ.items() if not k.startswith(("CODESDK_", "PYTHON"))}
    env.update({"NO_COLOR": "1", "TERM": "dumb", "PWD": cwd, "BROWSER": "true", **extra})
    return env


def env_set_hint(environ: Mapping[str, str], variable: str) -> str:
    """The command that configures ``variable`` for this worker's namespace (its value read from stdin)."""
    found = namespace_of(environ)
    if found is None:
        return f"{variable} in this namespace's environment"
    name, data_dir = found
    return f"`codesdk-supervisor namespace env set --data-dir {data_dir} {name} {variable}` (the value is read from stdin)"


def home(environ: Mapping[str, str]) -> Path:
    return Path(environ.get("HOME", "~")).expanduser()


def private_dir(path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def write_private(path: Path, text: str) -> None:
    """Write a config file only the namespace's user can read, replacing whatever (or whichever link) was there."""
    private_dir(path.parent)
    temporary = path.with_name(f".{path.name}.codesdk-{os.getpid()}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)
    os.replace(temporary, path)
