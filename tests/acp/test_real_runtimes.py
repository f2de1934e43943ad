"""Real runtimes behind ``codesdk acp``: Codex (``codex app-server``) and Claude Code against the fake model APIs,
inside the loopback-only network namespace, driven by the official Python SDK — the model's write asked about
through ``session/request_permission``, allowed once, run by the supervisor, its result read by the model."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
from acp import text_block

from codesdk.supervisor.api import TokenAuth
from codesdk.supervisor.api.server import serve_api
from codesdk.worker.adapters.claude.launch import cli_path
from codesdk.worker.adapters.codex.launch import codex_path
from fixtures.fake_anthropic import FakeAnthropic

from tests.conftest import MakeEngine
from tests.contract.cases import CODEX_CONFIG, ClaudeCase, CodexCase
from tests.netns import skip_outside_netns

from .sdk import Recorder, connect, in_thread
from .wire import check_log

needs_codex = pytest.mark.skipif(codex_path() is None,
                                 reason="Codex is not installed: ./scripts/install-runtimes (needs node and npm)")
needs_claude = pytest.mark.skipif(cli_path() is None, reason="claude-agent-sdk is not installed")
pytestmark = [pytest.mark.runtime, skip_outside_netns]


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeAnthropic]:
    with FakeAnthropic.start(tmp_path / "api.jsonl") as server:
        yield server


@pytest.mark.parametrize("runtime", [pytest.param("codex", marks=needs_codex),
                                     pytest.param("claude", marks=needs_claude)])
async def test_a_real_runtime_writes_through_an_acp_clients_permission(
        runtime: str, make_engine: MakeEngine, fake: FakeAnthropic, tmp_path: Path) -> None:
    log = tmp_path / "wire.jsonl"
    data_dir = tmp_path / "data"
    live = Recorder(answers=["allow_once"])
    with trio.fail_after(180):
        case = CodexCase(fake.openai_base_url) if runtime == "codex" else ClaudeCase(fake.base_url)
        async with make_engine(data_dir=data_dir, worker_env={"*": case.worker_env()}) \
                as engine, trio.open_nursery() as nursery:
            auth = TokenAuth.bootstrap(data_dir)
            alice = auth.add_principal("alice", ["user:alice"])
            sock = tmp_path / "run" / "api.sock"
            await nursery.start(partial(serve_api, engine, auth, sock, None))

            async def run() -> tuple[Any, str]:
                async with connect(sock, alice, log, live, runtime=runtime) as conn:
                    config = {"max_retries": 0} if runtime == "codex" else {}
                    session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[],
                                                     codesdk={"runtimeConfig": config})
                    options = {o.id: o for o in session.config_options}
                    if runtime == "codex":  # Codex takes a model: the option is there, and the client chooses
                        assert options["model"].current_value == "default"
                        await conn.set_config_option(config_id="model", session_id=session.session_id,
                                                     value=CODEX_CONFIG["model"])
                    prompt = 'CALL workspace_write {"path": "notes.txt", "content": "written by codex\\n"}'
                    done = await conn.prompt(session_id=session.session_id, prompt=[text_block(prompt)])
                    return done, session.field_meta["codesdk"]["workspace"]

            done, workspace = await in_thread(run)
            nursery.cancel_scope.cancel()
    assert done.stop_reason == "end_turn"
    assert [call.title for call, _ in live.asked] == ["workspace.write"]
    assert set(live.tool_states().values()) == {"completed"}
    assert (Path(workspace) / "notes.txt").read_text() == "written by codex\n"
    assert "RESULTS:" in live.text()  # the model read the tool's result
    assert done.field_meta["codesdk"]["usage"]["inputTokens"] > 0
    if runtime == "codex":
        assert {r["body"]["model"] for r in fake.requests("/v1/responses")} == {CODEX_CONFIG["model"]}
    check_log(log)
