"""ACP agents (Gemini CLI, OpenCode, codex-acp), against the fake model server. Run inside scripts/netns-run only (bench.py
re-runs itself there for ``--case acp``): nothing here can reach a real API, and no real credentials are used.

Warm: one turn with one tool call (``workspace_read``) through CodeSDK (supervisor + worker running; each task
starts its own agent, as the adapter does, which starts CodeSDK's MCP bridge) versus the same turn through a minimal
ACP client written here: the same agent, launched the same way (the profile's command line, environment and
settings), given a minimal hand-written stdio MCP server (``mini_mcp_server.py``) for the tool, every permission
request answered ``allow_once``, until the prompt's answer and the agent's exit. Interleaved, after one uncounted
pair.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import trio

from fixtures.fake_anthropic import FakeAnthropic, opencode_config
from codesdk.supervisor.service.assembly import SupervisorOptions, open_engine
from codesdk.supervisor.store import TaskState
from codesdk.worker.adapters.acp import AgentProfile, agent_profiles

PROMPT = 'CALL workspace_read {"path": "a.txt"}'
MINI_MCP_SERVER = Path(__file__).resolve().with_name("mini_mcp_server.py")
#: Agents measured, and the ``runtime_config`` of their turns.
CONFIGS: dict[str, dict[str, Any]] = {"gemini": {"model": "gemini-2.5-flash", "max_retries": 0},
                                      "opencode": {"model": "fake/fake-model"},
                                      "codex-acp": {"model": "gpt-5.4-mini", "max_retries": 0}}


def profile_of(agent: str) -> AgentProfile:
    return next(p for p in agent_profiles() if p.name == agent)


def runtime_missing(agent: str) -> str | None:
    profile = profile_of(agent)
    return profile.missing_reason(os.environ) if profile.program(os.environ) is None else None  # opted in below


def agent_env(agent: str, fake: FakeAnthropic) -> dict[str, str]:
    """What a namespace is configured with to reach the fake model (as the tests' cases do)."""
    if agent == "gemini":
        return {"GOOGLE_GEMINI_BASE_URL": fake.gemini_base_url, "GEMINI_API_KEY": "fake-key"}
    if agent == "codex-acp":
        return {"OPENAI_BASE_URL": fake.openai_base_url, "OPENAI_API_KEY": "fake-key", "CODESDK_ALLOW_CODEX_ACP": "1"}
    return {"OPENCODE_CONFIG_CONTENT": json.dumps(opencode_config(fake.chat_completions_base_url))}


async def _direct_once(agent: str, environ: dict[str, str], ws: Path) -> float:
    """The turn through the agent with a minimal ACP client; the tool served by the minimal MCP server."""
    profile = profile_of(agent)
    program = profile.program(environ)
    assert program is not None
    settings = profile.settings(CONFIGS[agent])
    profile.prepare(settings, environ)
    launch = profile.launch(program, settings, cwd=str(ws), environ=environ)
    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        process: trio.Process = await nursery.start(partial(
            trio.run_process, list(launch.argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, env=dict(launch.env), cwd=launch.cwd, check=False, process_group=0))
        assert process.stdin is not None and process.stdout is not None
        stdin, stdout = process.stdin, process.stdout
        buffer = b""

        async def send(message: dict[str, Any]) -> None:
            await stdin.send_all(json.dumps({"jsonrpc": "2.0", **message}).encode() + b"\n")

        async def receive() -> dict[str, Any]:
            nonlocal buffer
            while b"\n" not in buffer:
                chunk = await stdout.receive_some(65536)
                if not chunk:
                    raise RuntimeError(f"{agent} ended its output")
                buffer += chunk
            line, buffer = buffer.split(b"\n", 1)
            return dict(json.loads(line))

        async def answer(request_id: int) -> dict[str, Any]:
            """The answer to our request ``request_id``; the agent's permission requests allowed once meanwhile."""
            while True:
                message = await receive()
                if message.get("method") == "session/request_permission":
                    option = next(o["optionId"] for o in message["params"]["options"] if o["kind"] == "allow_once")
                    await send({"id": message["id"], "result": {"outcome": {"outcome": "selected",
                                                                            "optionId": option}}})
                elif message.get("id") == request_id and "method" not in message:
                    if "error" in message:
                        raise RuntimeError(f"{agent} answered {message['error']}")
                    return dict(message["result"])

        await send({"id": 1, "method": "initialize", "params": {
            "protocolVersion": 1, "clientCapabilities": {"fs": {"readTextFile": False, "writeTextFile": False},
                                                         "terminal": False}}})
        await answer(1)
        server = {"name": "codesdk", "command": sys.executable, "args": [str(MINI_MCP_SERVER)], "env": []}
        await send({"id": 2, "method": "session/new", "params": {"cwd": str(ws), "mcpServers": [server]}})
        session = (await answer(2))["sessionId"]
        await send({"id": 3, "method": "session/prompt", "params": {
            "sessionId": session, "prompt": [{"type": "text", "text": PROMPT}]}})
        stop_reason = (await answer(3))["stopReason"]
        await stdin.aclose()
        with trio.move_on_after(profile.exit_grace_s):
            await process.wait()
        if process.returncode is None:
            os.killpg(process.pid, 15)
            await process.wait()
    elapsed = time.perf_counter() - started
    if stop_reason != "end_turn":
        raise RuntimeError(f"direct {agent} turn ended {stop_reason}")
    return elapsed


async def _pairs(agent: str, fake: FakeAnthropic, root: Path, ws: Path, repeat: int) -> dict[str, list[float]]:
    env = agent_env(agent, fake)
    direct_env = {"HOME": str(root / "home"), "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8",
                  "TMPDIR": str(root / "tmp"), **env}
    times: dict[str, list[float]] = {"direct": [], "codesdk": []}
    async with open_engine(SupervisorOptions(data_dir=root / "data", worker_env={"*": env})) as engine:
        for index in range(repeat + 1):
            direct = await _direct_once(agent, direct_env, ws)
            session = await engine.create_session(runtime=agent, workspace=ws)
            started = time.perf_counter()
            task = await engine.start_task(session.session_id, PROMPT, runtime_config=CONFIGS[agent])
            record = await engine.wait_task(task.task_id)
            ours = time.perf_counter() - started
            if record.state != TaskState.COMPLETED:
                raise RuntimeError(f"CodeSDK {agent} turn ended {record.state}: {record.error}")
            if index:
                times["direct"].append(direct)
                times["codesdk"].append(ours)
    return times


def warm(agent: str, repeat: int) -> dict[str, list[float]]:
    """Per-repetition wall times (seconds) of the turn, direct and through CodeSDK, interleaved in one run."""
    with tempfile.TemporaryDirectory(prefix=f"codesdk-bench-{agent}-") as tmp:
        root = Path(tmp)
        ws = root / "ws"
        for sub in ("ws", "home", "tmp"):
            (root / sub).mkdir()
        (ws / "a.txt").write_text("alpha\n")
        with FakeAnthropic.start(root / "api.jsonl") as fake:
            return trio.run(_pairs, agent, fake, root, ws, repeat)
