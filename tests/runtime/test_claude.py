"""Claude Code specifics, with the real CLI talking to the fake Anthropic API inside the namespace."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import trio
from pydantic import BaseModel

from codesdk.testing.invariants import check_session
from fixtures.fake_anthropic import FakeAnthropic
from fixtures.fake_anthropic.scenario import block_text
from codesdk.protocol import (
    AuthState,
    EventType,
    InteractionMode,
    NormalizedEvent,
    PermissionMode,
    StartTaskParams,
    ToolCallRequested,
)
from codesdk.procs.orphans import end_session
from codesdk.procs.scan import Scans
from codesdk.supervisor.engine import ApprovalRequest, ApproverAnswer, Engine, session_events
from codesdk.supervisor.store import TaskRecord, TaskState
from codesdk.worker.command import RUNTIME_AHEAD_ENV
from codesdk.worker.adapters.runtime_process import RuntimeAhead
from codesdk.worker.adapters.claude import home as _env
from codesdk.worker.adapters.claude.adapter import ClaudeAdapter
from codesdk.worker.adapters.claude.adapter import ClaudeTask
from codesdk.worker.adapters.claude.launch import cli_path

from tests.conftest import MakeEngine
from tests.contract.cases import ClaudeCase, workspace
from tests.e2e.conftest import of_type
from tests.netns import skip_outside_netns
from tests.worker.harness import REPO

needs_claude = pytest.mark.skipif(cli_path() is None, reason="claude-agent-sdk is not installed")


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeAnthropic]:
    with FakeAnthropic.start(tmp_path / "api.jsonl") as server:
        yield server


async def _task(engine: Engine, session_id: str, prompt: str,
                **kwargs: Any) -> tuple[TaskRecord, list[NormalizedEvent]]:
    task = await engine.start_task(session_id, prompt, **kwargs)
    record = await engine.wait_task(task.task_id)
    events = [e for e in await session_events(engine.store, session_id) if e.trace.task_id == task.task_id]
    return record, events


@pytest.mark.runtime
@skip_outside_netns
@needs_claude
async def test_second_request_carries_the_approved_result_and_the_denial(make_engine: MakeEngine,
                                                                         fake: FakeAnthropic,
                                                                         tmp_path: Path) -> None:
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
    [denied] = of_type(events, EventType.TOOL_CALL_DENIED)  # the reason verbatim, no "PreToolUse:… hook error"
    assert _reminder_free(write["content"]) == denied.reason and "hook error" not in json.dumps(write)
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
async def test_api_errors_become_structured_failures(make_engine: MakeEngine, fake: FakeAnthropic,
                                                     directive: str,
                                                     code: str, retryable: bool) -> None:
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
async def test_a_session_resumes_the_runtime_session_and_keeps_raw_messages_as_blobs(
        make_engine: MakeEngine, fake: FakeAnthropic, tmp_path: Path) -> None:
    case = ClaudeCase(fake.base_url)
    with trio.fail_after(120):
        async with make_engine(worker_env={"*": case.worker_env()}) as engine:
            session = await engine.create_session(runtime="claude")
            first, events1 = await _task(engine, session.session_id, "first question")
            runtime_session_id = (await engine.store.get_session(session.session_id)).runtime_session_id
            second, events2 = await _task(engine, session.session_id, "second question")
            completed = of_type(events1, EventType.RUNTIME_REQUEST_COMPLETED)
            raw_refs = [e.runtime.raw_ref for e in events1 if e.type == EventType.RUNTIME_REQUEST_COMPLETED]
            assert raw_refs[0] is not None  # a completed request keeps the runtime's messages as a blob
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
    assert none.state == AuthState.UNAUTHENTICATED and "claude auth login" in none.message
    assert "`claude login`" not in none.message  # there is no such subcommand
    key = _env.auth_status({"HOME": str(home), "ANTHROPIC_API_KEY": "sk-secret-value"})
    assert (key.state, key.method) == (AuthState.AUTHENTICATED, "api_key")
    assert "sk-secret-value" not in key.model_dump_json()
    (home / ".claude" / ".credentials.json").write_text('{"claudeAiOauth": {"accessToken": "tok-secret"}}')
    (home / ".claude.json").write_text('{"oauthAccount": {"emailAddress": "alice@example.com"}}')
    oauth = _env.auth_status({"HOME": str(home)})
    assert (oauth.state, oauth.method, oauth.account_hint) == (AuthState.AUTHENTICATED, "oauth_local", "a***@example.com")
    assert "tok-secret" not in oauth.model_dump_json()


@pytest.mark.parametrize(("env", "files", "method"), [
    ({"ANTHROPIC_API_KEY": "secret-1"}, {}, "api_key"),
    ({"ANTHROPIC_AUTH_TOKEN": "secret-1"}, {}, "api_key"),
    ({"CLAUDE_CODE_OAUTH_TOKEN": "secret-1"}, {}, "oauth_token"),
    ({"CLAUDE_CODE_USE_BEDROCK": "1"}, {}, "third_party"),
    ({"CLAUDE_CODE_USE_VERTEX": "true"}, {}, "third_party"),
    ({}, {"home/.claude/.credentials.json": '{"claudeAiOauth": {"accessToken": "secret-1"}}'}, "oauth_local"),
    ({"CLAUDE_CONFIG_DIR": "{tmp}/cfg"}, {"cfg/.credentials.json": '{"claudeAiOauth": {"accessToken": "secret-1"}}'},
     "oauth_local"),
    ({}, {"home/.claude.json": '{"primaryApiKey": "secret-1"}'}, "api_key"),
    ({"CLAUDE_CONFIG_DIR": "{tmp}/cfg"}, {"cfg/.claude.json": '{"primaryApiKey": "secret-1"}'}, "api_key"),
    ({"CLAUDE_CODE_USE_BEDROCK": "0"}, {}, None),
    ({"ANTHROPIC_API_KEY": ""}, {"home/.claude.json": '{"primaryApiKey": ""}'}, None),
    ({}, {"home/.claude/.credentials.json": "x"}, "oauth_local"),  # as Claude Code: the file is the login
])
def test_auth_status_knows_every_credential_source_claude_code_accepts(tmp_path: Path, env: dict[str, str],
                                                                       files: dict[str, str], method: str | None) -> None:
    (tmp_path / "home").mkdir()
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    status = _env.auth_status({"HOME": str(tmp_path / "home"),
                               **{k: v.replace("{tmp}", str(tmp_path)) for k, v in env.items()}})
    expected = AuthState.AUTHENTICATED if method else AuthState.UNAUTHENTICATED
    assert (status.state, status.method) == (expected, method), status
    assert "secret-1" not in status.model_dump_json()


def test_login_instructions_name_the_namespace_and_the_operator_command(tmp_path: Path) -> None:
    home = tmp_path / "data" / "namespaces" / "user.alice" / "home"
    home.mkdir(parents=True)
    status = _env.auth_status({"HOME": str(home)})
    assert status.state == AuthState.UNAUTHENTICATED
    assert (f"codesdk auth login --runtime claude --namespace user:alice --data-dir {tmp_path / 'data'}"
            in status.message)
    default = _env.auth_status({"HOME": str(tmp_path / "data" / "namespaces" / "default" / "home")})
    assert "--namespace default " in default.message


@needs_claude
def test_the_login_is_the_clis_own_auth_login() -> None:
    assert ClaudeAdapter().login_command() == [str(cli_path()), "auth", "login"]


def test_the_adapter_imports_neither_the_sdk_nor_mcp() -> None:
    """The import of claude_agent_sdk (and through it mcp) costs ~1.2 s: the worker must never pay it."""
    program = ("import sys, codesdk.worker.main, codesdk.worker.adapters, codesdk.worker.adapters.claude.adapter\n"
               "print(sorted({m.split('.')[0] for m in sys.modules} & {'claude_agent_sdk', 'mcp', 'mcp_types', "
               "'anyio'}))")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True, cwd=REPO)
    assert done.stdout.strip() == "[]"


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
async def test_stopping_during_a_builtin_command_ends_its_processes(make_engine: MakeEngine,
                                                                    fake: FakeAnthropic,
                                                                    tmp_path: Path) -> None:
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

    
def _sleepers() -> list[psutil.Process]:
    import psutil

    found: list[psutil.Process] = []
    for process in psutil.process_iter(["cmdline"]):
        if "37.5" in " ".join(process.info["cmdline"] or []):
            found.append(process)
    return found


# --- tool decisions, as the model sees them --------------------------------------------------------------------


def _reminder_free(content: Any) -> str:
    """A tool_result's text without the ``<system-reminder>`` Claude Code appends to the last one (to its text, or
    as a block of its own)."""
    reminder = re.compile(r"\s*<system-reminder>.*?(?:</system-reminder>|\Z)\s*", re.DOTALL)
    return reminder.sub("", block_text(content))


def _tool_results(fake: FakeAnthropic, request: int) -> dict[str, dict[str, Any]]:
    body = fake.requests("/v1/messages")[request]["body"]
    return {block["tool_use_id"]: block for block in body["messages"][-1]["content"]
            if isinstance(block, dict) and block.get("type") == "tool_result"}


@pytest.mark.runtime
@skip_outside_netns
@needs_claude
@pytest.mark.parametrize("tool", ["workspace.write", "Write"])
async def test_a_denial_reaches_the_model_as_the_plain_reason(make_engine: MakeEngine, fake: FakeAnthropic,
                                                              tmp_path: Path, tool: str) -> None:
    """Our tool or a built-in: the model gets exactly the supervisor's reason as the tool's error — not
    "PreToolUse:… hook error: …" (the hook answers "ask", and the permission request that follows is denied)."""
    ws = workspace(tmp_path)
    case = ClaudeCase(fake.base_url)
    if tool == "Write":
        turn = case.builtin_write(ws / "notes.txt", "x")
    else:
        turn = case.tools(("workspace.write", {"path": "notes.txt", "content": "x"}))

    async def deny(request: ApprovalRequest) -> ApproverAnswer:
        return ApproverAnswer(allow=False, reason="no-writes-today-4711: ask again on Monday")

    with trio.fail_after(120):
        async with make_engine(worker_env={"*": case.worker_env()}) as engine:
            session = await engine.create_session(runtime="claude", workspace=ws)
            record, events = await _task(engine, session.session_id, turn.prompt, runtime_config=turn.runtime_config,
                                         permission_mode=PermissionMode.ASK,
                                         interaction_mode=InteractionMode.INTERACTIVE, approver=deny)
    assert record.state == TaskState.COMPLETED and not (ws / "notes.txt").exists()
    [denied] = of_type(events, EventType.TOOL_CALL_DENIED)
    assert "no-writes-today-4711: ask again on Monday" in denied.reason
    [result] = _tool_results(fake, 1).values()
    assert result["tool_use_id"] == denied.runtime_tool_call_id and result["is_error"] is True
    assert _reminder_free(result["content"]) == denied.reason  # exactly the reason, nothing around it


@pytest.mark.runtime
@skip_outside_netns
@needs_claude
async def test_read_only_builtins_are_decided_by_the_supervisor_too(make_engine: MakeEngine,
                                                                    fake: FakeAnthropic,
                                                                    tmp_path: Path) -> None:
    """Claude Code would run Read without asking anyone: the PreToolUse hook still puts it before the supervisor."""
    ws = workspace(tmp_path)
    case = ClaudeCase(fake.base_url)
    prompt = "CALL Read " + json.dumps({"file_path": str(ws / "a.txt")})
    with trio.fail_after(120):
        async with make_engine(worker_env={"*": case.worker_env()}) as engine:
            session = await engine.create_session(runtime="claude", workspace=ws)
            record, events = await _task(engine, session.session_id, prompt, runtime_config={"builtin_tools": ["Read"]},
                                         permission_mode=PermissionMode.ASK)
    assert record.state == TaskState.COMPLETED
    [requested] = of_type(events, EventType.TOOL_CALL_REQUESTED)
    assert (requested.tool_name, requested.executed_by) == ("Read", "runtime")
    assert [e.type for e in events if e.type.value.startswith("tool.call.") and e.type != EventType.
            TOOL_CALL_POLICY_EVALUATED] == [EventType.TOOL_CALL_REQUESTED, EventType.TOOL_CALL_APPROVED,
                                            EventType.TOOL_CALL_STARTED, EventType.TOOL_CALL_COMPLETED]
    [result] = _tool_results(fake, 1).values()
    assert "alpha" in block_text(result["content"]) and not result.get("is_error")


# --- auth, usage ---------------------------------------------------------------------------------------------


@pytest.mark.runtime
@skip_outside_netns
@needs_claude
async def test_without_credentials_the_task_fails_auth_required_with_the_namespace_login(
        make_engine: MakeEngine, fake: FakeAnthropic, tmp_path: Path) -> None:
    """Claude Code says "Not logged in · Please run /login" without a request: AUTH_REQUIRED, not retryable, with
    the operator command that logs this namespace in."""
    with trio.fail_after(120):
        async with make_engine(worker_env={"*": {"ANTHROPIC_BASE_URL": fake.base_url,
                                                 "CLAUDE_CODE_MAX_RETRIES": "0"}}) as engine:
            session = await engine.create_session(runtime="claude", namespace="user:alice")
            record, events = await _task(engine, session.session_id, "hello")
    [failed] = of_type(events, EventType.TASK_FAILED)
    assert record.state == TaskState.FAILED
    assert (failed.code, failed.retryable) == ("AUTH_REQUIRED", False)
    assert f"codesdk auth login --runtime claude --namespace user:alice --data-dir {tmp_path / 'data'}" in failed.message
    assert "Not logged in" in failed.details["runtime_message"]
    assert fake.requests() == []  # nothing was sent anywhere


@pytest.mark.runtime
@skip_outside_netns
@needs_claude
async def test_usage_names_the_model_that_answered_else_the_requested_one(make_engine: MakeEngine,
                                                                          fake: FakeAnthropic) -> None:
    case = ClaudeCase(fake.base_url)
    with trio.fail_after(120):
        async with make_engine(worker_env={"*": case.worker_env()}) as engine:
            session = await engine.create_session(runtime="claude")
            _, served = await _task(engine, session.session_id, "MODEL claude-served-by-fake-1\nhello")
            _, failed = await _task(engine, session.session_id, "ERROR 500",
                                    runtime_config={"model": "claude-sonnet-4-5"})
    assert [u.model for u in of_type(served, EventType.USAGE_REPORTED)] == ["claude-served-by-fake-1"]
    assert [u.model for u in of_type(failed, EventType.USAGE_REPORTED)] == ["claude-sonnet-4-5"]  # no answer came


# --- the adapter driven in this process: the CLI's wire, failing hooks, cancellation -----------------------------


class _Io:
    """A TaskIO that records events and answers tool calls with ``answer(task, request)``."""

    def __init__(self, answer: Callable[[ClaudeTask, ToolCallRequested], None] | None = None) -> None:
        self.events: list[tuple[EventType, Any]] = []
        self.answer = answer
        self.task: ClaudeTask | None = None

    async def emit(self, event_type: EventType, payload: Any, raw: Any = None) -> None:
        self.events.append((event_type, payload))
        if event_type == EventType.TOOL_CALL_REQUESTED and self.answer is not None:
            assert self.task is not None
            self.answer(self.task, payload)

    async def flush(self) -> None:
        pass

    async def write_raw(self, data: bytes) -> None:
        pass

    def set_runtime_session_id(self, runtime_session_id: str) -> None:
        pass

    def set_model(self, model: str) -> None:
        pass


READ_TOOL: dict[str, Any] = {"name": "workspace.read", "description": "Read a file of the workspace",
             "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}


@pytest.fixture
def here(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fake: FakeAnthropic) -> Path:
    """This process's environment as a namespace's worker would have it (the adapter reads os.environ)."""
    for key in list(os.environ):
        if key.startswith(("ANTHROPIC_", "CLAUDE_")):
            monkeypatch.delenv(key)
    home = tmp_path / "home"
    home.mkdir()
    for key, value in {"HOME": str(home), "TMPDIR": str(tmp_path), "ANTHROPIC_BASE_URL": fake.base_url,
                       "ANTHROPIC_API_KEY": "sk-test", "CLAUDE_CODE_MAX_RETRIES": "0"}.items():
        monkeypatch.setenv(key, value)
    return workspace(tmp_path)


def _start(io: _Io, prompt: str, ws: Path, tools: tuple[dict[str, Any], ...] = (),
           runtime_config: dict[str, Any] | None = None, ahead: RuntimeAhead | None = None) -> ClaudeTask:
    params = StartTaskParams.model_validate({
        "runtime": "claude", "session": {"session_id": "s1"}, "task_id": "t1", "workspace": str(ws),
        "messages": [{"role": "user", "blocks": [{"type": "text", "text": prompt}]}],
        "tool_manifest": {"tools": list(tools)}, "runtime_config": runtime_config or {}})
    task = ClaudeAdapter(ahead).start_task(params, io)
    assert isinstance(task, ClaudeTask)
    io.task = task
    return task


@pytest.mark.runtime
@skip_outside_netns
@needs_claude
async def test_the_clis_mcp_messages_and_our_answers_are_mcp(here: Path, fake: FakeAnthropic,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Every message the real CLI tunnels to our in-process server is an MCP client message, and every answer a
    valid MCP response (checked with the mcp package's own models, which the worker never imports)."""
    import mcp.types as mcp

    io = _Io(answer=lambda task, call: task.send_tool_result(call.tool_call_id, {"path": "a.txt", "text": "alpha\n"}))
    task = _start(io, 'CALL workspace_read {"path": "a.txt"}', here, tools=(READ_TOOL,))
    seen: list[tuple[dict[str, Any], dict[str, Any] | None]] = []
    handle = task.mcp.handle

    async def recording(message: Any) -> dict[str, Any] | None:
        answer = await handle(message)
        seen.append((message, answer))
        return answer

    monkeypatch.setattr(task.mcp, "handle", recording)
    with trio.fail_after(120):
        outcome = await task.run()
    assert outcome.completed is not None
    assert {"initialize", "notifications/initialized", "tools/list", "tools/call"} <= {m["method"] for m, _ in seen}
    results: dict[str, type[BaseModel]] = {"initialize": mcp.InitializeResult,
                                           "tools/list": mcp.ListToolsResult,
                                           "tools/call": mcp.CallToolResult, "ping": mcp.EmptyResult}
    for message, answer in seen:
        request = {k: message[k] for k in ("method", "params") if k in message}
        if "id" not in message:
            mcp.client_notification_adapter.validate_python(request)
            assert answer is None
            continue
        mcp.client_request_adapter.validate_python(request)
        assert answer is not None and answer["id"] == message["id"]
        assert isinstance(mcp.jsonrpc_message_adapter.validate_python(answer), mcp.JSONRPCResponse)
        results[message["method"]].model_validate(answer["result"])
    [result] = _tool_results(fake, 1).values()
    assert json.loads(_reminder_free(result["content"])) == {"path": "a.txt", "text": "alpha\n"}


@pytest.mark.runtime
@skip_outside_netns
@needs_claude
async def test_a_failing_hook_answer_blocks_the_call(here: Path, fake: FakeAnthropic,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The PreToolUse hook is registered with onFailure "block": if answering it fails, the call does not run (the
    CLI's default would run it — a built-in Write here — as if the hook had said nothing)."""
    target = here / "by-builtin.txt"
    io = _Io(answer=lambda task, call: task.send_tool_approved(call.tool_call_id, "fine"))
    task = _start(io, "CALL Write " + json.dumps({"file_path": str(target), "content": "x"}), here,
                  runtime_config={"builtin_tools": ["Write"]})

    async def broken(hook_input: dict[str, Any], tool_use_id: str | None) -> dict[str, Any]:
        raise RuntimeError("lost the supervisor")

    monkeypatch.setattr(task, "_pre_tool_use", broken)
    with trio.fail_after(120):
        outcome = await task.run()
    assert outcome.completed is not None and not target.exists()
    [result] = _tool_results(fake, 1).values()
    assert result["is_error"] is True and 'onFailure is "block"' in block_text(result["content"])


@pytest.mark.runtime
@skip_outside_netns
@needs_claude
async def test_cancelling_the_run_ends_the_cli_before_it_returns(here: Path, fake: FakeAnthropic) -> None:
    """A forced stop cancels run(): the CLI's group is ended at once (no waiting for it to finish its answer) and
    reaped before run() gives up."""
    io = _Io()
    task = _start(io, "SLOW 30", here)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(task.run)
            while not any(kind == EventType.MODEL_OUTPUT_DELTA for kind, _ in io.events):
                await trio.sleep(0.02)
            [cli] = [p for p in psutil.Process().children(recursive=True) if p.name() == "claude"]
            nursery.cancel_scope.cancel()
        assert not cli.is_running()  # ended and reaped
        while not [e for e in fake.entries() if e.get("type") == "disconnect"]:  # it went away mid-answer
            await trio.sleep(0.05)


@pytest.mark.runtime
@skip_outside_netns
@needs_claude
async def test_stop_interrupts_the_turn_and_the_cli_ends_by_itself(here: Path, fake: FakeAnthropic) -> None:
    """stop() sends the interrupt control request: Claude Code aborts the streaming answer and ends the turn on
    its own, long before the grace after which its process group would be ended."""
    io = _Io()
    task = _start(io, "SLOW 30", here, runtime_config={"stop_grace_s": 60})
    with trio.fail_after(60):  # hang guard only: without the interrupt this would wait for the grace
        async with trio.open_nursery() as nursery:
            outcome = []

            async def run() -> None:
                outcome.append(await task.run())

            nursery.start_soon(run)
            while not any(kind == EventType.MODEL_OUTPUT_DELTA for kind, _ in io.events):
                await trio.sleep(0.02)
            [cli] = [p for p in psutil.Process().children(recursive=True) if p.name() == "claude"]
            task.stop("enough")
        assert outcome[0].stopped is not None and outcome[0].stopped.reason == "enough"
        assert not cli.is_running()
        while not [e for e in fake.entries() if e.get("type") == "disconnect"]:  # the answer was cut short
            await trio.sleep(0.05)


# --- the in-process MCP server, message by message -----------------------------------------------------------

#: What Claude Code 2.1.330 sent to an in-process server (recorded from the wire), and a few more requests.
CLI_MESSAGES: list[dict[str, Any]] = [
    {"method": "initialize", "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {
        "name": "claude-code", "title": "Claude Code", "description": "Anthropic's agentic coding tool",
        "websiteUrl": "https://claude.com/claude-code", "version": "2.1.330"}}, "jsonrpc": "2.0", "id": 0},
    {"jsonrpc": "2.0", "method": "notifications/initialized"},
    {"method": "tools/list", "jsonrpc": "2.0", "id": 1},
    {"method": "tools/call", "params": {"name": "workspace_read", "arguments": {"path": "a.txt"}, "_meta": {
        "claudecode/toolUseId": "toolu_1", "progressToken": 2}}, "jsonrpc": "2.0", "id": 2},
    {"method": "ping", "jsonrpc": "2.0", "id": "p-1"},
    {"method": "initialize", "params": {"protocolVersion": "2024-11-05", "capabilities": {},
                                        "clientInfo": {"name": "old", "version": "1"}}, "jsonrpc": "2.0", "id": 3},
    {"method": "initialize", "params": {"protocolVersion": "2099-01-01", "capabilities": {},
                                        "clientInfo": {"name": "new", "version": "1"}}, "jsonrpc": "2.0", "id": 4},
    {"method": "resources/list", "jsonrpc": "2.0", "id": 5},
    {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 99, "reason": "gone"}},
]


async def _our_answers(messages: list[dict[str, Any]]) -> list[dict[str, Any] | None]:
    from codesdk.worker.mcp.server import McpServer, McpTool, ToolCallResult

    async def call(name: str, arguments: dict[str, Any], meta: dict[str, Any]) -> ToolCallResult:
        assert (name, arguments, meta["claudecode/toolUseId"]) == ("workspace_read", {"path": "a.txt"}, "toolu_1")
        return ToolCallResult("alpha")

    server = McpServer("codesdk", "1.0.0", [McpTool("workspace_read", READ_TOOL["description"],
                                                    READ_TOOL["input_schema"])], call)
    return [await server.handle(message) for message in messages]


@needs_claude
async def test_the_mcp_server_answers_as_the_sdks_mcp_server_does() -> None:
    """The same messages through claude-agent-sdk's own in-process server (mcp package) and through ours."""
    from claude_agent_sdk import SdkMcpTool, create_sdk_mcp_server
    from claude_agent_sdk._internal.sdk_mcp_bridge import SdkMcpBridge

    async def read(args: dict[str, Any]) -> dict[str, Any]:
        return {"content": [{"type": "text", "text": "alpha"}]}

    config = create_sdk_mcp_server("codesdk", "1.0.0", [
        SdkMcpTool("workspace_read", READ_TOOL["description"], READ_TOOL["input_schema"], read)])
    bridge = SdkMcpBridge("codesdk", config["instance"])  # type: ignore[typeddict-item]
    try:
        theirs = [await bridge.handle(message) for message in CLI_MESSAGES]
    finally:
        await bridge.aclose()
    ours = await _our_answers(CLI_MESSAGES)
    for message, mine, sdk in zip(CLI_MESSAGES, ours, theirs):
        if mine is not None and "error" in mine:
            assert sdk is not None and mine["error"]["code"] == sdk["error"]["code"], message
        else:
            assert mine == sdk, message


async def test_the_mcp_server_speaks_mcp_2025_11_25() -> None:
    import mcp.types as mcp

    answers = await _our_answers(CLI_MESSAGES)
    by_id: dict[int | str, dict[str, Any]] = {}
    for message, answer in zip(CLI_MESSAGES, answers):
        if "id" in message:
            assert answer is not None, message
            by_id[message["id"]] = answer
    assert [a for m, a in zip(CLI_MESSAGES, answers) if "id" not in m] == [None, None]  # notifications
    for answer in by_id.values():
        mcp.jsonrpc_message_adapter.validate_python(answer)
    assert mcp.InitializeResult.model_validate(by_id[0]["result"]).protocol_version == "2025-11-25"
    assert by_id[3]["result"]["protocolVersion"] == "2024-11-05"  # a version we speak is kept
    assert by_id[4]["result"]["protocolVersion"] == "2025-11-25"  # one we don't: our latest
    [tool] = mcp.ListToolsResult.model_validate(by_id[1]["result"]).tools
    assert (tool.name, tool.input_schema) == ("workspace_read", READ_TOOL["input_schema"])
    content = mcp.CallToolResult.model_validate(by_id[2]["result"]).content[0]
    assert isinstance(content, mcp.TextContent) and content.text == "alpha"
    assert by_id["p-1"]["result"] == {}
    assert by_id[5]["error"]["code"] == -32601
    [unknown] = await _our_answers([{"jsonrpc": "2.0", "id": 6, "method": "tools/call", "params": {"name": "nope"}}])
    assert unknown is not None and unknown["error"]["code"] == -32602  # unknown tool: a protocol error (spec)


# -- the CLI started ahead of its task ----------------------------------------------------------------------------


def _clis_below(pid: int) -> list[int]:
    """The Claude CLIs ``pid`` started itself (a CLI's own helpers, also named claude, are not more CLIs)."""
    try:
        return [p.pid for p in psutil.Process(pid).children() if p.name() == "claude"]
    except psutil.NoSuchProcess:
        return []


async def _until_only_zombies_in_session(sid: int) -> None:
    with trio.fail_after(30):  # a hang guard: what the worker ended exits
        while _running_in_session(sid):
            await trio.sleep(0.05)


def _running_in_session(sid: int) -> list[int]:
    """Processes of session ``sid`` that are not (yet) zombies."""
    running = []
    for process in psutil.process_iter():
        try:
            if os.getsid(process.pid) == sid and process.status() != psutil.STATUS_ZOMBIE:
                running.append(process.pid)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return running


def _gone(pid: int) -> bool:
    """Not running and reaped (a zombie still has its pid)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_DEAD
    except psutil.NoSuchProcess:
        return True


async def _ahead(ws: Path, runtime_config: dict[str, Any] | None = None) -> tuple[RuntimeAhead, int]:
    ahead = RuntimeAhead.start("claude", {"runtime_config": runtime_config or {}, "workspace": str(ws)})
    assert ahead is not None
    [pid] = _clis_below(os.getpid())
    return ahead, pid


@pytest.mark.runtime
@skip_outside_netns
@needs_claude
async def test_a_cli_started_ahead_serves_the_task_that_asks_for_its_launch(here: Path, fake: FakeAnthropic) -> None:
    """The task's tools are not part of the launch: the CLI started before they were known serves the task, tool
    call included, and no second CLI is started."""
    ahead, pid = await _ahead(here, {"max_turns": 7})
    io = _Io(answer=lambda task, call: task.send_tool_result(call.tool_call_id, {"path": "a.txt", "text": "alpha\n"}))
    task = _start(io, 'CALL workspace_read {"path": "a.txt"}', here, tools=(READ_TOOL,), runtime_config={"max_turns": 7},
                  ahead=ahead)
    seen: set[int] = set()
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                while True:
                    seen.update(_clis_below(os.getpid()))
                    await trio.sleep(0.01)

            nursery.start_soon(watch)
            outcome = await task.run()
            nursery.cancel_scope.cancel()
    assert outcome.completed is not None
    assert [kind for kind, _ in io.events].count(EventType.TOOL_CALL_REQUESTED) == 1
    assert seen == {pid} and _gone(pid)
    assert await ahead.take("claude", task.launch()) is None  # taken once, by that task


@pytest.mark.runtime
@skip_outside_netns
@needs_claude
async def test_a_cli_started_ahead_with_builtins_was_opened_with_their_hooks(here: Path, fake: FakeAnthropic) -> None:
    """The ``initialize`` a CLI is sent as it starts ahead registers the hooks its task needs: a built-in's call is
    put before the supervisor (PreToolUse) and its end reported (PostToolUse), by the CLI started ahead."""
    target = here / "by-builtin.txt"
    ahead, pid = await _ahead(here, {"builtin_tools": ["Write"]})
    io = _Io(answer=lambda task, call: task.send_tool_approved(call.tool_call_id, "fine"))
    task = _start(io, "CALL Write " + json.dumps({"file_path": str(target), "content": "x"}), here,
                  runtime_config={"builtin_tools": ["Write"]}, ahead=ahead)
    with trio.fail_after(120):
        outcome = await task.run()
    assert outcome.completed is not None and target.read_text() == "x" and _gone(pid)
    assert [kind for kind, _ in io.events if kind.value.startswith("tool.call.")] == [
        EventType.TOOL_CALL_REQUESTED, EventType.TOOL_CALL_STARTED, EventType.TOOL_CALL_COMPLETED]
    assert await ahead.take("claude", task.launch()) is None  # it was the one started ahead that served


@pytest.mark.runtime
@skip_outside_netns
@needs_claude
async def test_a_cli_started_for_another_launch_is_ended_and_the_task_starts_its_own(
        here: Path, fake: FakeAnthropic) -> None:
    ahead, pid = await _ahead(here, {"model": "claude-another-model"})
    io = _Io()
    task = _start(io, "hello", here, ahead=ahead)
    with trio.fail_after(120):
        outcome = await task.run()
    assert outcome.completed is not None and _gone(pid)
    assert [r["body"]["model"] for r in fake.requests("/v1/messages")] == ["claude-sonnet-4-5"]


@pytest.mark.runtime
@skip_outside_netns
@needs_claude
async def test_a_cli_nobody_claims_is_ended_when_it_expires(here: Path, fake: FakeAnthropic) -> None:
    ahead, pid = await _ahead(here)
    await ahead.expire(after_s=0)
    assert _gone(pid) and not fake.requests()


@pytest.mark.runtime
@skip_outside_netns
@needs_claude
def test_a_worker_ends_the_cli_it_started_ahead_when_its_supervisor_goes(here: Path, fake: FakeAnthropic) -> None:
    """Over real pipes: the worker takes the request out of its environment (no runtime inherits it), starts the
    CLI at once, and ends it with itself when its stdin closes."""
    env = {**os.environ, RUNTIME_AHEAD_ENV: json.dumps({"runtime": "claude", "runtime_config": {},
                                                         "workspace": str(here)})}
    worker = subprocess.Popen([sys.executable, "-m", "codesdk.worker.main"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, env=env, cwd=REPO, start_new_session=True)  # as spawned
    try:
        assert worker.stdin is not None and worker.stderr is not None
        for line in worker.stderr:  # its log says when (and which) it started
            if b"started claude ahead of its task" in line:
                break
        [pid] = _clis_below(worker.pid)
        with open(f"/proc/{pid}/environ", "rb") as environ:
            assert RUNTIME_AHEAD_ENV.encode() not in environ.read()
        worker.stdin.close()
        assert worker.wait(timeout=60) == 0
        worker.stderr.close()
        assert _gone(pid)
        # Everything in the worker's session ended with it, also what the CLI started while it was being ended.
        # What outlived the CLI by a moment went to the nearest subreaper (this process, once an in-process
        # supervisor made it one): it is dead, and reaped here as the supervisor reaps a session's leftovers.
        trio.run(_until_only_zombies_in_session, worker.pid)
        end_session(worker.pid, Scans())
    finally:
        worker.kill()
        worker.wait()
    assert not fake.requests()  # started, never asked anything
