"""Environment, auth state and implicit sources of Claude Code inside one credential namespace.

All of Claude Code's state lives under the namespace's HOME (``~/.claude.json``, ``~/.claude/``) or
``CLAUDE_CONFIG_DIR`` when the operator sets it, so namespaces never share logins. Nothing here reads a
secret's value beyond deciding that it exists.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from codesdk.protocol import AuthState, AuthStatus, utc_now

from .._namespace_home import namespace_of
from .._source_hash import source_sha256


def config_dir(env: dict[str, str] | os._Environ[str]) -> Path:
    explicit = env.get("CLAUDE_CONFIG_DIR")
    return Path(explicit) if explicit else Path(env.get("HOME", "~")).expanduser() / ".claude"


def global_config_file(env: dict[str, str] | os._Environ[str]) -> Path:
    explicit = env.get("CLAUDE_CONFIG_DIR")
    return Path(explicit) / ".claude.json" if explicit else Path(env.get("HOME", "~")).expanduser() / ".claude.json"


def stored_session(env: dict[str, str] | os._Environ[str], cwd: Path, session_id: str) -> bool:
    """Whether Claude Code still has the session's transcript, which ``--resume`` reads: ``<config dir>/projects/
    <the real cwd, each character not a letter or digit made '-'>/<session id>.jsonl``."""
    project = re.sub(r"[^A-Za-z0-9]", "-", os.path.realpath(cwd))
    return "/" not in session_id and (config_dir(env) / "projects" / project / f"{session_id}.jsonl").is_file()


def _mask(email: str) -> str:
    name, _, domain = email.partition("@")
    return f"{name[:1]}***@{domain}" if domain else "***"


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in {"1", "true", "yes", "on"}


def _global_config(env: dict[str, str] | os._Environ[str]) -> dict[str, Any]:
    try:
        value = json.loads(global_config_file(env).read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def login_instructions(env: dict[str, str] | os._Environ[str]) -> str:
    """How an operator logs this namespace in (CodeSDK never opens a browser, and there is no `claude login`)."""
    found = namespace_of(env)
    if found is not None:
        name, data_dir = found
        how = (f"run `codesdk auth login --runtime claude --namespace {name} --data-dir {data_dir}` (it runs "
               "`claude auth login` with this namespace's HOME: open the URL it prints and paste the code)")
    else:
        how = (f"run `HOME={env.get('HOME', '?')} claude auth login` as the service user (open the URL it prints and "
               "paste the code)")
    return (how + ", or configure ANTHROPIC_API_KEY (or CLAUDE_CODE_OAUTH_TOKEN from `claude setup-token`) for "
            "this namespace; CodeSDK never opens a browser")


def auth_status(env: dict[str, str] | os._Environ[str]) -> AuthStatus:
    """Logged in or not, and how — never a token. Cheap: looks at the environment and two files.

    What counts (as Claude Code 2.1.330 does, checked offline): ``ANTHROPIC_API_KEY``, ``ANTHROPIC_AUTH_TOKEN``,
    ``CLAUDE_CODE_OAUTH_TOKEN`` in the namespace's environment; a claude.ai login (``.credentials.json`` in
    ``CLAUDE_CONFIG_DIR`` or ``~/.claude``); a Console login's key (``primaryApiKey`` in ``.claude.json``);
    ``CLAUDE_CODE_USE_BEDROCK`` / ``CLAUDE_CODE_USE_VERTEX`` (a third-party provider whose own credentials are
    not checked here). A value is only ever tested for presence.
    """
    now = utc_now()

    def ok(method: str, hint: str | None, message: str) -> AuthStatus:
        return AuthStatus(runtime="claude", state=AuthState.AUTHENTICATED, method=method, checked_at=now,
                          account_hint=hint, message=message)

    for variable in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN"):
        if env.get(variable):
            return ok("api_key", f"{variable} from the namespace environment",
                      f"using the {variable} configured for this namespace")
    if env.get("CLAUDE_CODE_OAUTH_TOKEN"):
        return ok("oauth_token", "CLAUDE_CODE_OAUTH_TOKEN from the namespace environment",
                  "using the CLAUDE_CODE_OAUTH_TOKEN configured for this namespace")
    for variable, provider in (("CLAUDE_CODE_USE_BEDROCK", "Amazon Bedrock"),
                               ("CLAUDE_CODE_USE_VERTEX", "Google Vertex AI")):
        if _truthy(env.get(variable)):
            return ok("third_party", provider, f"{variable} is set: Claude Code uses {provider} with its own "
                      "credentials (not checked by CodeSDK)")
    credentials = config_dir(env) / ".credentials.json"
    if credentials.exists():
        hint = None
        account = _global_config(env).get("oauthAccount")
        if isinstance(account, dict) and (email := account.get("emailAddress")):
            hint = _mask(str(email))
        return ok("oauth_local", hint, f"claude.ai login found in {credentials.parent}")
    if _global_config(env).get("primaryApiKey"):
        return ok("api_key", "/login managed key", f"Console login's API key found in {global_config_file(env)}")
    return AuthStatus(runtime="claude", state=AuthState.UNAUTHENTICATED, checked_at=now,
                      message="not logged in: " + login_instructions(env))


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
            # the global config holds account data: no hash
            if kind != "global_config" and (digest := source_sha256(path)) is not None:
                entry["sha256"] = digest
            found.append(entry)
    return {
        "policy": "--setting-sources= (no user/project/local settings, no CLAUDE.md), --strict-mcp-config "
                  "(only CodeSDK's MCP server), no plugins, built-in tools off unless enabled",
        "home": str(home),
        "found": found,
    }
