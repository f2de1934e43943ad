"""Codex through Zed's ACP adapter (``@zed-industries/codex-acp``): a Rust binary wrapping Codex's core (0.137 in
0.16.0) that speaks ACP on stdio. The npm package's JS launcher only spawns its platform build
(``@zed-industries/codex-acp-<os>-<cpu>/bin/codex-acp``), so that build is run directly.

Everything it keeps lives under ``CODEX_HOME``, always the namespace HOME's ``.codex`` (the Codex runtime's too, so a
``codex login`` there serves both); a ``CODEX_HOME`` or ``CODEX_SQLITE_HOME`` among the namespace's variables is not
honoured. CodeSDK's settings come as ``-c`` overrides, which win over that home's ``config.toml``: with
``OPENAI_API_KEY`` in the namespace, CodeSDK's Responses provider (``OPENAI_BASE_URL`` or OpenAI's API, that key);
every feature that runs code, reaches the network beyond the provider or installs something off; web search, project
docs (``AGENTS.md``) and skills' instructions off; approvals ``untrusted`` in a ``read-only`` sandbox (a Codex tool
that still reaches the model, ``apply_patch``, asks, and the supervisor decides); the MCP servers of that
``config.toml`` disabled, so CodeSDK's are the only ones. Codex reads a workspace's ``.codex/`` once the folder is
trusted (MCP servers, hooks, approvals): such a workspace is refused.
"""

from __future__ import annotations

import json
import platform
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from codesdk.procs.launch import Launch
from .._installed import node_modules
from ..codex.home import stored_thread
from ..codex.launch import DEFAULT_BASE_URL, PROVIDER, codex_home
from ._profile import (
    MCP_SERVER_NAME,
    AcpSettings,
    Credentials,
    PlatformBuildProfile,
    env_set_hint,
    private_dir,
    runtime_env,
)

#: The platform packages, as codex-acp's own launcher picks them.
_PLATFORMS = {("Linux", "x86_64"): "codex-acp-linux-x64", ("Linux", "aarch64"): "codex-acp-linux-arm64",
              ("Darwin", "x86_64"): "codex-acp-darwin-x64", ("Darwin", "arm64"): "codex-acp-darwin-arm64"}
#: Codex features switched off for every task (the names of Codex 0.137, which codex-acp 0.16.0 wraps): anything that
#: runs code, reaches the network beyond the model provider, installs or updates things, or offers the model a tool
#: of Codex's own. Unknown names are ignored by Codex.
DISABLED_FEATURES = (
    "shell_tool", "unified_exec", "shell_snapshot", "js_repl", "code_mode", "multi_agent", "multi_agent_v2", "goals",
    "apps", "enable_mcp_apps", "plugins", "plugin_hooks", "remote_plugin", "plugin_sharing", "in_app_browser",
    "browser_use", "browser_use_external", "computer_use", "hooks", "skill_mcp_dependency_install", "tool_suggest",
    "tool_search", "web_search_request", "standalone_web_search", "image_generation", "workspace_dependencies",
    "guardian_approval", "memories", "remote_models", "enable_request_compression", "realtime_conversation",
    "remote_control",
)
#: ``-c`` settings for every task: no analytics, feedback uploads or update checks, no web search, no project docs
#: (``AGENTS.md``) or skills' instructions, approvals asked for every Codex tool in a read-only sandbox.
QUIET_CONFIG: dict[str, object] = {
    "analytics.enabled": False, "feedback.enabled": False, "check_for_update_on_startup": False,
    "web_search": "disabled", "project_doc_max_bytes": 0, "skills.include_instructions": False,
    "approval_policy": "untrusted", "sandbox_mode": "read-only",
}
#: How codex-acp names a call of an MCP tool (``tool_call``) and asks to approve one (``session/request_permission``).
_CALL_TITLE = re.compile(r"^Tool: ([^/]+)/(.+)$")
_APPROVAL_TOOL = re.compile(r'\btool "([^"]+)"')
#: Codex's ``codex_error_info`` kinds that stand for an HTTP status of the model API.
_ERROR_STATUS = {"unauthorized": 401, "bad_request": 400, "usage_limit_exceeded": 429,
                 "context_window_exceeded": 413, "internal_server_error": 500, "server_overloaded": 529}
_STATUS_IN_MESSAGE = re.compile(r"\b(?:unexpected status|last status:?|status code:?)\s*([45]\d\d)\b", re.IGNORECASE)
#: The JSON-RPC error codex-acp answers ``session/resume`` with when it has no rollout of the session.
RESOURCE_NOT_FOUND = -32002
#: An MCP server name Codex takes as a ``-c`` key (it refuses others anyway).
_SERVER_NAME = re.compile(r"^[A-Za-z0-9_-]+$")


class CodexAcpProfile(PlatformBuildProfile):
    name = "codex-acp"
    title = "Codex (ACP)"
    package = "@zed-industries/codex-acp"
    version = "0.16.0"
    context_window_tokens = 272_000  # Codex's default model
    parallel_tool_calls = False  # Codex runs MCP tools one at a time (they are not marked parallel)
    handshake_timeout_s = 60.0  # initialize 0.05-0.15 s, session/new ~0.02 s (MCP servers start in the background)
    exit_grace_s = 0.0  # it never exits on stdin EOF; SIGTERM ends it at once, its rollout already written
    default_max_retries = 4  # Codex's own default for its provider's requests
    unsafe_workspace_entries = (".codex",)
    context_files = ("AGENTS.md",)
    opt_in = ("CODESDK_ALLOW_CODEX_ACP",
              ("codex-acp 0.16.0 offers the model Codex's own view_image tool, which no setting removes and which "
               "reads an image file through Codex's sandbox without asking the supervisor: fine for trusted users, "
               "not for hostile tenants (use --runtime codex, whose own tools are all off)"))

    def binary(self, environ: Mapping[str, str]) -> Path | None:
        package = _PLATFORMS.get((platform.system(), platform.machine()))
        return node_modules(environ) / "@zed-industries" / package / "bin" / "codex-acp" if package else None

    def missing_reason(self, environ: Mapping[str, str]) -> str:
        if self.binary(environ) is None:
            return (f"{self.title} has no build for {platform.system()} {platform.machine()} (its npm package has "
                    "Linux and macOS builds for x86_64 and arm64)")
        return self.not_installed(environ)

    def tool_prefix(self) -> str:
        """The model sees CodeSDK's tools as functions of the namespace ``mcp__codesdk``."""
        return f"mcp__{MCP_SERVER_NAME}__"

    def own_tool(self, tool_call: Mapping[str, Any], visible: Mapping[str, object]) -> str | None:
        """A call of an MCP tool is titled ``Tool: <server>/<tool>`` (its ``rawInput`` names both); the request to
        approve one is titled "Approve MCP tool call", its ``rawInput`` the elicitation naming the server, the tool
        only in its message."""
        raw = _object(tool_call.get("rawInput"))
        found: tuple[object, object] | None = None
        if (match := _CALL_TITLE.match(str(tool_call.get("title") or ""))) is not None:
            found = match.group(1), match.group(2)
        elif "server" in raw:
            found = raw.get("server"), raw.get("tool")
        elif "request" in raw:
            asked = _APPROVAL_TOOL.search(str(_object(raw["request"]).get("message") or ""))
            found = raw.get("server_name"), asked.group(1) if asked else None
        if found is None or found[0] != MCP_SERVER_NAME or not isinstance(found[1], str):
            return None
        return found[1] if found[1] in visible else None

    def tool_arguments(self, tool_call: Mapping[str, Any]) -> dict[str, Any] | None:
        """``rawInput.arguments`` of a call, ``rawInput.request._meta.tool_params`` of an approval request."""
        raw = _object(tool_call.get("rawInput"))
        meta = _object(_object(raw.get("request")).get("_meta"))
        for arguments in (raw.get("arguments"), meta.get("tool_params")):
            if isinstance(arguments, dict):
                return arguments
        return super().tool_arguments(tool_call)

    def credentials(self, environ: Mapping[str, str]) -> Credentials:
        configure = (f"configure {env_set_hint(environ, 'OPENAI_API_KEY')} (and OPENAI_BASE_URL for another "
                     "Responses API endpoint), or log Codex in for this namespace: `codesdk auth login --runtime "
                     "codex --namespace NS` (its login serves codex-acp too)")
        if environ.get("OPENAI_API_KEY"):
            base = environ.get("OPENAI_BASE_URL")
            return Credentials("api_key", "using the OPENAI_API_KEY configured for this namespace"
                               + (f" with {base}" if base else ""), configure)
        if (codex_home(environ) / "auth.json").is_file():
            return Credentials("oauth_local", f"codex login found in {codex_home(environ)}", configure)
        return Credentials(None, f"not logged in: {configure}", configure)

    def prepare(self, settings: AcpSettings, environ: Mapping[str, str]) -> None:
        private_dir(codex_home(environ))  # Codex refuses a CODEX_HOME that does not exist

    def config(self, settings: AcpSettings, environ: Mapping[str, str]) -> dict[str, object]:
        """Every ``-c`` setting of a task's launch."""
        config: dict[str, object] = dict(QUIET_CONFIG)
        config.update({f"features.{feature}": False for feature in DISABLED_FEATURES})
        config.update({f"mcp_servers.{name}.enabled": False for name in self._configured_servers(environ)})
        if environ.get("OPENAI_API_KEY"):
            retries = self.default_max_retries if settings.max_retries is None else settings.max_retries
            provider = f"model_providers.{PROVIDER}"
            config.update({"model_provider": PROVIDER, f"{provider}.name": "CodeSDK",
                           f"{provider}.base_url": environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL,
                           f"{provider}.wire_api": "responses", f"{provider}.env_key": "OPENAI_API_KEY",
                           f"{provider}.request_max_retries": retries, f"{provider}.stream_max_retries": retries})
        if settings.model:
            config["model"] = settings.model
        return config

    @staticmethod
    def _configured_servers(environ: Mapping[str, str]) -> list[str]:
        """The MCP servers the namespace's ``config.toml`` lists (switched off: CodeSDK's are the only ones)."""
        try:
            with (codex_home(environ) / "config.toml").open("rb") as file:
                servers = tomllib.load(file).get("mcp_servers")
        except (OSError, tomllib.TOMLDecodeError):
            return []  # none, or a file Codex itself refuses to start with
        return sorted(name for name in servers if name != MCP_SERVER_NAME and _SERVER_NAME.match(name)) \
            if isinstance(servers, dict) else []

    def launch(self, program: list[str], settings: AcpSettings, *, cwd: str,
               environ: Mapping[str, str]) -> Launch:
        argv = list(program)
        for key, value in self.config(settings, environ).items():
            argv += ["-c", f"{key}={json.dumps(value)}"]  # a TOML value: JSON's strings, numbers, booleans are TOML's
        env = runtime_env(environ, cwd, {"CODEX_HOME": str(codex_home(environ)), "NO_BROWSER": "1"})
        env.pop("CODEX_SQLITE_HOME", None)
        return Launch(argv=tuple(argv), env=env, cwd=cwd)

    def http_status(self, code: int, message: str, data: Any) -> int | None:
        """codex-acp answers a failed turn ``-32603`` with ``data: {message, codex_error_info}``: the status is in
        the info (``{"…": {"http_status_code": 429}}``, or a kind such as ``"unauthorized"``), else in the message
        ("unexpected status 401 Unauthorized: …")."""
        if not isinstance(data, dict):
            return super().http_status(code, message, data)
        info = data.get("codex_error_info")
        if isinstance(info, dict):
            for detail in info.values():
                if isinstance(detail, dict) and isinstance(detail.get("http_status_code"), int):
                    return int(detail["http_status_code"])
        elif isinstance(info, str) and info in _ERROR_STATUS:
            return _ERROR_STATUS[info]
        found = _STATUS_IN_MESSAGE.search(str(data.get("message") or ""))
        return int(found.group(1)) if found else None

    def api_base_url(self, settings: AcpSettings, environ: Mapping[str, str]) -> str | None:
        return (environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL) if environ.get("OPENAI_API_KEY") else None

    def session_never_stored(self, code: int, message: str, data: Any) -> bool:
        """Codex writes a session's rollout when its first turn starts; a session whose process ended before that
        is "Resource not found" when resumed."""
        return code == RESOURCE_NOT_FOUND

    def stored_session(self, environ: Mapping[str, str], cwd: Path, session_id: str) -> bool | None:
        """codex-acp's session is a Codex thread: its rollout under CODEX_HOME."""
        return stored_thread(environ, session_id)

    def implicit_sources(self, environ: Mapping[str, str], cwd: Path) -> dict[str, Any]:
        home = codex_home(environ)
        candidates = {"user_config": (home / "config.toml", True), "user_env": (home / ".env", True),
                      "user_instructions": (home / "AGENTS.md", True), "login": (home / "auth.json", True),
                      "user_skills": (home / "skills", False), "project_instructions": (cwd / "AGENTS.md", False),
                      "project_skills": (cwd / ".agents" / "skills", False)}
        found = [{"kind": kind, "path": str(path), "used": used}
                 for kind, (path, used) in candidates.items() if path.exists()]
        return {"policy": "Codex's own base instructions are sent; CODEX_HOME's config.toml, .env and AGENTS.md are "
                          "loaded by Codex (recorded), CodeSDK's -c settings win over the config and its MCP servers "
                          "are disabled; project docs (AGENTS.md) and skills' instructions off; built-in tools, web "
                          "search, plugins, apps, hooks and memories off; a workspace with .codex/ is refused",
                "codex_home": str(home), "found": found}


def _object(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}
