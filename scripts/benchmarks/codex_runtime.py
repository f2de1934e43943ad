"""Codex cases, against the fake model server's Responses API. Run inside scripts/netns-run only (bench.py re-runs
itself there for ``--case codex``): nothing here can reach a real API, and no real credentials are used.

Warm: one turn with one tool call (``workspace_read``) through CodeSDK (supervisor + worker running; each task
starts its own ``codex app-server``, as the adapter does) versus the same turn straight through ``codex app-server``
driven by a minimal client written here (one process per turn too; the tool answered in-process). Same flags, same
fake API, interleaved.

Cold: one whole ``codesdk run "hello" --runtime codex`` process (supervisor, worker and Codex started from nothing,
then torn down) versus ``codex exec "hello"`` with the same flags, interleaved.
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

from benchmarks.common import timed_command
from fixtures.fake_anthropic import FakeAnthropic
from codesdk.supervisor.service.assembly import SupervisorOptions, open_engine
from codesdk.supervisor.store import TaskState
from codesdk.worker.adapters.codex.launch import CodexSettings, codex_launch, codex_path

PROMPT = 'CALL workspace_read {"path": "a.txt"}'
CONFIG: dict[str, Any] = {"model": "fake-model", "max_retries": 0}
REPO = Path(__file__).resolve().parents[2]


def runtime_missing() -> str | None:
    if codex_path() is None:
        return "Codex is not installed (./scripts/install-runtimes needs node and npm)"
    return None


def _env(base_url: str, home: Path) -> dict[str, str]:
    return {"HOME": str(home), "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8",
            "OPENAI_API_KEY": "sk-fake", "OPENAI_BASE_URL": base_url}


async def _direct_once(base_url: str, home: Path, ws: Path) -> float:
    """The turn through ``codex app-server`` with a minimal client: handshake, thread with one dynamic tool, turn,
    the tool call answered by reading the file, until ``turn/completed``."""
    binary = codex_path()
    assert binary is not None
    (home / ".codex").mkdir(parents=True, exist_ok=True)
    launch = codex_launch(binary, CodexSettings(model="fake-model", max_retries=0), cwd=str(ws),
                          environ=_env(base_url, home))
    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        process: trio.Process = await nursery.start(partial(
            trio.run_process, list(launch.argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, env=dict(launch.env), cwd=launch.cwd, check=False))
        assert process.stdin is not None and process.stdout is not None
        stdin, stdout = process.stdin, process.stdout
        buffer = b""

        async def send(message: dict[str, Any]) -> None:
            await stdin.send_all(json.dumps(message).encode() + b"\n")

        async def receive() -> dict[str, Any]:
            nonlocal buffer
            while b"\n" not in buffer:
                chunk = await stdout.receive_some(65536)
                if not chunk:
                    raise RuntimeError("codex app-server ended its output")
                buffer += chunk
            line, buffer = buffer.split(b"\n", 1)
            return dict(json.loads(line))

        async def answer(request_id: int) -> dict[str, Any]:
            while (message := await receive()).get("id") != request_id or "method" in message:
                pass
            return message

        await send({"id": 1, "method": "initialize", "params": {
            "clientInfo": {"name": "bench", "version": "1"}, "capabilities": {"experimentalApi": True}}})
        await answer(1)
        await send({"method": "initialized"})
        tool = {"type": "function", "name": "workspace_read", "description": "Read a file of the workspace",
                "inputSchema": {"type": "object", "properties": {"path": {"type": "string"}}}}
        await send({"id": 2, "method": "thread/start", "params": {
            "cwd": str(ws), "model": "fake-model", "approvalPolicy": "untrusted", "sandbox": "read-only",
            "dynamicTools": [tool]}})
        thread = (await answer(2))["result"]["thread"]["id"]
        await send({"id": 3, "method": "turn/start", "params": {"threadId": thread,
                                                                 "input": [{"type": "text", "text": PROMPT}]}})
        while True:
            message = await receive()
            if message.get("method") == "item/tool/call":
                path = message["params"]["arguments"]["path"]
                text = json.dumps({"path": path, "text": (ws / path).read_text()})
                await send({"id": message["id"], "result": {"contentItems": [{"type": "inputText", "text": text}],
                                                            "success": True}})
            elif message.get("method") == "turn/completed":
                status = message["params"]["turn"]["status"]
                break
        await stdin.aclose()
        await process.wait()
    elapsed = time.perf_counter() - started
    if status != "completed":
        raise RuntimeError(f"direct Codex turn ended {status}")
    return elapsed


async def _pairs(base_url: str, root: Path, ws: Path, home: Path, repeat: int) -> dict[str, list[float]]:
    """Interleaved: a direct turn, then the same turn through CodeSDK, ``repeat`` times (after one uncounted pair:
    the binary's first start, its home, the worker)."""
    env = {"OPENAI_API_KEY": "sk-fake", "OPENAI_BASE_URL": base_url}
    times: dict[str, list[float]] = {"direct": [], "codesdk": []}
    async with open_engine(SupervisorOptions(data_dir=root / "data", worker_env={"*": env})) as engine:
        for index in range(repeat + 1):
            direct = await _direct_once(base_url, home, ws)
            session = await engine.create_session(runtime="codex", workspace=ws)
            started = time.perf_counter()
            task = await engine.start_task(session.session_id, PROMPT, runtime_config=CONFIG)
            record = await engine.wait_task(task.task_id)
            ours = time.perf_counter() - started
            if record.state != TaskState.COMPLETED:
                raise RuntimeError(f"CodeSDK Codex turn ended {record.state}: {record.error}")
            if index:
                times["direct"].append(direct)
                times["codesdk"].append(ours)
    return times


def warm(repeat: int) -> dict[str, list[float]]:
    """Per-repetition wall times (seconds) of the turn, direct and through CodeSDK, interleaved in one run."""
    with tempfile.TemporaryDirectory(prefix="codesdk-bench-codex-") as tmp:
        root = Path(tmp)
        ws, home = root / "ws", root / "home"
        ws.mkdir()
        (ws / "a.txt").write_text("alpha\n")
        with FakeAnthropic.start(root / "api.jsonl") as fake:
            return trio.run(_pairs, fake.openai_base_url, root, ws, home, repeat)


def cold(repeat: int) -> dict[str, list[float]]:
    """Per-repetition wall times of a cold ``codesdk run --runtime codex`` and of ``codex exec``, interleaved
    (after one uncounted run of each)."""
    binary = codex_path()
    assert binary is not None
    with tempfile.TemporaryDirectory(prefix="codesdk-bench-codex-cold-") as tmp:
        root = Path(tmp)
        for sub in ("home/.codex", "operator", "ws"):
            (root / sub).mkdir(parents=True)
        with FakeAnthropic.start(root / "api.jsonl") as fake:
            env = _env(fake.openai_base_url, root / "home")
            launch = codex_launch(binary, CodexSettings(model="fake-model", max_retries=0), cwd=str(root / "ws"),
                                  environ=env)
            direct = [str(binary), "exec", *launch.argv[2:], "--skip-git-repo-check", "-m", "fake-model", "hello"]
            script = Path(sys.executable).with_name("codesdk")
            ours = [str(script), "--data-dir", str(root / "data"), "run", "hello", "--runtime", "codex", "--json",
                    "--config", "model=fake-model", "--config", "max_retries=0",
                    "--env", f"OPENAI_BASE_URL={fake.openai_base_url}", "--env", "OPENAI_API_KEY=sk-fake"]
            ours_env = {"PATH": env["PATH"], "LANG": "C.UTF-8", "HOME": str(root / "operator")}
            times: dict[str, list[float]] = {"direct": [], "codesdk": []}
            for index in range(repeat + 1):
                d = timed_command(direct, dict(launch.env), root / "ws", "Echo: hello")
                o = timed_command(ours, ours_env, REPO, '"type":"task.completed"')
                if index:
                    times["direct"].append(d)
                    times["codesdk"].append(o)
    return times
