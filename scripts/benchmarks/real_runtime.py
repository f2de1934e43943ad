"""Case 7: overhead over a real runtime. One turn with one tool call on Claude Code (the installed runtime),
run directly through claude-agent-sdk with an in-process tool versus through CodeSDK (supervisor + worker +
tools), both against the fake Anthropic server. Must run inside scripts/netns-run (loopback only): nothing
here can reach a real API, and no real credentials are used.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from fixtures.fake_anthropic import CLAUDE_OFFLINE_ENV, FakeAnthropic
from supervisor.app import SupervisorOptions, open_engine
from supervisor.store import TaskState
from worker.adapters.claude import _env

PROMPT = 'CALL workspace_read {"path": "a.txt"}'
TOOL = "workspace_read"


def runtime_missing() -> str | None:
    """Why case 7 cannot run here, or None."""
    if _env.cli_path() is None:
        return "no real runtime installed (claude-agent-sdk with its bundled Claude Code CLI not found)"
    return None


async def _direct_once(base_url: str, home: Path, ws: Path) -> float:
    """The same turn straight through claude-agent-sdk: one in-process MCP tool that reads the file."""
    from claude_agent_sdk import (
        ClaudeAgentOptions,
        ClaudeSDKClient,
        ResultMessage,
        create_sdk_mcp_server,
        tool,
    )

    @tool(TOOL, "Read a file of the workspace", {"path": str})
    async def workspace_read(args: dict[str, Any]) -> dict[str, Any]:
        text = (ws / args["path"]).read_text()
        return {"content": [{"type": "text", "text": json.dumps({"path": args["path"], "text": text})}]}

    options = ClaudeAgentOptions(
        tools=[], allowed_tools=[f"mcp__codesdk__{TOOL}"], strict_mcp_config=True, setting_sources=[], plugins=[],
        mcp_servers={"codesdk": create_sdk_mcp_server("codesdk", "1.0.0", [workspace_read])},
        cwd=str(ws), include_partial_messages=True, cli_path=str(_env.cli_path()), model="claude-sonnet-4-5",
        env={**CLAUDE_OFFLINE_ENV, "ANTHROPIC_BASE_URL": base_url, "HOME": str(home)})
    started = time.perf_counter()
    result = None
    async with ClaudeSDKClient(options=options) as client:
        await client.query(PROMPT)
        async for message in client.receive_response():
            if isinstance(message, ResultMessage):
                result = message
    elapsed = time.perf_counter() - started
    if result is None or result.is_error:
        raise RuntimeError(f"direct Claude turn failed: {result}")
    return elapsed


async def _codesdk_runs(base_url: str, data_dir: Path, ws: Path, repeat: int) -> list[float]:
    """The same turn through CodeSDK; the first (uncounted) task starts the worker."""
    env = {"ANTHROPIC_BASE_URL": base_url, "ANTHROPIC_API_KEY": CLAUDE_OFFLINE_ENV["ANTHROPIC_API_KEY"],
           "CLAUDE_CODE_MAX_RETRIES": "0"}
    times = []
    async with open_engine(SupervisorOptions(data_dir=data_dir, worker_env={"*": env})) as engine:
        for index in range(repeat + 1):
            session = await engine.create_session(runtime="claude", workspace=ws)
            started = time.perf_counter()
            task = await engine.start_task(session.session_id, PROMPT)
            record = await engine.wait_task(task.task_id)
            elapsed = time.perf_counter() - started
            if record.state != TaskState.COMPLETED:
                raise RuntimeError(f"CodeSDK Claude turn ended {record.state}: {record.error}")
            if index:
                times.append(elapsed)
    return times


def run(repeat: int) -> dict[str, Any]:
    """Per-repetition wall times (seconds), direct and through CodeSDK, interleaved in one run."""
    with tempfile.TemporaryDirectory(prefix="codesdk-bench-claude-") as tmp:
        root = Path(tmp)
        ws, home = root / "ws", root / "home"
        ws.mkdir()
        home.mkdir()
        (ws / "a.txt").write_text("alpha\n")
        with FakeAnthropic.start(root / "api.jsonl") as fake:
            trio.run(_direct_once, fake.base_url, home, ws)  # warm: first start of the CLI, its HOME, caches
            direct = [trio.run(_direct_once, fake.base_url, home, ws) for _ in range(repeat)]
            ours = trio.run(_codesdk_runs, fake.base_url, root / "data", ws, repeat)
            tool_calls = sum(1 for r in fake.requests("/v1/messages")
                             if any(b.get("type") == "tool_use" for b in r.get("reply", {}).get("content", [])))
    return {"direct": direct, "codesdk": ours, "tool_turns": tool_calls}
