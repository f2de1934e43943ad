"""Claude Code specifics, with the real CLI talking to the fake Anthropic API inside the namespace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from fixtures.fake_anthropic import FakeAnthropic
from protocol import AuthState, EventType, PermissionMode
from supervisor.engine._transcript import session_events
from supervisor.store import TaskState
from worker.adapters.claude import _env
from worker.adapters.claude._env import cli_path

from ..contract.cases import ClaudeCase, workspace
from ..e2e.conftest import of_type
from ..e2e.invariants import check_session
from ..netns import skip_outside_netns

needs_claude = pytest.mark.skipif(cli_path() is None, reason="claude-agent-sdk is not installed")


@pytest.fixture
def fake(tmp_path: Path):
    with FakeAnthropic.start(tmp_path / "api.jsonl") as server:
        yield server


async def _task(engine, session_id: str, prompt: str, **kwargs):
    task = await engine.start_task(session_id, prompt, **kwargs)
    record = await engine.wait_task(task.task_id)
    events = [e for e in await session_events(engine.store, session_id) if e.trace.task_id == task.task_id]
    return record, events


@pytest.mark.runtime
@skip_outside_netns
@needs_claude
async def test_second_request_carries_the_approved_result_and_the_denial(make_engine, fake, tmp_path) -> None:
    ws = workspace(tmp_path)
    case = ClaudeCase(fake.base_url)
    turn = case.tools(("workspace.read", {"path": "a.txt"}), ("workspace.write", {"path": "b.txt", "content": "x"}))
    with trio.fail_after(120):
        async with make_engine(worker_env={"*": case.worker_env()}) as engine:
            session = await engine.create_session(runtime="claude", workspace=ws)
            record, events = await _task(engine, session.session_id, turn.prompt, permission_mode=PermissionMode.ASK)
    assert record.state == TaskState.COMPLETED
    requested = {p.tool_name: p for p in of_type(events, EventType.TOOL_CALL_REQUESTED)}
    bodies = [r["body"] for r in fake.requests("/v1/messages")]
    assert len(bodies) == 2
    first_reply = [b for b in fake.requests("/v1/messages")[0]["reply"]["content"] if b["type"] == "tool_use"]
    assert {b["id"] for b in first_reply} == {p.runtime_tool_call_id for p in requested.values()}
    results = {block["tool_use_id"]: block for block in bodies[1]["messages"][-1]["content"]
               if block.get("type") == "tool_result"}
    read = results[requested["workspace.read"].runtime_tool_call_id]
    write = results[requested["workspace.write"].runtime_tool_call_id]
    read_text = read["content"] if isinstance(read["content"], str) else read["content"][0]["text"]
    assert json.loads(read_text)["text"] == "alpha\n" and not read.get("is_error")
    assert write["is_error"] is True and "non-interactive" in json.dumps(write["content"])
    assert bodies[0]["tools"] and {t["name"] for t in bodies[0]["tools"]} == {
        "mcp__codesdk__workspace_read", "mcp__codesdk__workspace_write", "mcp__codesdk__patch_apply",
        "mcp__codesdk__workspace_list"}  # our tools only: no built-ins


@pytest.mark.runtime
@skip_outside_netns
@needs_claude
@pytest.mark.parametrize(("directive", "code", "retryable"), [
    ("ERROR 429", "RATE_LIMITED", True), ("ERROR 401", "AUTH_REQUIRED", False), ("ERROR 529", "OVERLOADED", True),
    ("ERROR 500", "API_ERROR", True), ("ERROR prompt_too_long", "CONTEXT_TOO_LARGE", False),
])
async def test_api_errors_become_structured_failures(make_engine, fake, directive, code, retryable) -> None:
    case = ClaudeCase(fake.base_url)
    with trio.fail_after(120):
        async with make_engine(worker_env={"*": case.worker_env()}) as engine:
            session = await engine.create_session(runtime="claude")
            record, events = await _task(engine, session.session_id, directive)
    failed = of_type(events, EventType.TASK_FAILED)
    assert record.state == TaskState.FAILED and len(failed) == 1
    assert (failed[0].code, failed[0].retryable) == (code, retryable), failed[0]


@pytest.mark.runtime
@skip_outside_netns
@needs_claude
async def test_a_session_resumes_the_runtime_session_and_keeps_raw_messages_as_blobs(make_engine, fake,
                                                                                     tmp_path) -> None:
    case = ClaudeCase(fake.base_url)
    with trio.fail_after(120):
        async with make_engine(worker_env={"*": case.worker_env()}) as engine:
            session = await engine.create_session(runtime="claude")
            first, events1 = await _task(engine, session.session_id, "first question")
            runtime_session_id = (await engine.store.get_session(session.session_id)).runtime_session_id
            second, events2 = await _task(engine, session.session_id, "second question")
            completed = of_type(events1, EventType.RUNTIME_REQUEST_COMPLETED)
            raw_refs = [e.runtime.raw_ref for e in events1 if e.type == EventType.RUNTIME_REQUEST_COMPLETED]
            raw = json.loads(await engine.store.get_blob(raw_refs[0]))
            all_events = await session_events(engine.store, session.session_id)
    check_session(all_events)
    assert first.state == second.state == TaskState.COMPLETED
    assert runtime_session_id and all(e.runtime.runtime_session_id == runtime_session_id for e in events2)
    assert completed and raw[0]["type"] == "message_start" and raw[-1]["type"] == "message_stop"
    # The second turn went to the model with the first one in its history (Claude's own session, resumed).
    history = json.dumps(fake.requests("/v1/messages")[-1]["body"]["messages"])
    assert "first question" in history and "Echo: first question" in history
    # Claude's state lives in the namespace's HOME, nowhere else.
    home = tmp_path / "data" / "namespaces" / "default" / "home"
    assert (home / ".claude").is_dir()


def test_auth_status_never_reveals_secrets(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".claude").mkdir(parents=True)
    none = _env.auth_status({"HOME": str(home)})
    assert none.state == AuthState.UNAUTHENTICATED and "claude login" in none.message
    key = _env.auth_status({"HOME": str(home), "ANTHROPIC_API_KEY": "sk-secret-value"})
    assert (key.state, key.method) == (AuthState.AUTHENTICATED, "api_key")
    assert "sk-secret-value" not in key.model_dump_json()
    (home / ".claude" / ".credentials.json").write_text('{"claudeAiOauth": {"accessToken": "tok-secret"}}')
    (home / ".claude.json").write_text('{"oauthAccount": {"emailAddress": "alice@example.com"}}')
    oauth = _env.auth_status({"HOME": str(home)})
    assert (oauth.state, oauth.method, oauth.account_hint) == (AuthState.AUTHENTICATED, "oauth_local", "a***@example.com")
    assert "tok-secret" not in oauth.model_dump_json()


def test_implicit_sources_name_files_without_reading_secrets(tmp_path: Path) -> None:
    home, cwd = tmp_path / "home", tmp_path / "work"
    (home / ".claude").mkdir(parents=True)
    cwd.mkdir()
    (home / ".claude" / "settings.json").write_text('{"hooks": {}}')
    (home / ".claude.json").write_text('{"oauthAccount": {"emailAddress": "alice@example.com"}}')
    (cwd / "CLAUDE.md").write_text("# project memory")
    report = _env.implicit_sources({"HOME": str(home)}, cwd)
    kinds = {entry["kind"]: entry for entry in report["found"]}
    assert set(kinds) == {"user_settings", "global_config", "project_memory"}
    assert all(not entry["used"] for entry in report["found"])
    assert kinds["user_settings"]["sha256"].startswith("sha256:") and "sha256" not in kinds["global_config"]
    assert "alice" not in json.dumps(report)


@pytest.mark.runtime
@skip_outside_netns
@needs_claude
async def test_stopping_during_a_builtin_command_ends_its_processes(make_engine, fake, tmp_path) -> None:
    ws = workspace(tmp_path)
    marker = ws / "marker"
    case = ClaudeCase(fake.base_url)
    command = f"python3 -c 'import time; time.sleep(37.5)' && touch {marker}"  # Claude refuses bare long sleeps
    prompt = "CALL Bash " + json.dumps({"command": command})
    with trio.fail_after(90):
        async with make_engine(worker_env={"*": case.worker_env()}) as engine:
            session = await engine.create_session(runtime="claude", workspace=ws)
            task = await engine.start_task(session.session_id, prompt, permission_mode=PermissionMode.YOLO,
                                           runtime_config={"builtin_tools": ["Bash"], "stop_grace_s": 1})
            async with engine.store.subscribe(session.session_id) as sub:
                async for event in sub:
                    if event.type == EventType.TOOL_CALL_STARTED:
                        break
            with trio.fail_after(20):
                while not _sleepers():
                    await trio.sleep(0.05)
            await engine.stop_task(task.task_id, reason="user stop")
            with trio.fail_after(20):
                while _sleepers():
                    await trio.sleep(0.1)
            events = await session_events(engine.store, session.session_id)
    check_session(events)
    assert events[-1].type == EventType.TASK_STOPPED
    assert not marker.exists()

    
def _sleepers() -> list:
    import psutil

    found = []
    for process in psutil.process_iter(["cmdline"]):
        if "37.5" in " ".join(process.info["cmdline"] or []):
            found.append(process)
    return found
