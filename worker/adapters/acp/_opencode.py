"""OpenCode as an ACP agent: its platform build's ``opencode acp``. ``runtimes/package.json`` pins the platform
package itself (``opencode-linux-x64``), as an optional dependency: the ``opencode-ai`` wrapper holds only a launcher
that needs the install script CodeSDK never runs, and lists a dozen platform packages a lock file must then hold.

Its configuration comes in ``OPENCODE_CONFIG_CONTENT``: the operator's own (a JSON object in the namespace's
environment, e.g. a provider with its base URL), with CodeSDK's keys on top: every tool denied except CodeSDK's MCP
tools, which ask (the bridge then decides with the supervisor), no autoupdate, no sharing, no other MCP servers or
plugins. Project configuration is switched off (``OPENCODE_DISABLE_PROJECT_CONFIG``) and a workspace holding
``.opencode/`` or ``opencode.json(c)`` is refused. OpenCode retries a failed model request five times on its own
schedule and cannot be told otherwise.
"""

from __future__ import annotations

import contextlib
import json
import platform
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from codesdk.procs.launch import Launch
from .._installed import node_modules
from .._api_failures import is_unreachable
from ._profile import (
    MCP_SERVER_NAME,
    AcpSettings,
    BadAcpConfig,
    Credentials,
    PlatformBuildProfile,
    env_set_hint,
    home,
    runtime_env,
)

#: The platform packages, as OpenCode's own launcher picks them (glibc builds).
_PLATFORMS = {("Linux", "x86_64"): "opencode-linux-x64", ("Linux", "aarch64"): "opencode-linux-arm64",
              ("Darwin", "x86_64"): "opencode-darwin-x64", ("Darwin", "arm64"): "opencode-darwin-arm64"}
#: Keys of the operator's config that CodeSDK replaces or drops: they decide which tools run and what code loads.
_ENFORCED = ("permission", "mcp", "plugin", "autoupdate", "share", "tools", "agent", "mode")
#: Switches that keep OpenCode from fetching, installing, updating, sharing or loading anything on its own.
OFF_SWITCHES = {f"OPENCODE_{name}": "true" for name in (
    "DISABLE_AUTOUPDATE", "DISABLE_MODELS_FETCH", "DISABLE_DEFAULT_PLUGINS", "DISABLE_LSP_DOWNLOAD", "DISABLE_SHARE",
    "DISABLE_CLAUDE_CODE", "DISABLE_EXTERNAL_SKILLS", "DISABLE_TERMINAL_TITLE", "DISABLE_FFF",
    "DISABLE_PROJECT_CONFIG", "PURE")}
#: An HTTP status in an error message (OpenCode's ACP errors lose the status itself).
_STATUS = re.compile(r"\b(?:status(?:\s*code)?|HTTP)\W{0,3}([45]\d\d)\b", re.IGNORECASE)
_STATUS_WORDS = ((re.compile(r"unauthori[sz]ed|invalid api key|authentication", re.IGNORECASE), 401),
                 (re.compile(r"rate.?limit|too many requests|quota", re.IGNORECASE), 429),
                 (re.compile(r"overloaded", re.IGNORECASE), 529),
                 (re.compile(r"not.?found", re.IGNORECASE), 404),
                 (re.compile(r"context.{0,20}(?:length|window)|too long", re.IGNORECASE), 413))


class OpenCodeProfile(PlatformBuildProfile):
    name = "opencode"
    title = "OpenCode"
    package = "opencode-linux-x64"
    version = "1.18.33"
    handshake_timeout_s = 90.0  # 4-9 s to initialize and 3-5 s per session/new on a busy machine
    exit_grace_s = 5.0  # it exits on stdin EOF in ~0.2 s
    default_max_retries = None
    unsafe_workspace_entries = (".opencode", "opencode.json", "opencode.jsonc")
    context_files = ("AGENTS.md", "CLAUDE.md")

    def binary(self, environ: Mapping[str, str]) -> Path | None:
        """The platform build's binary (only ``opencode-linux-x64`` is pinned; another platform's package, installed
        into the runtimes directory by hand, is found too)."""
        package = _PLATFORMS.get((platform.system(), platform.machine()))
        return node_modules(environ) / package / "bin" / "opencode" if package else None

    def missing_reason(self, environ: Mapping[str, str]) -> str:
        binary = self.binary(environ)
        if binary is None or binary.parents[1].name != self.package:
            return (f"{self.title} {self.version} is pinned for Linux x86_64 only ({self.package}); on "
                    f"{platform.system()} {platform.machine()} install its platform package into "
                    f"{node_modules(environ)}, or point CODESDK_RUNTIMES_DIR at a copy that has it")
        return self.not_installed(environ)

    def tool_prefix(self) -> str:
        return f"{MCP_SERVER_NAME}_"

    def credentials(self, environ: Mapping[str, str]) -> Credentials:
        configure = (f"set a provider's API key, e.g. {env_set_hint(environ, 'ANTHROPIC_API_KEY')}, or "
                     "OPENCODE_CONFIG_CONTENT (OpenCode's own configuration as JSON, with a provider of your own) the "
                     "same way")
        if environ.get("OPENCODE_CONFIG_CONTENT"):
            return Credentials("api_key", "using the provider in this namespace's OPENCODE_CONFIG_CONTENT", configure)
        keys = sorted(k for k in environ if k.endswith("_API_KEY") and environ[k])
        if keys:
            return Credentials("api_key", f"using {', '.join(keys)} from this namespace's environment", configure)
        if (_data_home(environ) / "opencode" / "auth.json").is_file():
            return Credentials("oauth_local", f"OpenCode login found in {_data_home(environ) / 'opencode'}",
                               configure)
        return Credentials(None, f"no model provider configured: {configure}", configure)

    def config(self, settings: AcpSettings, environ: Mapping[str, str]) -> dict[str, Any]:
        """The operator's config (``OPENCODE_CONFIG_CONTENT``) with CodeSDK's keys on top."""
        raw = environ.get("OPENCODE_CONFIG_CONTENT")
        try:
            given = json.loads(raw) if raw else {}
        except ValueError as exc:
            raise BadAcpConfig(f"this namespace's OPENCODE_CONFIG_CONTENT is not JSON: {exc}") from exc
        if not isinstance(given, dict):
            raise BadAcpConfig("this namespace's OPENCODE_CONFIG_CONTENT must be a JSON object")
        config = {k: v for k, v in given.items() if k not in _ENFORCED}
        config.update({"autoupdate": False, "share": "disabled",
                       "permission": {"*": "deny", f"{MCP_SERVER_NAME}_*": "ask"}})
        if settings.model:
            config["model"] = settings.model
        return config

    def prepare(self, settings: AcpSettings, environ: Mapping[str, str]) -> None:
        self.config(settings, environ)  # a broken operator config fails the task before anything starts

    def launch(self, program: list[str], settings: AcpSettings, *, cwd: str,
               environ: Mapping[str, str]) -> Launch:
        config = json.dumps(self.config(settings, environ), separators=(",", ":"))
        env = runtime_env(environ, cwd, {**OFF_SWITCHES, "OPENCODE_CONFIG_CONTENT": config})
        return Launch(argv=(*program, "acp"), env=env, cwd=cwd)

    def http_status(self, code: int, message: str, data: Any) -> int | None:
        if (found := _STATUS.search(message)) is not None:
            return int(found.group(1))
        if is_unreachable(message):  # "Cannot connect to API": no HTTP answer at all
            return None
        if isinstance(data, dict) and data.get("errorName") in ("APIError", "ProviderAuthError"):
            for pattern, status in _STATUS_WORDS:
                if pattern.search(message):
                    return status
            return 401 if data.get("errorName") == "ProviderAuthError" else 500
        return super().http_status(code, message, data)

    def api_base_url(self, settings: AcpSettings, environ: Mapping[str, str]) -> str | None:
        """The ``options.baseURL`` of the model's provider in the operator's config (``provider/model``)."""
        try:
            config = self.config(settings, environ)
        except BadAcpConfig:
            return None
        model = str(config.get("model") or "")
        provider = (config.get("provider") or {}).get(model.split("/", 1)[0]) if "/" in model else None
        options = provider.get("options") if isinstance(provider, dict) else None
        url = options.get("baseURL") if isinstance(options, dict) else None
        return url if isinstance(url, str) else None

    def stored_session(self, environ: Mapping[str, str], cwd: Path, session_id: str) -> bool | None:
        """A row of the session in OpenCode's database (``$XDG_DATA_HOME/opencode/opencode.db``), read-only."""
        import sqlite3  # only here: a worker that hosts no OpenCode task never loads it

        database = _data_home(environ) / "opencode" / "opencode.db"
        if not database.is_file():
            return False
        try:
            with contextlib.closing(sqlite3.connect(f"{database.as_uri()}?mode=ro", uri=True, timeout=2)) as conn:
                return conn.execute("SELECT 1 FROM session WHERE id = ?", (session_id,)).fetchone() is not None
        except sqlite3.Error:
            return None  # a schema of another version, or locked: OpenCode is asked

    def implicit_sources(self, environ: Mapping[str, str], cwd: Path) -> dict[str, Any]:
        config_dir = Path(environ.get("XDG_CONFIG_HOME") or home(environ) / ".config") / "opencode"
        candidates = {"user_config": (config_dir / "opencode.json", True),
                      "user_instructions": (config_dir / "AGENTS.md", True),
                      "project_instructions": (cwd / "AGENTS.md", False),
                      "login": (_data_home(environ) / "opencode" / "auth.json", True)}
        found = [{"kind": kind, "path": str(path), "used": used}
                 for kind, (path, used) in candidates.items() if path.exists()]
        return {"policy": "OpenCode's own system prompt is sent; the user's AGENTS.md is loaded by OpenCode, the "
                          "workspace's is not (project config off; recorded); "
                          "every tool but CodeSDK's denied, no plugins, other MCP servers, sharing or updates; "
                          "project config off and a workspace with .opencode/ or opencode.json refused",
                "found": found}


def _data_home(environ: Mapping[str, str]) -> Path:
    """Where OpenCode keeps its database, logs and logins (``$XDG_DATA_HOME``: the namespace's data dir)."""
    return Path(environ.get("XDG_DATA_HOME") or home(environ) / ".local" / "share")
