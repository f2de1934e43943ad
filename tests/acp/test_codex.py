"""A real runtime behind ``codesdk acp``: Codex (``codex app-server``) against the fake Responses API, inside the
loopback-only network namespace, driven by the official Python SDK — its write asked about through
``session/request_permission``, allowed once, run by the supervisor."""

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
from codesdk.worker.adapters.codex.launch import codex_path
from fixtures.fake_anthropic import FakeAnthropic

from tests.conftest import MakeEngine
from tests.contract.cases import CODEX_CONFIG, CodexCase
from tests.netns import skip_outside_netns

from .sdk import Recorder, connect, in_thread
from .wire import check_log

needs_codex = pytest.mark.skipif(codex_path() is None,
                                 reason="Codex is not installed: ./scripts/install-runtimes (needs node and npm)")
pytestmark = [pytest.mark.runtime, skip_outside_netns, needs_codex]


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeAnthropic]:
    with FakeAnthropic.start(tmp_path / "api.jsonl") as server:
        yield server


async def test_codex_writes_through_an_acp_clients_permission(make_engine: MakeEngine, fake: FakeAnthropic,
                                                              tmp_path: Path) -> None:
    log = tmp_path / "wire.jsonl"
    data_dir = tmp_path / "data"
    live = Recorder(answers=["allow_once"])
    with trio.fail_after(180):
        async with make_engine(data_dir=data_dir, worker_env={"*": CodexCase(fake.openai_base_url).worker_env()}) \
                as engine, trio.open_nursery() as nursery:
            auth = TokenAuth.bootstrap(data_dir)
            alice = auth.add_principal("alice", ["user:alice"])
            sock = tmp_path / "run" / "api.sock"
            await nursery.start(partial(serve_api, engine, auth, sock, None))

            async def run() -> tuple[Any, str]:
                async with connect(sock, alice, log, live, runtime="codex") as conn:
                    session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[],
                                                     codesdk={"runtimeConfig": {"max_retries": 0}})
                    options = {o.id: o for o in session.config_options}
                    assert options["model"].current_value == "default"  # Codex takes a model: the option is there
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
    assert {r["body"]["model"] for r in fake.requests("/v1/responses")} == {CODEX_CONFIG["model"]}
    check_log(log)
