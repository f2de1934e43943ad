"""How ACP agents are launched and configured, without starting them: pins, settings, environment, the config that
hides their own tools, workspaces refused, tool names, error statuses, and Gemini's session files before a load."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from protocol import ToolSpec
from worker.adapters.acp._adapter import _choose, visible_names
from worker.adapters.acp._gemini import BUILTIN_TOOLS, USER_SETTINGS, GeminiProfile
from worker.adapters.acp._opencode import OpenCodeProfile
from worker.adapters.acp._profile import AcpSettings, AgentProfile, BadAcpConfig, UnsafeWorkspace

from .harness import REPO

PROFILES: list[AgentProfile] = [GeminiProfile(), OpenCodeProfile()]


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
    assert launch.argv == ("node", "gemini.js", "--acp", "-m", "gemini-x")
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
                                                (OpenCodeProfile(), ".opencode"), (OpenCodeProfile(), "opencode.json")],
                         ids=lambda v: v if isinstance(v, str) else v.name)
def test_a_workspace_with_the_agents_own_config_is_refused(profile: AgentProfile, entry: str, tmp_path: Path) -> None:
    profile.check_workspace(tmp_path)
    (tmp_path / entry).symlink_to("/nowhere")  # even a dangling link: the agent would follow it later
    with pytest.raises(UnsafeWorkspace, match=f"remove it from {tmp_path}"):
        profile.check_workspace(tmp_path)


def test_tool_names_survive_every_agent_and_stay_unique() -> None:
    specs = tuple(ToolSpec(name=n) for n in ("workspace.read", "workspace_read", "a" * 100, "a" * 100 + ".b"))
    names = visible_names(specs, "mcp_codesdk_")
    assert list(names)[:2] == ["workspace_read", "workspace_read_2"]
    assert len(names) == 4 and all(len("mcp_codesdk_" + n) <= 64 for n in names)
    assert [spec.name for spec in names.values()] == [s.name for s in specs]


@pytest.mark.parametrize(("profile", "tool_call", "tool"), [
    (GeminiProfile(), {"toolCallId": "mcp_codesdk_workspace_read__mcp_codesdk_workspace_read_17_0",
                       "title": "workspace_read (codesdk MCP Server)"}, "workspace_read"),
    (GeminiProfile(), {"toolCallId": "run_shell_command_17", "title": "Shell"}, None),
    (OpenCodeProfile(), {"toolCallId": "call_0_17", "title": "codesdk_workspace_read"}, "workspace_read"),
    (OpenCodeProfile(), {"toolCallId": "call_1_17", "title": "bash"}, None),
], ids=["gemini-ours", "gemini-own", "opencode-ours", "opencode-own"])
def test_calls_of_codesdks_tools_are_told_from_the_agents_own(profile: AgentProfile, tool_call: dict[str, Any],
                                                              tool: str | None) -> None:
    assert profile.own_tool(tool_call, {"workspace_read": 1, "workspace_write": 1}) == tool


@pytest.mark.parametrize(("message", "data", "status"), [
    ("Internal error: Unauthorized: invalid api key", {"errorName": "APIError"}, 401),
    ("Internal error: Rate limit exceeded", {"errorName": "APIError"}, 429),
    ("Internal error: the server had an error (status code 503)", {"errorName": "APIError"}, 503),
    ("Internal error: something broke", {"errorName": "APIError"}, 500),
    ("Internal error: no provider", {"errorName": "UnknownError"}, None),
])
def test_opencode_errors_are_read_for_the_status_they_lost(message: str, data: dict[str, Any],
                                                          status: int | None) -> None:
    assert OpenCodeProfile().http_status(-32603, message, data) == status


def test_gemini_errors_carry_the_status_as_their_code() -> None:
    assert GeminiProfile().http_status(429, "quota", None) == 429
    assert GeminiProfile().http_status(-32603, "internal", None) is None


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
