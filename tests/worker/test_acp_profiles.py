"""How ACP agents are launched and configured, without starting them: pins, settings, environment, the config that
hides their own tools, workspaces refused, tool names and arguments, error statuses, sessions never stored, and
Gemini's session files before a load."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from codesdk.protocol import ToolSpec
from codesdk.worker.command import RUNTIMES_DIR_ENV
from codesdk.worker.adapters._tool_names import model_tool_names
from codesdk.worker.adapters.acp._adapter import _choose
from codesdk.worker.adapters.acp._codex_acp import DISABLED_FEATURES, CodexAcpProfile
from codesdk.worker.adapters.acp._gemini import BUILTIN_TOOLS, USER_SETTINGS, GeminiProfile
from codesdk.worker.adapters.acp._opencode import OpenCodeProfile
from codesdk.worker.adapters.acp._profile import AcpSettings, AgentProfile, BadAcpConfig, UnsafeWorkspace

from tests.worker.harness import REPO

PROFILES: list[AgentProfile] = [GeminiProfile(), OpenCodeProfile(), CodexAcpProfile()]


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: p.name)
def test_each_profile_pins_what_runtimes_package_json_pins(profile: AgentProfile) -> None:
    manifest = json.loads((REPO / "runtimes" / "package.json").read_text())
    pinned = {**manifest["dependencies"], **manifest.get("optionalDependencies", {})}
    assert pinned[profile.package] == profile.version


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: p.name)
def test_runtime_config_is_checked_and_explained(profile: AgentProfile) -> None:
    assert profile.settings({"model": "m", "stop_grace_s": 1}) == AcpSettings(model="m", stop_grace_s=1.0)
    for bad, says in (({"modle": "m"}, "modle"), ({"model": ""}, "model name"), ({"stop_grace_s": -1}, "seconds"),
                      ({"builtin_tools": ["Bash"]}, "built-in tools stay off"), ({"max_retries": 99}, "0 to 9")):
        with pytest.raises(BadAcpConfig, match=says):
            profile.settings(bad)


def test_opencode_says_it_decides_its_retries_itself() -> None:
    with pytest.raises(BadAcpConfig, match="decides its retries itself"):
        OpenCodeProfile().settings({"max_retries": 1})
    assert GeminiProfile().settings({"max_retries": 1}).max_retries == 1


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: p.name)
def test_the_agent_gets_the_namespace_env_without_codesdks_own(profile: AgentProfile, tmp_path: Path) -> None:
    environ = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "CODESDK_SCENARIO_DIR": "/x", "GEMINI_API_KEY": "k"}
    launch = profile.launch(["/bin/agent"], AcpSettings(model="m"), cwd=str(tmp_path), environ=environ)
    assert launch.cwd == str(tmp_path) and launch.argv[0] == "/bin/agent"
    assert "CODESDK_SCENARIO_DIR" not in launch.env and launch.env["HOME"] == str(tmp_path)
    assert launch.env["NO_COLOR"] == "1" and launch.env["PWD"] == str(tmp_path)


def test_gemini_settings_hide_its_tools_and_win_over_the_users(tmp_path: Path) -> None:
    environ = {"HOME": str(tmp_path), "GEMINI_API_KEY": "k"}
    path = tmp_path / USER_SETTINGS
    path.parent.mkdir()
    path.write_text(json.dumps({"tools": {"exclude": [], "allowed": ["x"]}, "model": {"name": "operators-choice"},
                                "hooksConfig": {"enabled": True}}))
    profile = GeminiProfile()
    profile.prepare(AcpSettings(max_retries=0), environ)
    written = json.loads(path.read_text())
    assert written["model"] == {"name": "operators-choice"} and written["tools"]["allowed"] == ["x"]
    assert path.stat().st_mode & 0o777 == 0o600
    assert sorted(written["tools"]["exclude"]) == sorted(BUILTIN_TOOLS)
    assert written["general"]["maxAttempts"] == 1 and written["general"]["sessionRetention"]["enabled"] is False
    assert written["security"]["auth"]["selectedType"] == "gemini-api-key"
    assert written["mcp"]["allowed"] == ["codesdk"] and written["hooksConfig"]["enabled"] is False
    launch = profile.launch(["node", "gemini.js"], AcpSettings(model="gemini-x"), cwd="/w", environ=environ)
    assert launch.argv == ("node", "gemini.js", "--acp", "--model=gemini-x")
    assert launch.env["GEMINI_CLI_NO_RELAUNCH"] == "true" and launch.env["GEMINI_TELEMETRY_ENABLED"] == "false"


def test_a_planted_link_is_replaced_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.json"
    target.write_text("keep me")
    (tmp_path / ".gemini").mkdir()
    (tmp_path / USER_SETTINGS).symlink_to(target)
    GeminiProfile().prepare(AcpSettings(), {"HOME": str(tmp_path), "GEMINI_API_KEY": "k"})
    assert target.read_text() == "keep me" and not (tmp_path / USER_SETTINGS).is_symlink()


def test_opencode_takes_the_operators_provider_but_not_its_tools_or_plugins() -> None:
    given = {"provider": {"p": {"options": {"baseURL": "http://x"}}}, "model": "p/a",
             "permission": {"*": "allow"}, "mcp": {"evil": {"type": "local", "command": ["sh"]}},
             "plugin": ["evil"], "share": "auto"}
    profile = OpenCodeProfile()
    launch = profile.launch(["opencode"], AcpSettings(model="p/b"), cwd="/w",
                            environ={"OPENCODE_CONFIG_CONTENT": json.dumps(given)})
    config = json.loads(launch.env["OPENCODE_CONFIG_CONTENT"])
    assert config["provider"] == given["provider"] and config["model"] == "p/b"
    assert config["permission"] == {"*": "deny", "codesdk_*": "ask"}
    assert "mcp" not in config and "plugin" not in config and config["share"] == "disabled"
    assert launch.argv == ("opencode", "acp") and launch.env["OPENCODE_DISABLE_PROJECT_CONFIG"] == "true"
    for broken, says in (("{not json", "not JSON"), ("[1]", "JSON object")):
        with pytest.raises(BadAcpConfig, match=says):
            profile.prepare(AcpSettings(), {"OPENCODE_CONFIG_CONTENT": broken})


@pytest.mark.parametrize(("profile", "entry"), [(GeminiProfile(), ".gemini"), (GeminiProfile(), ".env"),
                                                (OpenCodeProfile(), ".opencode"), (OpenCodeProfile(), "opencode.json"),
                                                (CodexAcpProfile(), ".codex")],
                         ids=lambda v: v if isinstance(v, str) else v.name)
def test_a_workspace_with_the_agents_own_config_is_refused(profile: AgentProfile, entry: str, tmp_path: Path) -> None:
    profile.check_workspace(tmp_path)
    (tmp_path / entry).symlink_to("/nowhere")  # even a dangling link: the agent would follow it later
    with pytest.raises(UnsafeWorkspace, match=f"remove it from {tmp_path}"):
        profile.check_workspace(tmp_path)


def test_tool_names_survive_every_agent_and_stay_unique() -> None:
    specs = tuple(ToolSpec(name=n) for n in ("workspace.read", "workspace_read", "a" * 100, "a" * 100 + ".b"))
    names = model_tool_names(specs, "mcp_codesdk_")
    assert list(names)[:2] == ["workspace_read", "workspace_read_2"]
    assert len(names) == 4 and all(len("mcp_codesdk_" + n) <= 64 for n in names)
    assert [spec.name for spec in names.values()] == [s.name for s in specs]


@pytest.mark.parametrize(("profile", "tool_call", "tool"), [
    (GeminiProfile(), {"toolCallId": "mcp_codesdk_workspace_read__mcp_codesdk_workspace_read_17_0",
                       "title": "workspace_read (codesdk MCP Server)"}, "workspace_read"),
    (GeminiProfile(), {"toolCallId": "run_shell_command_17", "title": "Shell"}, None),
    (OpenCodeProfile(), {"toolCallId": "call_0_17", "title": "codesdk_workspace_read"}, "workspace_read"),
    (OpenCodeProfile(), {"toolCallId": "call_1_17", "title": "bash"}, None),
    (CodexAcpProfile(), {"toolCallId": "call_a1", "title": "Tool: codesdk/workspace_read",
                         "rawInput": {"server": "codesdk", "tool": "workspace_read", "arguments": {"path": "a"}}},
     "workspace_read"),
    (CodexAcpProfile(), {"toolCallId": "call_a1", "title": "Approve MCP tool call", "rawInput": {
        "server_name": "codesdk", "id": "mcp_tool_call_approval_call_a1",
        "request": {"message": 'Allow the codesdk MCP server to run tool "workspace_write"?'}}}, "workspace_write"),
    (CodexAcpProfile(), {"toolCallId": "call_b2", "title": "Tool: codex/list_mcp_resources",
                         "rawInput": {"server": "codex", "tool": "list_mcp_resources", "arguments": {}}}, None),
    (CodexAcpProfile(), {"toolCallId": "call_c3", "title": "Tool: codesdk/workspace_exec"}, None),
    (CodexAcpProfile(), {"toolCallId": "call_d4", "title": "Edit a.txt", "kind": "edit"}, None),
], ids=["gemini-ours", "gemini-own", "opencode-ours", "opencode-own", "codex-acp-call", "codex-acp-approval",
        "codex-acp-own-mcp", "codex-acp-not-offered", "codex-acp-patch"])
def test_calls_of_codesdks_tools_are_told_from_the_agents_own(profile: AgentProfile, tool_call: dict[str, Any],
                                                              tool: str | None) -> None:
    assert profile.own_tool(tool_call, {"workspace_read": 1, "workspace_write": 1}) == tool


@pytest.mark.parametrize(("message", "data", "status"), [
    ("Internal error: Unauthorized: invalid api key", {"errorName": "APIError"}, 401),
    ("Internal error: Rate limit exceeded", {"errorName": "APIError"}, 429),
    ("Internal error: the server had an error (status code 503)", {"errorName": "APIError"}, 503),
    ("Internal error: something broke", {"errorName": "APIError"}, 500),
    ("Internal error: no provider", {"errorName": "UnknownError"}, None),
    ("Internal error: Not Found", {"errorName": "APIError"}, 404),
    ("Internal error: Cannot connect to API: Unable to connect. Is the computer able to access the url?",
     {"errorName": "APIError"}, None),
])
def test_opencode_errors_are_read_for_the_status_they_lost(message: str, data: dict[str, Any],
                                                          status: int | None) -> None:
    assert OpenCodeProfile().http_status(-32603, message, data) == status


@pytest.mark.parametrize(("data", "status"), [
    ({"message": "unexpected status 401 Unauthorized: bad key, url: http://x/v1/responses", "codex_error_info": "other"},
     401),
    ({"message": "exceeded retry limit, last status: 429 Too Many Requests",
      "codex_error_info": {"response_too_many_failed_attempts": {"http_status_code": 429}}}, 429),
    ({"message": "We're currently experiencing high demand", "codex_error_info": "internal_server_error"}, 500),
    ({"message": "Codex ran out of room in the model's context window", "codex_error_info": "context_window_exceeded"},
     413),
    ({"message": "stream disconnected", "codex_error_info": {"response_stream_disconnected": {"http_status_code": None}}},
     None),
    ({"message": "something else", "codex_error_info": "other"}, None),
])
def test_codex_acp_errors_carry_the_status_in_their_data(data: dict[str, Any], status: int | None) -> None:
    assert CodexAcpProfile().http_status(-32603, "Internal error", data) == status


def test_codex_acp_arguments_come_from_the_call_or_the_approval_request() -> None:
    profile = CodexAcpProfile()
    call = {"rawInput": {"server": "codesdk", "tool": "workspace_read", "arguments": {"path": "a.txt"}}}
    approval = {"rawInput": {"server_name": "codesdk", "request": {"_meta": {"tool_params": {"path": "b.txt"}}}}}
    assert profile.tool_arguments(call) == {"path": "a.txt"}
    assert profile.tool_arguments(approval) == {"path": "b.txt"}
    assert profile.tool_arguments({"rawInput": {}}) is None


def test_only_a_session_codex_acp_has_no_rollout_of_is_never_stored() -> None:
    profile = CodexAcpProfile()
    assert profile.session_never_stored(-32002, "Resource not found", None)
    assert not profile.session_never_stored(-32603, "Internal error", {"message": "rollout unreadable"})


def test_codex_acp_runs_in_the_namespace_codex_home_with_codesdks_provider_and_its_tools_off(tmp_path: Path) -> None:
    codex_home = tmp_path / ".codex"
    codex_home.mkdir()
    (codex_home / "config.toml").write_text('model = "operators"\n[mcp_servers.theirs]\ncommand = "touch"\n'
                                            '[mcp_servers.codesdk]\ncommand = "x"\n')
    environ = {"HOME": str(tmp_path), "OPENAI_API_KEY": "sk-k", "OPENAI_BASE_URL": "http://127.0.0.1:9/v1",
               "CODEX_HOME": "/another/namespace", "CODEX_SQLITE_HOME": "/another/db"}
    profile = CodexAcpProfile()
    settings = profile.settings({"model": "gpt-x", "max_retries": 1})
    profile.prepare(settings, environ)
    launch = profile.launch(["/bin/codex-acp"], settings, cwd="/w", environ=environ)
    assert launch.argv[0] == "/bin/codex-acp" and len(launch.argv) % 2 == 1
    given = dict(pair.split("=", 1) for pair in launch.argv[2::2])
    assert all(flag == "-c" for flag in launch.argv[1::2])
    assert given["model"] == '"gpt-x"' and given["model_provider"] == '"codesdk"'
    assert given["model_providers.codesdk.base_url"] == '"http://127.0.0.1:9/v1"'
    assert given["model_providers.codesdk.env_key"] == '"OPENAI_API_KEY"' and "sk-k" not in " ".join(launch.argv)
    assert given["model_providers.codesdk.request_max_retries"] == "1"
    assert all(given[f"features.{feature}"] == "false" for feature in DISABLED_FEATURES)
    assert given["web_search"] == '"disabled"' and given["project_doc_max_bytes"] == "0"
    assert given["approval_policy"] == '"untrusted"' and given["sandbox_mode"] == '"read-only"'
    assert given["mcp_servers.theirs.enabled"] == "false" and "mcp_servers.codesdk.enabled" not in given
    assert launch.env["CODEX_HOME"] == str(codex_home) and "CODEX_SQLITE_HOME" not in launch.env


def test_codex_acp_without_an_api_key_uses_codexs_own_login(tmp_path: Path) -> None:
    profile = CodexAcpProfile()
    environ = {"HOME": str(tmp_path)}
    assert profile.credentials(environ).method is None
    profile.prepare(AcpSettings(), environ)
    assert (tmp_path / ".codex").stat().st_mode & 0o777 == 0o700  # Codex refuses a CODEX_HOME that does not exist
    launch = profile.launch(["codex-acp"], AcpSettings(), cwd="/w", environ=environ)
    assert "model_provider" not in " ".join(launch.argv)
    (tmp_path / ".codex" / "auth.json").write_text("{}")
    assert profile.credentials(environ).method == "oauth_local"
    assert profile.credentials({**environ, "OPENAI_API_KEY": "k"}).method == "api_key"


def test_gemini_errors_carry_the_status_as_their_code() -> None:
    assert GeminiProfile().http_status(429, "quota", None) == 429
    assert GeminiProfile().http_status(-32603, "internal", None) is None


def test_gemini_errors_are_read_for_the_status_its_500_hides() -> None:
    """Issue 33: Gemini answers every failed turn with code 500; a 404 was taken for a retryable 500, and so was a
    connection that never got an answer."""
    assert GeminiProfile().http_status(500, "fake error: HTTP 404 (NOT_FOUND)", None) == 404
    assert GeminiProfile().http_status(500, "[401 Unauthorized] API key not valid", None) == 401
    assert GeminiProfile().http_status(500, "exception TypeError: fetch failed sending request", None) is None
    assert GeminiProfile().http_status(500, "internal", None) == 500


def test_each_agent_names_the_base_url_it_calls_and_never_a_key() -> None:
    from codesdk.worker.adapters._api_failures import api_failure, shown_url
    from codesdk.worker.adapters.acp._profile import AcpSettings

    settings = AcpSettings(model="fake/fake-model")
    assert GeminiProfile().api_base_url(settings, {"GEMINI_API_KEY": "k",
                                                   "GOOGLE_GEMINI_BASE_URL": "http://h:1"}) == "http://h:1"
    assert CodexAcpProfile().api_base_url(settings, {"OPENAI_API_KEY": "k"}) == "https://api.openai.com/v1"
    config = {"provider": {"fake": {"options": {"baseURL": "http://h:2/v1", "apiKey": "sk-x"}}}}
    assert OpenCodeProfile().api_base_url(settings, {"OPENCODE_CONFIG_CONTENT": json.dumps(config)}) == "http://h:2/v1"
    assert shown_url("https://user:sk-secret@h:3/v1?key=sk-secret") == "https://h:3/v1"
    code, retryable, where = api_failure(None, True, "http://h:4")
    assert (code, retryable) == ("API_UNREACHABLE", True) and "http://h:4" in where


def test_permission_answers_pick_by_kind_and_never_allow_always() -> None:
    options = [{"optionId": "always", "kind": "allow_always"}, {"optionId": "once", "kind": "allow_once"},
               {"optionId": "no", "kind": "reject_once"}]
    assert _choose(options, "allow_once") == {"outcome": {"outcome": "selected", "optionId": "once"}}
    assert _choose(options, "reject_once") == {"outcome": {"outcome": "selected", "optionId": "no"}}
    assert _choose(options[:1], "allow_once") == {"outcome": {"outcome": "cancelled"}}


def test_before_a_load_gemini_keeps_the_sessions_transcript_under_a_name_no_recorder_makes(tmp_path: Path) -> None:
    session = "4bc6a423-f6cc-4846-ba5c-c46baa1ee87a"
    chats = tmp_path / ".gemini" / "tmp" / "ws" / "chats"
    chats.mkdir(parents=True)
    (chats / "session-2026-11-23T10-00-4bc6a423.jsonl").write_text("x" * 5000)  # the transcript
    (chats / "session-2026-11-23T10-03-4bc6a423.jsonl").write_text("stub")  # an earlier load's stub
    (chats / "session-2026-11-23T10-03-ffffffff.jsonl").write_text("another session")
    GeminiProfile().prepare_session_reuse({"HOME": str(tmp_path)}, Path("/somewhere/ws"), session)
    assert sorted(os.listdir(chats)) == ["session-2000-01-01T00-00-4bc6a423.jsonl",
                                         "session-2026-11-23T10-03-ffffffff.jsonl"]
    assert (chats / "session-2000-01-01T00-00-4bc6a423.jsonl").read_text() == "x" * 5000


def test_an_agent_keeping_a_tool_of_its_own_runs_only_where_the_operator_opted_in(tmp_path: Path) -> None:
    profile = CodexAcpProfile()
    environ = {"HOME": str(tmp_path), "PATH": os.environ.get("PATH", ""), RUNTIMES_DIR_ENV: str(REPO / "runtimes")}
    if profile.program(environ) is None:
        pytest.skip(profile.missing_reason(environ))
    refusal = profile.refusal(environ)
    assert refusal is not None and "CODESDK_ALLOW_CODEX_ACP=1" in refusal and "view_image" in refusal
    assert profile.refusal({**environ, "CODESDK_ALLOW_CODEX_ACP": "1"}) is None
    assert GeminiProfile().opt_in is None and OpenCodeProfile().opt_in is None


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: p.name)
def test_a_model_name_can_never_be_an_option_of_the_agent(profile: AgentProfile) -> None:
    for good in ("gemini-2.5-flash", "fake/fake-model", "gpt-5.4-mini", "models/x@2025:1+beta"):
        assert profile.settings({"model": good}).model == good
    for bad in ("--version", "-m=x", "--yolo", " x", "a b", "x\n--y", "x" * 201):
        with pytest.raises(BadAcpConfig, match="model name"):
            profile.settings({"model": bad})


@pytest.mark.parametrize(("profile", "name"), [(GeminiProfile(), "GEMINI.md"), (OpenCodeProfile(), "AGENTS.md"),
                                               (OpenCodeProfile(), "CLAUDE.md"), (CodexAcpProfile(), "AGENTS.md")],
                         ids=lambda v: v if isinstance(v, str) else v.name)
def test_an_instructions_file_that_is_not_a_plain_file_is_refused(profile: AgentProfile, name: str,
                                                                 tmp_path: Path) -> None:
    """A link would have the agent read whatever it points at (``/proc/self/environ``: the namespace's keys) into
    its model's instructions; a FIFO would hang it."""
    (tmp_path / name).write_text("plain instructions are fine\n")
    profile.check_workspace(tmp_path)
    (tmp_path / name).unlink()
    (tmp_path / name).symlink_to("/proc/self/environ")
    with pytest.raises(UnsafeWorkspace, match="not a plain file"):
        profile.check_workspace(tmp_path)
    (tmp_path / name).unlink()
    os.mkfifo(tmp_path / name)
    with pytest.raises(UnsafeWorkspace, match="not a plain file"):
        profile.check_workspace(tmp_path)
