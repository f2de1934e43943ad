"""Environment, auth state and implicit sources of Claude Code inside one credential namespace.

All of Claude Code's state lives under the namespace's HOME (``~/.claude.json``, ``~/.claude/``) or
``CLAUDE_CONFIG_DIR`` when the operator sets it, so namespaces never share logins. Nothing here reads a
secret's value beyond deciding that it exists.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path
from typing import Any

from protocol import AuthState, AuthStatus, sha256_hex, utc_now

#: Switches that keep Claude Code from phoning home, updating itself or deferring our tools.
QUIET_ENV = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "DISABLE_BUG_COMMAND": "1",
    "ENABLE_TOOL_SEARCH": "false",  # otherwise MCP tools hide behind a ToolSearch tool
}


def config_dir(env: dict[str, str] | os._Environ[str]) -> Path:
    explicit = env.get("CLAUDE_CONFIG_DIR")
    return Path(explicit) if explicit else Path(env.get("HOME", "~")).expanduser() / ".claude"


def global_config_file(env: dict[str, str] | os._Environ[str]) -> Path:
    explicit = env.get("CLAUDE_CONFIG_DIR")
    return Path(explicit) / ".claude.json" if explicit else Path(env.get("HOME", "~")).expanduser() / ".claude.json"


def _sdk_dir() -> Path | None:
    """Where claude-agent-sdk is installed, found without importing it (the import costs ~1 s)."""
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


def _mask(email: str) -> str:
    name, _, domain = email.partition("@")
    return f"{name[:1]}***@{domain}" if domain else "***"


def auth_status(env: dict[str, str] | os._Environ[str]) -> AuthStatus:
    """Logged in or not, and how — never a token. Cheap: looks at the environment and two files."""
    now = utc_now()
    if env.get("ANTHROPIC_API_KEY") or env.get("ANTHROPIC_AUTH_TOKEN"):
        return AuthStatus(runtime="claude", state=AuthState.AUTHENTICATED, method="api_key", checked_at=now,
                          account_hint="API key from the namespace environment",
                          message="using the API key configured for this namespace")
    credentials = config_dir(env) / ".credentials.json"
    if credentials.exists():
        hint = None
        try:
            account = json.loads(global_config_file(env).read_text()).get("oauthAccount") or {}
            if email := account.get("emailAddress"):
                hint = _mask(str(email))
        except (OSError, ValueError):
            pass
        return AuthStatus(runtime="claude", state=AuthState.AUTHENTICATED, method="oauth_local", checked_at=now,
                          account_hint=hint, message=f"OAuth login found in {credentials.parent}")
    home = env.get("HOME", "?")
    return AuthStatus(
        runtime="claude", state=AuthState.UNAUTHENTICATED, checked_at=now,
        message=("not logged in: run `HOME=" + home + " claude login` as the service user for this namespace "
                 "(or configure ANTHROPIC_API_KEY for it); CodeSDK never opens a browser"))


def implicit_sources(env: dict[str, str] | os._Environ[str], cwd: Path) -> dict[str, Any]:
    """What Claude Code would load on its own, and what we do with each: recorded, never silently used."""
    home = Path(env.get("HOME", "~")).expanduser()
    candidates = {
        "user_settings": config_dir(env) / "settings.json",
        "user_memory": config_dir(env) / "CLAUDE.md",
        "global_config": global_config_file(env),
        "project_settings": cwd / ".claude" / "settings.json",
        "project_local_settings": cwd / ".claude" / "settings.local.json",
        "project_memory": cwd / "CLAUDE.md",
        "project_mcp": cwd / ".mcp.json",
        "user_plugins": config_dir(env) / "plugins",
    }
    found = []
    for kind, path in candidates.items():
        if path.exists():
            entry: dict[str, Any] = {"kind": kind, "path": str(path), "used": False}
            if path.is_file() and kind != "global_config":  # the global config holds account data: no hash
                entry["sha256"] = sha256_hex(path.read_bytes())
            found.append(entry)
    return {
        "policy": "setting_sources=[] (no user/project/local settings, no CLAUDE.md), --strict-mcp-config "
                  "(only CodeSDK's MCP server), no plugins, built-in tools off",
        "home": str(home),
        "found": found,
    }
