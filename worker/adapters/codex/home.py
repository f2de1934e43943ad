"""Auth state and implicit sources of Codex inside one credential namespace (its ``CODEX_HOME``).

Nothing here reads a secret's value beyond deciding that it exists, and nothing starts the binary.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from codesdk.protocol import AuthState, AuthStatus, utc_now

from .._namespace_home import namespace_of
from .._source_hash import source_sha256
from .launch import codex_home


def login_instructions(env: Mapping[str, str]) -> str:
    """How an operator gives this namespace credentials (CodeSDK never opens a browser)."""
    found = namespace_of(env)
    if found is not None:
        name, data_dir = found
        login = (f"`codesdk auth login --runtime codex --namespace {name} --data-dir {data_dir}` (it runs "
                 "`codex login --device-auth` with this namespace's CODEX_HOME)")
        key = (f"`codesdk-supervisor namespace env set --data-dir {data_dir} {name} OPENAI_API_KEY` (the value "
               "is read from stdin)")
    else:
        login = f"`CODEX_HOME={codex_home(env)} codex login --device-auth` as the service user"
        key = "OPENAI_API_KEY in this namespace's environment"
    return f"configure {key} (and OPENAI_BASE_URL for another Responses API), or log in with {login}"


def auth_status(env: Mapping[str, str]) -> AuthStatus:
    """``OPENAI_API_KEY`` in the namespace's environment (CodeSDK's provider), else a ``codex login`` in its
    ``CODEX_HOME`` (``auth.json``: an API key or a ChatGPT account), else not logged in."""
    now = utc_now()
    if env.get("OPENAI_API_KEY"):
        base = env.get("OPENAI_BASE_URL")
        return AuthStatus(runtime="codex", state=AuthState.AUTHENTICATED, method="api_key", checked_at=now,
                          account_hint="OPENAI_API_KEY from the namespace environment",
                          message="using the OPENAI_API_KEY configured for this namespace"
                                  + (f" with {base}" if base else ""))
    auth = codex_home(env) / "auth.json"
    try:
        stored = json.loads(auth.read_text())
    except (OSError, ValueError):
        stored = None
    if isinstance(stored, dict):
        mode = str(stored.get("auth_mode") or ("apikey" if stored.get("OPENAI_API_KEY") else "chatgpt"))
        method = "api_key" if mode == "apikey" else "oauth_local"
        return AuthStatus(runtime="codex", state=AuthState.AUTHENTICATED, method=method, checked_at=now,
                          account_hint=f"codex login ({mode})", message=f"codex login found in {auth.parent}")
    return AuthStatus(runtime="codex", state=AuthState.UNAUTHENTICATED, checked_at=now,
                      message="not logged in: " + login_instructions(env))


def implicit_sources(env: Mapping[str, str], cwd: Path) -> dict[str, Any]:
    """What Codex would load on its own, and what we do with each: recorded, never silently used."""
    home = codex_home(env)
    candidates = {"user_config": (home / "config.toml", False), "user_instructions": (home / "AGENTS.md", False),
                  "project_instructions": (cwd / "AGENTS.md", False), "project_config": (cwd / ".codex", False),
                  "project_skills": (cwd / ".agents" / "skills", False), "user_skills": (home / "skills", False),
                  "login": (home / "auth.json", True)}
    found = []
    for kind, (path, used) in candidates.items():
        if path.exists():
            entry: dict[str, Any] = {"kind": kind, "path": str(path), "used": used}
            # the login holds credentials: no hash
            if kind != "login" and (digest := source_sha256(path)) is not None:
                entry["sha256"] = digest
            found.append(entry)
    return {
        "policy": "Codex's own base instructions are sent; project docs (AGENTS.md) off (project_doc_max_bytes=0), "
                  "skills' instructions off (skills.include_instructions=false); built-in tools, plugins, apps, web "
                  "search, hooks and MCP servers off; CodeSDK's tools as dynamic tools only",
        "codex_home": str(home),
        "found": found,
    }




def stored_thread(env: Mapping[str, str], thread_id: str) -> bool:
    """Whether Codex still has the thread's rollout, which ``thread/resume`` reads:
    ``CODEX_HOME/sessions/<yyyy>/<mm>/<dd>/rollout-<time>-<thread id>.jsonl``."""
    if not thread_id or "/" in thread_id or any(c in thread_id for c in "*?["):
        return False
    sessions = codex_home(env) / "sessions"
    return any(path.is_file() for path in sessions.glob(f"*/*/*/rollout-*-{thread_id}.jsonl"))
