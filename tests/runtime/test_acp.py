"""ACP agents' specifics, with the real Gemini CLI and OpenCode talking to the fake model inside the namespace.

The adapter contract (tests/contract) covers what every runtime must do; here: what each agent is offered and where
it keeps its state, its failures mapped to the contract's codes, a stop while a call waits for its approval, a
workspace that would configure the agent, a missing or misbehaving program (a stand-in, since the real ones cannot be
made to write garbage), and `codesdk run`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import trio

from codesdk.testing.invariants import check_session
from fixtures.fake_anthropic import FakeAnthropic, opencode_config
from codesdk.protocol import EventType, InteractionMode, NormalizedEvent, PermissionMode, TaskFailureCode
from codesdk.supervisor.engine import ApprovalRequest, ApproverAnswer, Engine, session_events
from codesdk.supervisor.store import TaskRecord, TaskState
from codesdk.worker.command import RUNTIMES_DIR_ENV
from codesdk.worker.adapters.acp._codex_acp import CodexAcpProfile
from codesdk.worker.adapters.acp._gemini import GeminiProfile
from codesdk.worker.adapters.acp._opencode import OpenCodeProfile
from codesdk.worker.adapters.acp._profile import AgentProfile

from tests.conftest import MakeEngine
from tests.contract.cases import CodexAcpCase, GeminiCase, OpenCodeCase, workspace
from tests.e2e.conftest import of_type
from tests.netns import skip_outside_netns
from tests.worker.harness import REPO

pytestmark = [pytest.mark.runtime, skip_outside_netns]

AGENTS: dict[str, AgentProfile] = {"gemini": GeminiProfile(), "opencode": OpenCodeProfile()}


def _installed(name: str) -> Any:
    profile = AGENTS[name]
    return pytest.param(name, id=name, marks=pytest.mark.skipif(profile.program(os.environ) is None,
                                                                reason=profile.missing_reason(os.environ)))


EACH_AGENT = pytest.mark.parametrize("agent", [_installed(name) for name in AGENTS])
#: Every ACP agent CodeSDK drives, codex-acp included.
ALL_AGENTS: dict[str, AgentProfile] = {**AGENTS, "codex-acp": CodexAcpProfile()}
EVERY_ACP_AGENT = pytest.mark.parametrize("agent", [
    pytest.param(name, id=name, marks=pytest.mark.skipif(profile.program(os.environ) is None,
                                                         reason=profile.missing_reason(os.environ)))
    for name, profile in ALL_AGENTS.items()])


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeAnthropic]:
    with FakeAnthropic.start(tmp_path / "api.jsonl") as server:
        yield server


def _case(agent: str, fake: FakeAnthropic) -> GeminiCase | OpenCodeCase | CodexAcpCase:
    if agent == "codex-acp":
        return CodexAcpCase(fake.openai_base_url)
    return GeminiCase(fake.gemini_base_url) if agent == "gemini" else OpenCodeCase(fake.chat_completions_base_url)


def _model_requests(agent: str, fake: FakeAnthropic) -> list[dict[str, Any]]:
    """What the agent sent its model, without OpenCode's title requests (no tools)."""
    if agent == "gemini":
        return [r["body"] for r in fake.requests() if "streamGenerateContent" in r["path"]]
    if agent == "codex-acp":
        return [r["body"] for r in fake.requests("/v1/responses")]
    return [r["body"] for r in fake.requests("/v1/chat/completions") if r["body"].get("tools")]


def _offered(agent: str, body: dict[str, Any]) -> list[str]:
    if agent == "gemini":
        return sorted(d["name"] for t in body.get("tools", []) for d in t.get("functionDeclarations", []))
    return sorted(t["function"]["name"] for t in body["tools"])


async def _task(engine: Engine, session_id: str, prompt: str, config: dict[str, Any],
                **kwargs: Any) -> tuple[TaskRecord, list[NormalizedEvent]]:
    task = await engine.start_task(session_id, prompt, runtime_config=dict(config), **kwargs)
    record = await engine.wait_task(task.task_id)
    events = [e for e in await session_events(engine.store, session_id) if e.trace.task_id == task.task_id]
    return record, events


@EACH_AGENT
async def test_the_agent_is_offered_only_codesdks_tools_and_keeps_its_state_in_the_namespace(
        make_engine: MakeEngine, fake: FakeAnthropic, tmp_path: Path, agent: str) -> None:
    case = _case(agent, fake)
    with trio.fail_after(120):
        async with make_engine(worker_env={"*": case.worker_env()}) as engine:
            session = await engine.create_session(runtime=agent, workspace=workspace(tmp_path),
                                                  namespace="user:alice")
            record, events = await _task(engine, session.session_id, "SAY hello", case.config)
            data_dir = engine.pool.config.data_dir
    assert record.state == TaskState.COMPLETED
    [body] = _model_requests(agent, fake)
    prefix = AGENTS[agent].tool_prefix()
    offered = _offered(agent, body)
    assert offered and all(name.startswith(prefix) for name in offered), offered
    assert f"{prefix}workspace_read" in offered
    namespace = data_dir / "namespaces" / "user.alice"
    state = namespace / "home" / ".gemini" if agent == "gemini" else namespace / "data" / "opencode"
    assert state.is_dir()
    assert not (tmp_path / "ws" / ".gemini").exists() and not (tmp_path / "ws" / ".opencode").exists()
    assert of_type(events, EventType.USAGE_REPORTED)[0].input_tokens > 0


#: Directives of the fake model -> the failure each must become.
FAILURES = [("ERROR 401", TaskFailureCode.AUTH_REQUIRED, False), ("ERROR 429", TaskFailureCode.RATE_LIMITED, True),
            ("ERROR 500", TaskFailureCode.API_ERROR, True)]


@EACH_AGENT
async def test_api_failures_become_the_contracts_codes_and_the_session_goes_on(
        make_engine: MakeEngine, fake: FakeAnthropic, agent: str) -> None:
    case = _case(agent, fake)
    failed: list[tuple[str, bool]] = []
    with trio.fail_after(180):
        async with make_engine(worker_env={"*": case.worker_env()}) as engine:
            session = await engine.create_session(runtime=agent)
            for directive, _, _ in FAILURES:
                record, events = await _task(engine, session.session_id, directive, case.config)
                assert record.state == TaskState.FAILED
                [failure] = of_type(events, EventType.TASK_FAILED)
                failed.append((failure.code, failure.retryable))
                if failure.code == TaskFailureCode.AUTH_REQUIRED:
                    assert "namespace env set --data-dir" in failure.message  # how to configure the namespace
            again, _ = await _task(engine, session.session_id, "SAY still usable", case.config)
    assert failed == [(code, retryable) for _, code, retryable in FAILURES]
    assert again.state == TaskState.COMPLETED  # the session survives failed turns


@EACH_AGENT
async def test_a_stop_while_a_call_waits_for_its_approval_ends_the_task_and_every_process(
        make_engine: MakeEngine, fake: FakeAnthropic, tmp_path: Path, agent: str) -> None:
    case = _case(agent, fake)
    asked = trio.Event()

    async def never(request: ApprovalRequest) -> ApproverAnswer:
        asked.set()
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    ws = workspace(tmp_path)
    with trio.fail_after(120):
        async with make_engine(worker_env={"*": case.worker_env()}) as engine:
            session = await engine.create_session(runtime=agent, workspace=ws)
            task = await engine.start_task(
                session.session_id, 'CALL workspace_write {"path": "x.txt", "content": "x"}',
                runtime_config={**case.config, "stop_grace_s": 2}, permission_mode=PermissionMode.ASK,
                interaction_mode=InteractionMode.INTERACTIVE, approver=never)
            await asked.wait()
            worker = engine.pool.worker_of("default")
            assert worker is not None
            assert [p for p in psutil.Process(worker.pid).children(recursive=True) if case.is_runtime_process(p)]
            await engine.stop_task(task.task_id, reason="changed my mind")
            record = await engine.wait_task(task.task_id)
            while psutil.Process(worker.pid).children(recursive=True):  # the agent and its bridge end too
                await trio.sleep(0.05)
            events = await session_events(engine.store, session.session_id)
    check_session(events)
    assert record.state == TaskState.STOPPED and not (ws / "x.txt").exists()


@EVERY_ACP_AGENT
@pytest.mark.parametrize("first_turn", ["stopped", "failed"])
async def test_a_session_whose_first_turn_failed_or_stopped_goes_on_beside_another(
        make_engine: MakeEngine, fake: FakeAnthropic, tmp_path: Path, agent: str, first_turn: str) -> None:
    """Issue 33: once the workspace holds another session of the agent, a session whose first turn was stopped or
    failed must still take its next task (the agent refusing to load it is answered with a reconstruction)."""
    case = _case(agent, fake)
    ws = workspace(tmp_path)
    with trio.fail_after(240):
        async with make_engine(worker_env={"*": case.worker_env()}) as engine:
            first = await engine.create_session(runtime=agent, workspace=ws)
            if first_turn == "stopped":
                task = await engine.start_task(first.session_id, "SLOW 30",
                                               runtime_config={**case.config, "stop_grace_s": 2})
                while not _model_requests(agent, fake):  # the turn is under way at the model
                    await trio.sleep(0.05)
                await engine.stop_task(task.task_id, reason="trial stop")
                assert (await engine.wait_task(task.task_id)).state == TaskState.STOPPED
            else:
                record, _ = await _task(engine, first.session_id, "ERROR 500", case.config)
                assert record.state == TaskState.FAILED
            other = await engine.create_session(runtime=agent, workspace=ws)
            record, _ = await _task(engine, other.session_id, "SAY the other session", case.config)
            assert record.state == TaskState.COMPLETED
            again, events = await _task(engine, first.session_id, "SAY still usable", case.config)
            failed = of_type(events, EventType.TASK_FAILED)
            assert again.state == TaskState.COMPLETED, [(f.code, f.message) for f in failed]
            check_session(await session_events(engine.store, first.session_id))


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


#: A wrong or unreachable model API -> (code, retryable), the same on every runtime.
WRONG_API = {"unreachable": (TaskFailureCode.API_UNREACHABLE, True),
             "404": (TaskFailureCode.INVALID_REQUEST, False), "401": (TaskFailureCode.AUTH_REQUIRED, False)}


@EVERY_ACP_AGENT
@pytest.mark.parametrize("cause", list(WRONG_API))
async def test_a_wrong_or_unreachable_model_api_is_told_apart_and_named(
        make_engine: MakeEngine, fake: FakeAnthropic, agent: str, cause: str) -> None:
    """Issue 33: the same mistake (API unreachable, a 404, a 401) gets the same code and retryable flag on every
    agent, and the message names the base URL the agent used (never a key). The time to fail is printed."""
    if cause == "unreachable":
        fake.port = _closed_port()  # every base URL below now points at a closed port
    case = _case(agent, fake)
    prompt = "SAY hello" if cause == "unreachable" else f"ERROR {cause}"
    with trio.fail_after(240):
        async with make_engine(worker_env={"*": case.worker_env()}) as engine:
            session = await engine.create_session(runtime=agent)
            started = trio.current_time()
            record, events = await _task(engine, session.session_id, prompt, case.config)
            print(f"\n{agent} {cause}: failed after {trio.current_time() - started:.1f} s")
    [failed] = of_type(events, EventType.TASK_FAILED)
    assert record.state == TaskState.FAILED
    assert (failed.code, failed.retryable) == WRONG_API[cause], failed
    assert case.base_url.rstrip("/") in failed.message, failed.message
    assert "test-key" not in failed.message and "sk-test" not in failed.message


async def test_a_workspace_holding_the_agents_own_config_is_refused(make_engine: MakeEngine, fake: FakeAnthropic,
                                                                    tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    (ws / ".gemini").mkdir()
    (ws / ".gemini" / "settings.json").write_text('{"mcpServers": {"evil": {"command": "sh"}}}')
    case = GeminiCase(fake.gemini_base_url)
    with trio.fail_after(60):
        async with make_engine(worker_env={"*": case.worker_env()}) as engine:
            session = await engine.create_session(runtime="gemini", workspace=ws)
            record, events = await _task(engine, session.session_id, "SAY hi", case.config)
    [failed] = of_type(events, EventType.TASK_FAILED)
    assert record.state == TaskState.FAILED and failed.code == TaskFailureCode.UNSAFE_WORKSPACE
    assert "'.gemini'" in failed.message and str(ws) in failed.message
    assert not fake.requests()


def _stand_in(tmp_path: Path, program: str) -> Path:
    """A runtimes directory whose Gemini CLI bundle is ``program`` (JavaScript run by node), laid out as npm does."""
    runtimes = tmp_path / "runtimes"
    bundle = runtimes / "node_modules" / "@google" / "gemini-cli" / "bundle"
    bundle.mkdir(parents=True)
    (bundle.parent / "package.json").write_text(json.dumps({"version": GeminiProfile.version}))
    (bundle / "gemini.js").write_text(program)
    return runtimes


async def _run_with(make_engine: MakeEngine, fake: FakeAnthropic,
                    runtimes: Path) -> tuple[TaskRecord, list[NormalizedEvent]]:
    case = GeminiCase(fake.gemini_base_url)
    with trio.fail_after(120):
        async with make_engine(worker_env={"*": {**case.worker_env(), RUNTIMES_DIR_ENV: str(runtimes)}}) as engine:
            session = await engine.create_session(runtime="gemini")
            return await _task(engine, session.session_id, "SAY hello", case.config)


needs_node = pytest.mark.skipif(GeminiProfile().program({"PATH": os.environ.get("PATH", "")}) is None,
                                reason="node and the pinned Gemini CLI are needed: ./scripts/install-runtimes")


async def test_a_missing_agent_is_refused_with_how_to_install_it(make_engine: MakeEngine, fake: FakeAnthropic,
                                                                 tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    record, events = await _run_with(make_engine, fake, tmp_path / "empty")
    [failed] = of_type(events, EventType.TASK_FAILED)
    assert record.state == TaskState.FAILED and failed.code == TaskFailureCode.RUNTIME_UNAVAILABLE, failed
    assert "./scripts/install-runtimes" in failed.message


@needs_node
async def test_an_agent_that_writes_garbage_is_a_protocol_error(make_engine: MakeEngine, fake: FakeAnthropic,
                                                                tmp_path: Path) -> None:
    program = "process.stdin.once('data', () => { console.log('this is not json'); });\n"
    record, events = await _run_with(make_engine, fake, _stand_in(tmp_path, program))
    [failed] = of_type(events, EventType.TASK_FAILED)
    assert record.state == TaskState.FAILED and failed.code == TaskFailureCode.PROTOCOL_ERROR, failed
    assert "not JSON" in failed.message


@needs_node
async def test_an_agent_that_dies_at_once_is_a_retryable_crash_with_its_stderr(
        make_engine: MakeEngine, fake: FakeAnthropic, tmp_path: Path) -> None:
    program = "process.stderr.write('gemini-stand-in: cannot start 7731\\n'); process.exit(3);\n"
    record, events = await _run_with(make_engine, fake, _stand_in(tmp_path, program))
    [failed] = of_type(events, EventType.TASK_FAILED)
    assert record.state == TaskState.FAILED and (failed.code, failed.retryable) == ("RUNTIME_CRASHED", True)
    assert failed.details["exit_code"] == 3 and "stderr_tail_ref" in failed.details


#: A stand-in ACP agent that answers the handshake and a new session, then does ``ON_PROMPT`` with the prompt's id.
_ACP_STAND_IN = """
const readline = require('readline');
const send = (m) => process.stdout.write(JSON.stringify({jsonrpc: '2.0', ...m}) + '\\n');
readline.createInterface({input: process.stdin}).on('line', (line) => {
  const m = JSON.parse(line);
  if (m.method === 'initialize') send({id: m.id, result: {protocolVersion: 1, agentCapabilities: {}}});
  else if (m.method === 'session/new') send({id: m.id, result: {sessionId: 's-1'}});
  else if (m.method === 'session/prompt') { ON_PROMPT }
});
"""


@needs_node
@pytest.mark.parametrize("on_prompt", [
    "process.stderr.write('stand-in: heap exhausted 9917\\n'); process.exit(7);",
    "process.stderr.write('stand-in: heap exhausted 9917\\n'); "
    "send({id: m.id, error: {code: -32603, message: 'Internal error'}});"], ids=["dies", "internal-error"])
async def test_an_agent_that_fails_mid_turn_reports_its_stderr_tail(
        make_engine: MakeEngine, fake: FakeAnthropic, tmp_path: Path, on_prompt: str) -> None:
    """Issue 33: an ACP agent that dies mid-turn is RUNTIME_CRASHED (retryable) with its stderr tail, as claude and
    codex are; one that answers the turn with an internal error says it with its stderr tail too."""
    record, events = await _run_with(make_engine, fake,
                                     _stand_in(tmp_path, _ACP_STAND_IN.replace("ON_PROMPT", on_prompt)))
    [failed] = of_type(events, EventType.TASK_FAILED)
    assert record.state == TaskState.FAILED
    if on_prompt.endswith("exit(7);"):
        assert (failed.code, failed.retryable) == ("RUNTIME_CRASHED", True) and failed.details["exit_code"] == 7
    else:
        assert failed.code == TaskFailureCode.RUNTIME_ERROR and "Internal error" in failed.message
    assert "stderr_tail_ref" in failed.details, failed


@needs_node
async def test_an_agent_speaking_another_acp_version_is_told_apart(make_engine: MakeEngine, fake: FakeAnthropic,
                                                                  tmp_path: Path) -> None:
    program = ("const rl = require('readline').createInterface({input: process.stdin});\n"
               "rl.on('line', (l) => { const m = JSON.parse(l); if (m.method === 'initialize') {\n"
               "  console.log(JSON.stringify({jsonrpc: '2.0', id: m.id, result: {protocolVersion: 7}})); } });\n")
    record, events = await _run_with(make_engine, fake, _stand_in(tmp_path, program))
    [failed] = of_type(events, EventType.TASK_FAILED)
    assert record.state == TaskState.FAILED and failed.code == TaskFailureCode.PROTOCOL_ERROR, failed
    assert "ACP version 7" in failed.message


# -- as an operator uses it: `codesdk run --runtime gemini|opencode` ------------------------------------------------

CLI = [sys.executable, "-m", "codesdk.supervisor.cli.front"]


@EACH_AGENT
def test_codesdk_run_streams_from_the_agent(fake: FakeAnthropic, tmp_path: Path, agent: str) -> None:
    if agent == "gemini":
        env = [f"GOOGLE_GEMINI_BASE_URL={fake.gemini_base_url}", "GEMINI_API_KEY=test-key"]
        config = ["--config", "model=gemini-2.5-flash", "--config", "max_retries=0"]
    else:
        env = [f"OPENCODE_CONFIG_CONTENT={json.dumps(opencode_config(fake.chat_completions_base_url))}"]
        config = ["--config", "model=fake/fake-model"]
    args = [arg for pair in (("--env", e) for e in env) for arg in pair]
    done = subprocess.run([*CLI, "--data-dir", str(tmp_path / "data"), "run", "THINK briefly\nSAY hello from the cli",
                           "--runtime", agent, "--json", *config, *args], capture_output=True, text=True, timeout=120,
                          cwd=REPO, stdin=subprocess.DEVNULL, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    events = [json.loads(line) for line in done.stdout.splitlines()]
    assert events[-1]["type"] == "task.completed" and all(e["runtime"]["name"] == agent for e in events)
    assert "hello from the cli" in "".join(e["payload"].get("delta", "") for e in events)
    kinds = {e["payload"].get("kind") for e in events if e["type"] == "model.output.completed"}
    assert kinds == {"thinking", "text"}
