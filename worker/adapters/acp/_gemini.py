"""Gemini CLI as an ACP agent: ``node …/@google/gemini-cli/bundle/gemini.js --acp``.

Everything CodeSDK requires of it is merged into the namespace's user settings (``~/.gemini/settings.json``) before
each start, over whatever else they hold: its 16 built-in tools excluded (only CodeSDK's MCP tools are offered), no
telemetry, update checks, IDE, skills, hooks, agents or checkpoints, bounded retries, and session retention off (its
clean-up would delete a session's transcript that a later task loads). (Gemini's *system* settings would win over
everything, but it reads them only from a root-owned path no group or other may write, which a namespace HOME is
not.) Stdio MCP servers need a trusted folder, so the workspace is trusted (``GEMINI_CLI_TRUST_WORKSPACE``), and
Gemini would merge a trusted workspace's settings over the user's: a workspace holding ``.gemini/`` or ``.env``
(settings, policies, hooks, variables) is refused instead.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from codesdk.procs.launch import Launch
from .._api_failures import is_unreachable
from .._installed import node_modules
from ._profile import (
    MCP_SERVER_NAME,
    AcpSettings,
    AgentProfile,
    Credentials,
    env_set_hint,
    home,
    runtime_env,
    write_private,
)

#: Gemini's own tools, all excluded: CodeSDK's tools are the only ones its model is offered.
BUILTIN_TOOLS = ("update_topic", "list_directory", "read_file", "grep_search", "glob", "activate_skill", "replace",
                 "write_file", "web_fetch", "run_shell_command", "list_background_processes",
                 "read_background_output", "google_web_search", "write_todos", "enter_plan_mode", "invoke_agent")
#: Gemini's user settings, under the namespace HOME: CodeSDK's settings are merged into them before each start.
USER_SETTINGS = Path(".gemini") / "settings.json"
#: A name no recorder of Gemini's produces (it names transcripts after the current UTC minute): a transcript renamed
#: to it before a load cannot be overwritten by the loading process's own stub.
_KEPT_TRANSCRIPT = "session-2000-01-01T00-00-{short}.jsonl"
#: The model API's HTTP status as Gemini words it in an error message.
_STATUS_IN_TEXT = re.compile(r"\b(?:HTTP|status(?:\s*code)?)\W{0,3}([45]\d\d)\b|\[([45]\d\d) [A-Z][a-z]", re.IGNORECASE)


class GeminiProfile(AgentProfile):
    name = "gemini"
    title = "Gemini CLI"
    package = "@google/gemini-cli"
    version = "0.61.0"
    context_window_tokens = 1_048_576  # the window of the Gemini models it defaults to
    parallel_tool_calls = False  # its ACP session runs a turn's calls in order, each answered before the next
    handshake_timeout_s = 60.0
    exit_grace_s = 0.0  # with an MCP server attached it does not exit on stdin EOF: SIGTERM at once (its transcript
    # is written as the turn goes; it exits on SIGTERM in ~50 ms)
    default_max_retries = 2
    unsafe_workspace_entries = (".gemini", ".env")
    context_files = ("GEMINI.md",)

    def _bundle(self, environ: Mapping[str, str]) -> Path:
        return node_modules(environ) / "@google" / "gemini-cli" / "bundle" / "gemini.js"

    def program(self, environ: Mapping[str, str]) -> list[str] | None:
        node = shutil.which("node", path=environ.get("PATH") or None)
        bundle = self._bundle(environ)
        return [node, str(bundle)] if node and bundle.is_file() else None

    def missing_reason(self, environ: Mapping[str, str]) -> str:
        if not self._bundle(environ).is_file():
            return self.not_installed(environ)
        return f"{self.title} needs node (>= 20) on the worker's PATH ({environ.get('PATH', '')})"

    def installed_version(self, environ: Mapping[str, str]) -> str:
        try:
            manifest = json.loads((self._bundle(environ).parents[1] / "package.json").read_text())
            return str(manifest["version"])
        except (OSError, ValueError, KeyError):
            return ""

    def tool_prefix(self) -> str:
        return f"mcp_{MCP_SERVER_NAME}_"

    def credentials(self, environ: Mapping[str, str]) -> Credentials:
        configure = (f"configure {env_set_hint(environ, 'GEMINI_API_KEY')} (and GOOGLE_GEMINI_BASE_URL for another "
                     "Gemini API endpoint)")
        if environ.get("GEMINI_API_KEY"):
            base = environ.get("GOOGLE_GEMINI_BASE_URL")
            return Credentials("api_key", "using the GEMINI_API_KEY configured for this namespace"
                               + (f" with {base}" if base else ""), configure)
        if (home(environ) / ".gemini" / "oauth_creds.json").is_file():
            return Credentials("oauth_local", "Gemini CLI login found in ~/.gemini", configure)
        return Credentials(None, f"not logged in: {configure}", configure)

    def enforced_settings(self, settings: AcpSettings, environ: Mapping[str, str]) -> dict[str, Any]:
        retries = self.default_max_retries if settings.max_retries is None else settings.max_retries
        auth = "gemini-api-key" if environ.get("GEMINI_API_KEY") else "oauth-personal"
        return {
            "security": {"auth": {"selectedType": auth}, "folderTrust": {"enabled": False}},
            "privacy": {"usageStatisticsEnabled": False},
            "telemetry": {"enabled": False, "logPrompts": False},
            "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False,
                        "maxAttempts": 1 + (retries or 0), "checkpointing": {"enabled": False},
                        "sessionRetention": {"enabled": False}},
            "ide": {"enabled": False}, "skills": {"enabled": False}, "hooksConfig": {"enabled": False},
            "experimental": {"enableAgents": False},
            "mcp": {"allowed": [MCP_SERVER_NAME]},
            "tools": {"exclude": list(BUILTIN_TOOLS)},
        }

    def prepare(self, settings: AcpSettings, environ: Mapping[str, str]) -> None:
        path = home(environ) / USER_SETTINGS
        try:
            existing = json.loads(path.read_text()) if path.is_file() and not path.is_symlink() else {}
        except (OSError, ValueError):
            existing = {}  # unreadable: replaced by ours
        merged = _merged(existing if isinstance(existing, dict) else {}, self.enforced_settings(settings, environ))
        write_private(path, json.dumps(merged, indent=1))

    def launch(self, program: list[str], settings: AcpSettings, *, cwd: str,
               environ: Mapping[str, str]) -> Launch:
        argv = [*program, "--acp"] + ([f"--model={settings.model}"] if settings.model else [])
        env = runtime_env(environ, cwd, {
            "GEMINI_CLI_NO_RELAUNCH": "true", "GEMINI_CLI_TRUST_WORKSPACE": "true",
            "GEMINI_TELEMETRY_ENABLED": "false", "NO_BROWSER": "true"})
        return Launch(argv=tuple(argv), env=env, cwd=cwd)

    def implicit_sources(self, environ: Mapping[str, str], cwd: Path) -> dict[str, Any]:
        gemini = home(environ) / ".gemini"
        candidates = {"user_memory": (gemini / "GEMINI.md", True),
                      "project_memory": (cwd / "GEMINI.md", True), "login": (gemini / "oauth_creds.json", True)}
        found = [{"kind": kind, "path": str(path), "used": used}
                 for kind, (path, used) in candidates.items() if path.exists()]
        return {"policy": "Gemini CLI's own system prompt is sent; GEMINI.md files are loaded by Gemini (recorded); "
                          "CodeSDK's settings (built-in tools excluded, telemetry, updates, hooks, skills and agents "
                          "off) are merged over the user settings before each start; a workspace with .gemini/ or .env is refused",
                "home": str(gemini), "found": found}

    def http_status(self, code: int, message: str, data: Any) -> int | None:
        """Gemini answers every failed turn with code 500: the API's own status is in its message ("HTTP 404",
        "[404 Not Found]", "status 401"); a connection that failed ("fetch failed") had none."""
        text = f"{message} {json.dumps(data, default=str)}"
        if (found := _STATUS_IN_TEXT.search(text)) is not None:
            return int(found.group(1) or found.group(2))
        if is_unreachable(text):
            return None
        return super().http_status(code, message, data)

    def api_base_url(self, settings: AcpSettings, environ: Mapping[str, str]) -> str | None:
        if not environ.get("GEMINI_API_KEY"):
            return None  # a login's endpoint is Gemini's to choose
        return environ.get("GOOGLE_GEMINI_BASE_URL") or "https://generativelanguage.googleapis.com"

    def session_never_stored(self, code: int, message: str, data: Any) -> bool:
        """Gemini records a session's transcript once a turn has an answer; a session whose turns all failed
        before one is "not found" when loaded."""
        return "No previous sessions found" in f"{message} {json.dumps(data)}"

    @staticmethod
    def _chats_dir(environ: Mapping[str, str], cwd: Path) -> Path:
        """Where Gemini keeps the transcripts of sessions in ``cwd``: ``~/.gemini/tmp/<project>/chats``, the
        project's short name as ``~/.gemini/projects.json`` records it (the directory's name, made safe)."""
        gemini = home(environ) / ".gemini"
        try:
            projects = json.loads((gemini / "projects.json").read_text()).get("projects", {})
        except (OSError, ValueError, AttributeError):
            projects = {}
        short = projects.get(str(cwd)) if isinstance(projects, dict) else None
        return gemini / "tmp" / (short if isinstance(short, str) and short.strip(".") and "/" not in short else cwd.name) / "chats"

    def stored_session(self, environ: Mapping[str, str], cwd: Path, session_id: str) -> bool | None:
        """A transcript of the session in the workspace's chats (its name carries the id's first 8 characters,
        its first line the whole id)."""
        if not session_id or any(c in session_id for c in "/*?["):
            return False
        try:
            for path in self._chats_dir(environ, cwd).glob(f"session-*-{session_id[:8]}.jsonl"):
                with path.open("rb") as file:
                    if session_id.encode() in file.readline(4096):
                        return True
        except OSError:
            return None
        return False

    def prepare_session_reuse(self, environ: Mapping[str, str], cwd: Path, session_id: str) -> None:
        """Gemini loads a session from ``~/.gemini/tmp/<project>/chats/session-<minute>-<id[:8]>.jsonl``, and a
        process that loads it writes a fresh stub to the current minute's name: within the session's first minute
        that is the transcript itself, which is then lost. Keep the longest file of the session under a name no
        recorder produces and drop the others (stubs of earlier loads)."""
        short = session_id[:8]
        chats = self._chats_dir(environ, cwd)
        try:
            files = sorted(chats.glob(f"session-*-{short}.jsonl"), key=lambda p: p.stat().st_size, reverse=True)
        except OSError:
            return
        if not files:
            return
        kept, rest = files[0], files[1:]
        for stub in rest:
            stub.unlink(missing_ok=True)
        target = chats / _KEPT_TRANSCRIPT.format(short=short)
        if kept != target:
            kept.replace(target)


def _merged(base: dict[str, Any], ours: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``ours`` merged in, ours winning (objects merged key by key, anything else replaced)."""
    merged = dict(base)
    for key, value in ours.items():
        below = merged.get(key)
        merged[key] = _merged(below, value) if isinstance(value, dict) and isinstance(below, dict) else value
    return merged
