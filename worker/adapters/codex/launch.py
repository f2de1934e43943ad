"""How Codex is started for a task: the pinned binary, ``codex app-server``'s command line, environment, directory.

The binary comes from npm (``runtimes/package.json`` pins ``@openai/codex``; ``scripts/install-runtimes`` installs
it with ``--ignore-scripts``). Its JS launcher only sets two variables and execs the platform build, so the adapter
runs the platform build directly. Everything Codex keeps lives under ``CODEX_HOME``, which is the namespace HOME's
``.codex``: logins and threads of two namespaces never meet. The standard library only.
"""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from codesdk._version import __version__
from codesdk.procs.launch import Launch
from .._grace import BadGrace, stop_grace
from .._installed import runtimes_dir

#: The version ``runtimes/package.json`` pins (a test holds the two equal).
CODEX_VERSION = "0.169.0"
#: The platform builds' directory names, as Codex's own launcher maps them.
_TRIPLES = {("Linux", "x86_64"): ("linux-x64", "x86_64-unknown-linux-musl"),
            ("Linux", "aarch64"): ("linux-arm64", "aarch64-unknown-linux-musl"),
            ("Darwin", "x86_64"): ("darwin-x64", "x86_64-apple-darwin"),
            ("Darwin", "arm64"): ("darwin-arm64", "aarch64-apple-darwin")}
#: The model provider CodeSDK configures when the namespace has an API key (base URL and key from its environment).
PROVIDER = "codesdk"
DEFAULT_BASE_URL = "https://api.openai.com/v1"
#: Seconds the runtime gets to end its turn by itself after a stop (``turn/interrupt``) before its group is ended.
DEFAULT_STOP_GRACE_S = 5.0
#: Codex features switched off for every task: anything that runs code, reaches the network beyond the model
#: provider, installs or updates things, or lets something other than the supervisor decide a call. Our tools reach
#: the model as dynamic tools; what is left on its side is ``request_user_input`` (asked through CodeSDK).
DISABLED_FEATURES = (
    "shell_tool", "unified_exec", "view_image", "multi_agent", "goals", "image_generation", "apps", "plugins",
    "remote_plugin", "plugin_sharing", "browser_use", "browser_use_external", "computer_use", "code_mode_host",
    "hooks", "skill_mcp_dependency_install", "tool_suggest", "daemon_auto_start", "sleep_tool",
    "workspace_dependencies", "in_app_updates", "guardian_approval", "enable_request_compression",
)
#: Codex features switched on for every task: ``request_user_input`` outside Plan mode, so the model's questions
#: reach the user through CodeSDK (``question.requested``; declined with the reason where nobody can be asked).
ENABLED_FEATURES = ("default_mode_request_user_input",)
#: ``-c`` settings for every task: no analytics, no update check, no web search, no AGENTS.md project docs, no
#: skills' instructions (a workspace's ``.agents/skills`` would otherwise reach the model as developer instructions).
QUIET_CONFIG = {"analytics.enabled": False, "check_for_update_on_startup": False, "web_search": "disabled",
                "project_doc_max_bytes": 0, "skills.include_instructions": False}
#: Model requests Codex may retry on its own before the task fails (it retries connection failures on its own
#: schedule — 5, 10, 20, 40, 60 s … — whatever ``request_max_retries`` says).
DEFAULT_MAX_RETRIES = 4


#: The id of the ``initialize`` request every launch opens with (the launch's ``opening``).
INITIALIZE_REQUEST_ID = "codesdk-initialize"


class BadCodexConfig(ValueError):
    """The task's ``runtime_config`` cannot be used (the caller's mistake); the message says which key and why."""


#: The ``runtime_config`` keys a Codex task takes (its offer declares them: the supervisor refuses others up front).
CODEX_CONFIG_KEYS = ("model", "max_retries", "stop_grace_s", "builtin_tools")


@dataclass(frozen=True)
class CodexSettings:
    """What a task's ``runtime_config`` asks of Codex, checked."""

    model: str | None = None  # None: the provider's default, as Codex picks it
    #: Retries of a failing model request (Codex's own default when None).
    max_retries: int | None = None
    stop_grace_s: float = DEFAULT_STOP_GRACE_S

    @classmethod
    def from_config(cls, config: Mapping[str, object]) -> CodexSettings:
        unknown = sorted(set(config) - set(CODEX_CONFIG_KEYS))
        if unknown:
            raise BadCodexConfig(f"runtime_config has keys Codex does not take: {', '.join(unknown)} "
                                 "(known: model, max_retries, stop_grace_s)")
        if config.get("builtin_tools"):
            raise BadCodexConfig("runtime_config.builtin_tools: Codex's built-in tools (commands, file edits, MCP) "
                                 "stay off under CodeSDK; its tools are CodeSDK's, decided and run by the supervisor")
        model = config.get("model")
        if model is not None and (not isinstance(model, str) or not model.strip()):
            raise BadCodexConfig("runtime_config.model must be a model name")
        retries = config.get("max_retries")
        if retries is not None and (not isinstance(retries, int) or isinstance(retries, bool) or not 0 <= retries <= 10):
            raise BadCodexConfig("runtime_config.max_retries must be a whole number from 0 to 10")
        try:
            grace = stop_grace(config, DEFAULT_STOP_GRACE_S)
        except BadGrace as exc:
            raise BadCodexConfig(str(exc)) from None
        return cls(model=model, max_retries=retries, stop_grace_s=float(grace))

    @property
    def retries_allowed(self) -> int:
        """Failed model requests Codex may retry before the task fails (``max_retries``, else the default)."""
        return DEFAULT_MAX_RETRIES if self.max_retries is None else self.max_retries


def _platform_build(environ: Mapping[str, str]) -> Path | None:
    names = _TRIPLES.get((platform.system(), platform.machine()))
    if names is None:
        return None
    package, triple = names
    return runtimes_dir(environ) / "node_modules" / "@openai" / f"codex-{package}" / "vendor" / triple


def codex_path(environ: Mapping[str, str] = os.environ) -> Path | None:
    """The pinned platform binary, if installed (its ``codex-package.json`` names it and its version)."""
    build = _platform_build(environ)
    if build is None:
        return None
    try:
        layout = json.loads((build / "codex-package.json").read_text())
    except (OSError, ValueError):
        return None
    binary = build / str(layout.get("entrypoint", "bin/codex"))
    return binary if binary.is_file() and os.access(binary, os.X_OK) else None


def codex_version(environ: Mapping[str, str] = os.environ) -> str:
    """The installed build's version, read from its layout file (no process started); "" if not installed."""
    build = _platform_build(environ)
    try:
        return str(json.loads((build / "codex-package.json").read_text())["version"]) if build else ""
    except (OSError, ValueError, KeyError):
        return ""


def codex_home(environ: Mapping[str, str]) -> Path:
    """Always the namespace HOME's ``.codex``: a ``CODEX_HOME`` in a namespace's variables is not honoured, or one
    namespace could name another's logins and threads."""
    return Path(environ.get("HOME", "~")).expanduser() / ".codex"


def _setting(key: str, value: object) -> list[str]:
    return ["-c", f"{key}={json.dumps(value)}"]  # a TOML value: JSON's strings, numbers and booleans are TOML's


def codex_launch(binary: Path, settings: CodexSettings, *, cwd: str, environ: Mapping[str, str]) -> Launch:
    """``codex app-server`` on stdio for one task. With ``OPENAI_API_KEY`` in the namespace's environment, the
    model provider is CodeSDK's (``OPENAI_BASE_URL`` or OpenAI's API, that key); without it, Codex's own login in
    the namespace's ``CODEX_HOME`` is used."""
    argv = [str(binary), "app-server"]
    for key, value in QUIET_CONFIG.items():
        argv += _setting(key, value)
    for feature in DISABLED_FEATURES:
        argv += ["--disable", feature]
    for feature in ENABLED_FEATURES:
        argv += ["--enable", feature]
    if environ.get("OPENAI_API_KEY"):
        provider = f"model_providers.{PROVIDER}"
        argv += _setting("model_provider", PROVIDER) + _setting(f"{provider}.name", "CodeSDK")
        argv += _setting(f"{provider}.base_url", environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL)
        argv += _setting(f"{provider}.wire_api", "responses") + _setting(f"{provider}.env_key", "OPENAI_API_KEY")
        if settings.max_retries is not None:
            argv += _setting(f"{provider}.request_max_retries", settings.max_retries)
            argv += _setting(f"{provider}.stream_max_retries", settings.max_retries)
    env = dict(environ)
    env.update({"CODEX_HOME": str(codex_home(environ)), "NO_COLOR": "1", "PWD": cwd})
    return Launch(argv=tuple(argv), env=env, cwd=cwd, opening=OPENING)


#: What every launch writes first: ``initialize`` (dynamic tools need the experimental API) and ``initialized``.
#: Sent as the process starts, so a Codex started ahead has answered it before its task runs.
OPENING = b"".join(json.dumps(message, separators=(",", ":")).encode() + b"\n" for message in (
    {"id": INITIALIZE_REQUEST_ID, "method": "initialize", "params": {
        "clientInfo": {"name": "codesdk", "title": "CodeSDK", "version": __version__},
        "capabilities": {"experimentalApi": True}}},
    {"method": "initialized"}))


def prepare_codex_home(environ: Mapping[str, str]) -> Path:
    """``CODEX_HOME`` must exist before Codex starts (it refuses a missing one); private to the namespace."""
    home = codex_home(environ)
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    return home


def has_credentials(environ: Mapping[str, str]) -> bool:
    """An API key in the environment or a ``codex login`` in ``CODEX_HOME`` (without either a task fails at once)."""
    return bool(environ.get("OPENAI_API_KEY")) or (codex_home(environ) / "auth.json").is_file()


def launch_ahead(config: Mapping[str, object], workspace: str, environ: Mapping[str, str],
                 interactive: bool = False) -> Launch | None:
    """The launch of a new session's first task in ``workspace`` (a ``worker._ahead.Composer``); None when the
    binary is missing, ``config`` unusable, or there are no credentials (the task itself then says why). Makes
    ``CODEX_HOME``, as a task does before it starts Codex."""
    binary = codex_path(environ)
    if binary is None or not has_credentials(environ):
        return None
    try:
        settings = CodexSettings.from_config(config)
    except BadCodexConfig:
        return None
    prepare_codex_home(environ)
    return codex_launch(binary, settings, cwd=workspace, environ=environ)
