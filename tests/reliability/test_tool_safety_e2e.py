"""Tool safety end to end: a scripted runtime in a real worker asks for escapes and exec; the engine answers with
clear errors or denials as events, and nothing outside the workspace changes."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest
import trio

from codesdk.protocol import EventType, PermissionMode
from codesdk.supervisor.engine import Engine
from codesdk.supervisor.store import TaskState
from codesdk.supervisor.tools import probe_sandbox
from tests.conftest import MakeEngine
from tests.e2e.conftest import of_type, run_task


def snapshot(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() and not p.is_symlink() else None)
            for p in sorted(root.rglob("*"))}


async def results(engine: Engine, events: list[Any]) -> dict[str, Any]:
    """tool_call_id -> the stored result content of each completed call."""
    out = {}
    for completed in of_type(events, EventType.TOOL_CALL_COMPLETED):
        out[completed.tool_call_id] = json.loads(await engine.store.get_blob(completed.result_ref))
    return out


ESCAPES: list[tuple[str, str, dict[str, Any]]] = [
    ("w_dotdot", "workspace.write", {"path": "../escaped.txt", "content": "pwned"}),
    ("w_abs", "workspace.write", {"path": "{outside}/abs.txt", "content": "pwned"}),
    ("w_link", "workspace.write", {"path": "link/new.txt", "content": "pwned"}),
    ("r_link", "workspace.read", {"path": "link/secret.txt"}),
    ("l_dotdot", "workspace.list", {"path": ".."}),
    ("p_dotdot", "patch.apply", {"patch": "--- /dev/null\n+++ ../escaped.txt\n@@ -0,0 +1 @@\n+pwned\n"}),
    ("p_abs", "patch.apply", {"patch": "--- {outside}/secret.txt\n+++ {outside}/secret.txt\n"
                                       "@@ -1 +1 @@\n-top secret\n+pwned\n"}),
    ("p_link", "patch.apply", {"patch": "--- a/link/secret.txt\n+++ b/link/secret.txt\n@@ -1 +1 @@\n-top secret\n+pwned\n"}),
]


async def test_every_file_tool_refuses_escapes_through_the_engine(
    make_engine: MakeEngine, tmp_path: Path
) -> None:
    """Even in yolo mode: each escape is a tool.call.completed error with code path_refused and a reason."""
    ws, outside = tmp_path / "ws", tmp_path / "outside"
    ws.mkdir()
    outside.mkdir()
    (outside / "secret.txt").write_text("top secret\n")
    (ws / "link").symlink_to(outside)
    calls = [{"id": cid, "name": name, "input": json.loads(json.dumps(args).replace("{outside}", str(outside)))}
             for cid, name, args in ESCAPES]
    scenario = {"name": "escapes", "steps": [{"tool_calls": calls}, {"text": "done"}, {"complete": {}}]}
    before = snapshot(outside), snapshot(ws)
    with trio.fail_after(60):
        async with make_engine() as engine:
            _, record, events = await run_task(engine, workspace=ws, permission_mode=PermissionMode.YOLO,
                                               runtime_config={"scenario_inline": scenario})
            answers = await results(engine, events)
    assert record.state == TaskState.COMPLETED
    assert sorted(answers) == sorted(cid for cid, _, _ in ESCAPES)
    for cid, answer in answers.items():
        assert answer["error"]["code"] == "path_refused", (cid, answer)
        assert "refused:" in answer["error"]["message"]
    assert all(c.is_error for c in of_type(events, EventType.TOOL_CALL_COMPLETED))
    assert (snapshot(outside), snapshot(ws)) == before
    assert not (tmp_path / "escaped.txt").exists()
    outputs = [c.result_preview for c in of_type(events, EventType.TOOL_CALL_COMPLETED)]
    assert "top secret" not in json.dumps([answers, outputs])  # (the patches themselves quote it)


async def test_exec_is_denied_through_the_engine_unless_enabled(
    make_engine: MakeEngine, tmp_path: Path
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    scenario = {"name": "exec", "steps": [
        {"tool_calls": [{"id": "x", "name": "workspace.exec", "input": {"argv": ["sh", "-c", "touch pwned"]}}],
         "on_denied": [{"text": "denied: {{denied:x}}"}, {"complete": {}}]},
        {"text": "ran"}, {"complete": {}}]}
    with trio.fail_after(60):
        async with make_engine() as engine:
            _, record, events = await run_task(engine, workspace=ws, permission_mode=PermissionMode.YOLO,
                                               runtime_config={"scenario_inline": scenario})
    denied = of_type(events, EventType.TOOL_CALL_DENIED)
    assert len(denied) == 1 and "'workspace.exec' is not enabled" in denied[0].reason
    assert not of_type(events, EventType.TOOL_CALL_STARTED)
    assert of_type(events, EventType.MODEL_OUTPUT_COMPLETED)[-1].text.startswith("denied: tool 'workspace.exec'")
    assert record.state == TaskState.COMPLETED and not (ws / "pwned").exists()


SANDBOX_PROBE = """
import socket, sys
try:
    socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5)
    print("network: connected")
except OSError as exc:
    print("network: refused", exc.errno)
try:
    block = bytearray(2 << 30)
    print("memory: allocated")
except MemoryError:
    print("memory: refused")
"""


async def test_enabled_exec_runs_sandboxed_through_the_engine(
    make_engine: MakeEngine, tmp_path: Path
) -> None:
    """With exec allowlisted, the command runs, but cannot reach the host's loopback nor allocate 2 GiB."""
    tools = await probe_sandbox()
    if tools.netns_prefix is None or tools.prlimit is None:
        pytest.skip("the kernel refuses network namespaces here, or prlimit is missing")
    ws = tmp_path / "ws"
    ws.mkdir()
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        listener.setblocking(False)
        port = listener.getsockname()[1]
        call = {"id": "x", "name": "workspace.exec", "input": {"argv": ["python3", "-c", SANDBOX_PROBE, str(port)]}}
        scenario = {"name": "exec", "steps": [{"tool_calls": [call]}, {"text": "{{result:x.stdout}}"},
                                              {"complete": {}}]}
        with trio.fail_after(60):
            async with make_engine(exec_allowlist=("python3",)) as engine:
                _, record, events = await run_task(engine, workspace=ws, permission_mode=PermissionMode.YOLO,
                                                   runtime_config={"scenario_inline": scenario})
        with pytest.raises(BlockingIOError):
            listener.accept()
    completed = of_type(events, EventType.TOOL_CALL_COMPLETED)[0]
    assert completed.executed_by == "supervisor" and completed.sandbox.network is False
    assert completed.sandbox.kind == "subprocess" and completed.sandbox.memory_limit_mb == 1024
    text = of_type(events, EventType.MODEL_OUTPUT_COMPLETED)[-1].text
    assert text.startswith("network: refused") and "memory: refused" in text, text
    assert record.state == TaskState.COMPLETED
