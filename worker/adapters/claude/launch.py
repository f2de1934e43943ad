"""How Claude Code is started for a task: the pinned program, its command line, environment and directory.

One composition for both ways the CLI is started: by a task (``ClaudeTask``), and ahead of its task
(``worker._ahead``), which adopts a program started ahead only when both compose the same launch. The standard
library only, so the worker can run it before its heavy imports.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from codesdk.procs.launch import Launch
from .._grace import BadGrace, stop_grace

MCP_SERVER = "codesdk"
DEFAULT_MODEL = "claude-sonnet-4-5"
DEFAULT_MAX_TURNS = 50
#: Seconds the CLI gets to end its turn by itself after a stop, before its process group is ended.
DEFAULT_STOP_GRACE_S = 5.0
#: Switches that keep Claude Code from phoning home, updating itself or deferring our tools.
QUIET_ENV = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "DISABLE_BUG_COMMAND": "1",
    "ENABLE_TOOL_SEARCH": "false",  # otherwise MCP tools hide behind a ToolSearch tool
}


#: Our ids for the hook callbacks registered at initialize.
PRE_TOOL_USE, POST_TOOL_USE = "codesdk_pre_tool_use", "codesdk_post_tool_use"
#: How long a PreToolUse hook may wait for the supervisor (a human may be deciding).
HOOK_TIMEOUT_S = 24 * 3600
#: The id of the ``initialize`` control request every launch opens with (the launch's ``opening``).
INITIALIZE_REQUEST_ID = "codesdk_initialize"


#: The ``runtime_config`` keys a Claude task takes (its offer declares them: the supervisor refuses others up front).
CLAUDE_CONFIG_KEYS = ("model", "max_turns", "builtin_tools", "max_retries", "stop_grace_s")


class BadClaudeConfig(ValueError):
    """The task's ``runtime_config`` cannot be used (the caller's mistake); the message says which key and why."""


#: Claude Code's tool that asks the user questions (offered in interactive tasks only).
ASK_USER_QUESTION = "AskUserQuestion"

@dataclass(frozen=True)
class ClaudeSettings:
    """What a task's ``runtime_config`` asks of Claude Code, checked."""

    model: str = DEFAULT_MODEL
    max_turns: int = DEFAULT_MAX_TURNS
    #: Claude's own tools the operator enabled for the task; each call is still decided by the supervisor.
    builtins: tuple[str, ...] = ()
    stop_grace_s: float = DEFAULT_STOP_GRACE_S
    #: Failed model requests Claude Code may retry (``CLAUDE_CODE_MAX_RETRIES``); None: the namespace's or its own.
    max_retries: int | None = None

    @classmethod
    def from_config(cls, config: Mapping[str, object]) -> ClaudeSettings:
        unknown = sorted(set(config) - set(CLAUDE_CONFIG_KEYS))
        if unknown:
            raise BadClaudeConfig(f"runtime_config has keys Claude Code does not take: {', '.join(unknown)} "
                                  f"(known: {', '.join(CLAUDE_CONFIG_KEYS)})")
        max_turns = config.get("max_turns", DEFAULT_MAX_TURNS)
        if not isinstance(max_turns, int) or isinstance(max_turns, bool) or max_turns < 1:
            raise BadClaudeConfig("runtime_config.max_turns must be an integer >= 1")
        try:
            grace = stop_grace(config, DEFAULT_STOP_GRACE_S)
        except BadGrace as exc:
            raise BadClaudeConfig(str(exc)) from None
        builtins = config.get("builtin_tools") or []
        if not isinstance(builtins, list) or not all(isinstance(b, str) for b in builtins):
            raise BadClaudeConfig("runtime_config.builtin_tools must be a list of names")
        retries = config.get("max_retries")
        if retries is not None and (not isinstance(retries, int) or isinstance(retries, bool)
                                    or not 0 <= retries <= 10):
            raise BadClaudeConfig("runtime_config.max_retries must be a whole number from 0 to 10")
        return cls(model=str(config.get("model") or DEFAULT_MODEL), max_turns=max_turns, builtins=tuple(builtins),
                   stop_grace_s=float(grace), max_retries=retries)


def claude_launch(cli: Path, settings: ClaudeSettings, *, cwd: str, resume: str | None,
                  environ: Mapping[str, str], questions: bool = False) -> Launch:
    """The CLI's launch for a task (the flags claude-agent-sdk 0.2.187 passes for the same options).

    Our tools are not named on the command line: the MCP server lists them over the control channel once the task
    runs, and the PreToolUse hook decides each call (an "allow" there needs no allow rule). So a launch depends on
    the task's settings, directory and resumed session only — what ``codesdk run`` knows before it starts.
    ``questions``: the task is interactive, so Claude's ``AskUserQuestion`` is offered (its questions reach the user
    through CodeSDK)."""
    tools = (*settings.builtins, ASK_USER_QUESTION) if questions else settings.builtins
    argv = [str(cli), "--output-format", "stream-json", "--verbose", "--input-format", "stream-json",
            "--system-prompt", "", "--tools", ",".join(tools), "--model", settings.model,
            "--max-turns", str(settings.max_turns), "--permission-prompt-tool", "stdio",
            "--mcp-config", json.dumps({"mcpServers": {MCP_SERVER: {"type": "sdk", "name": MCP_SERVER}}}),
            "--strict-mcp-config", "--setting-sources=", "--include-partial-messages"]
    if settings.builtins:
        argv += ["--allowedTools", ",".join(settings.builtins)]
    if resume:
        argv.append(f"--resume={resume}")  # one token: never read as a flag
    env = {k: v for k, v in environ.items() if k != "CLAUDECODE"}  # not "inside another Claude Code"
    env.update(QUIET_ENV)
    env["PWD"] = cwd
    if settings.max_retries is not None:
        env["CLAUDE_CODE_MAX_RETRIES"] = str(settings.max_retries)
    opening = {"type": "control_request", "request_id": INITIALIZE_REQUEST_ID,
               "request": initialize_request(settings.builtins)}
    return Launch(argv=tuple(argv), env=env, cwd=cwd,
                         opening=json.dumps(opening, separators=(",", ":")).encode() + b"\n")


def initialize_request(builtins: tuple[str, ...]) -> dict[str, object]:
    """The control protocol's ``initialize``: our hooks. PreToolUse decides every call (a failing hook blocks it);
    PostToolUse reports the end of Claude's own tools, the only ones that run on the runtime's side."""
    pre: dict[str, object] = {"matcher": None, "hookCallbackIds": [PRE_TOOL_USE], "timeout": HOOK_TIMEOUT_S,
                              "onFailure": "block"}
    hooks: dict[str, list[dict[str, object]]] = {"PreToolUse": [pre]}
    if builtins:
        post: dict[str, object] = {"matcher": None, "hookCallbackIds": [POST_TOOL_USE]}
        hooks["PostToolUse"] = [post]
        hooks["PostToolUseFailure"] = [post]
    return {"subtype": "initialize", "hooks": hooks}


def launch_ahead(config: Mapping[str, object], workspace: str, environ: Mapping[str, str],
                 interactive: bool = False) -> Launch | None:
    """The launch of a new session's first task in ``workspace`` (a ``worker._ahead.Composer``); None when the CLI
    is missing or ``config`` unusable (the task itself then says why)."""
    cli = cli_path()
    try:
        return claude_launch(cli, ClaudeSettings.from_config(config), cwd=workspace, resume=None, environ=environ,
                             questions=interactive) if cli is not None else None
    except BadClaudeConfig:
        return None


def _sdk_dir() -> Path | None:
    """Where claude-agent-sdk is installed, found without importing it (the import costs ~1.2 s). The wheel is
    only how the pinned CLI binary is installed: nothing imports the SDK at run time."""
    spec = importlib.util.find_spec("claude_agent_sdk")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def cli_path() -> Path | None:
    """The CLI bundled in the SDK wheel (pinned with it), else one on PATH; None if the SDK is missing."""
    sdk = _sdk_dir()
    if sdk is None:
        return None
    bundled = sdk / "_bundled" / "claude"
    if bundled.exists():
        return bundled
    found = shutil.which("claude")
    return Path(found) if found else None


def cli_version() -> str:
    sdk = _sdk_dir()
    try:
        return (sdk / "_bundled" / "claude.version").read_text().split()[0] if sdk else "unavailable"
    except OSError:
        return "unknown"


def default_cwd(workspace: str | None, environ: Mapping[str, str] = os.environ) -> str:
    """Where the CLI runs: the task's workspace, else the worker's TMPDIR."""
    return workspace or environ.get("TMPDIR") or "/tmp"
