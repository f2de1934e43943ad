"""``codesdk acp`` driven by an independent client: the official Python SDK (``agent-client-protocol``) over real
pipes, against a service on a unix socket. Every line the agent writes is checked against ACP's stable schema."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio
from acp import RequestError, spawn_agent_process, text_block
from acp.schema import AllowedOutcome, DeniedOutcome, PermissionOption, RequestPermissionResponse

from tests.api.conftest import Api, serve_test_api
from tests.conftest import MakeEngine
from tests.waits import HANG_GUARD_S

from .wire import check_log

TEE = Path(__file__).with_name("tee.py")


@dataclass
class Recorder:
    """An ACP client that records what the agent streams, and answers permission requests from a script."""

    answers: list[str] = field(default_factory=list)  # option ids, in order; "cancelled" for none
    updates: list[Any] = field(default_factory=list)
    asked: list[Any] = field(default_factory=list)
    first_chunk: asyncio.Event = field(default_factory=asyncio.Event)

    async def request_permission(self, session_id: str, tool_call: Any, options: list[PermissionOption],
                                 **kwargs: Any) -> RequestPermissionResponse:
        self.asked.append((tool_call, options))
        answer = self.answers.pop(0) if self.answers else "cancelled"
        if answer == "cancelled":
            return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
        return RequestPermissionResponse(outcome=AllowedOutcome(outcome="selected", option_id=answer))

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.updates.append(update)
        if update.session_update == "agent_message_chunk":
            self.first_chunk.set()

    def text(self) -> str:
        return "".join(u.content.text for u in self.updates if u.session_update == "agent_message_chunk")

    def tool_states(self) -> dict[str, str]:
        """Each tool call's last status."""
        states: dict[str, str] = {}
        for u in self.updates:
            if u.session_update in ("tool_call", "tool_call_update") and u.status:
                states[u.tool_call_id] = u.status
        return states


def acp_command(api: Api, token: str, log: Path) -> list[str]:
    return [str(TEE), str(log), "--", sys.executable, "-m", "codesdk.supervisor.cli.front", "--url",
            f"unix:{api.socket}", "--token", token, "acp", "--runtime", "scripted"]


@asynccontextmanager
async def connect(api: Api, token: str, log: Path, client: Recorder) -> AsyncIterator[Any]:
    to_client: Any = client  # the SDK's Client protocol lists every method; this client needs two
    async with spawn_agent_process(to_client, sys.executable, *acp_command(api, token, log)) as (conn, _process):
        answer = await conn.initialize(protocol_version=1)
        assert answer.protocol_version == 1
        yield conn


def in_thread(scenario: Callable[[], Any]) -> Any:
    """Run an asyncio scenario (the SDK's loop) from the trio test, in a thread of its own."""
    async def run() -> Any:
        return await asyncio.wait_for(scenario(), HANG_GUARD_S)
    return trio.to_thread.run_sync(asyncio.run, run())


async def test_an_sdk_client_runs_cancels_loads_and_lists(make_engine: MakeEngine, tmp_path: Path) -> None:
    log = tmp_path / "wire.jsonl"
    cwd = str(tmp_path)
    async with serve_test_api(make_engine, tmp_path) as api:
        live = Recorder(answers=["allow_once", "reject_once"])

        async def first() -> tuple[str, str, Any, Any, Any]:
            async with connect(api, api.alice, log, live) as conn:
                info = await conn.initialize(protocol_version=1)
                assert info.agent_capabilities.load_session
                session = await conn.new_session(cwd=cwd, mcp_servers=[],
                                                 codesdk={"runtimeConfig": {"scenario": "write-twice"}})
                done = await conn.prompt(session_id=session.session_id, prompt=[text_block("write both")])
                workspace = session.field_meta["codesdk"]["workspace"]
                # cancel mid-turn: a prompt that hangs after its first words
                live.first_chunk.clear()
                hang = conn.prompt(session_id=session.session_id, prompt=[text_block("think")],
                                   codesdk={"runtimeConfig": {"scenario": "hang"}})
                running = asyncio.ensure_future(hang)
                await live.first_chunk.wait()
                await conn.cancel(session_id=session.session_id)
                cancelled = await running
                listed = await conn.list_sessions()
                return session.session_id, workspace, done, cancelled, listed

        session_id, workspace, done, cancelled, listed = await in_thread(first)

        assert done.stop_reason == "end_turn"
        assert [call.tool_call_id for call, _ in live.asked] == ["call_first", "call_second"]
        assert {o.kind for o in live.asked[0][1]} == {"allow_once", "allow_always", "reject_once"}
        assert live.tool_states() == {"call_first": "completed", "call_second": "failed"}
        assert (Path(workspace) / "first.txt").read_text() == "one\n"
        assert not (Path(workspace) / "second.txt").exists()
        assert "Not allowed" in live.text()
        assert cancelled.stop_reason == "cancelled"
        assert cancelled.field_meta["codesdk"]["receipt"]  # the stop's receipt
        assert session_id in [s.session_id for s in listed.sessions]

        # a second connection loads the session: the same history
        again = Recorder()

        async def second() -> tuple[Any, Any]:
            async with connect(api, api.alice, log, again) as conn:
                loaded = await conn.load_session(cwd=cwd, session_id=session_id, mcp_servers=[])
                changed = await conn.set_config_option(config_id="mode", session_id=session_id, value="yolo")
                return loaded, changed

        loaded, changed = await in_thread(second)
        assert again.tool_states() == live.tool_states()
        assert again.text() == live.text()
        prompts = [u.content.text for u in again.updates if u.session_update == "user_message_chunk"]
        assert prompts == ["write both", "think"]
        assert loaded.field_meta["codesdk"]["lastSeq"] > 0
        mode = next(o for o in changed.config_options if o.id == "mode")
        assert mode.current_value == "yolo"

        # another tenant sees nothing of it
        async def stranger() -> tuple[Any, int]:
            async with connect(api, api.bob, log, Recorder()) as conn:
                listed = await conn.list_sessions()
                try:
                    await conn.load_session(cwd=cwd, session_id=session_id, mcp_servers=[])
                except RequestError as exc:
                    return listed, exc.code
                return listed, 0

        bobs, refused = await in_thread(stranger)
        assert session_id not in [s.session_id for s in bobs.sessions]
        assert refused == -32002  # resource not found: it reveals nothing

    counts = check_log(log)
    assert counts["SessionNotification"] > 10 and counts["RequestPermissionRequest"] == 2
    assert counts["Error"] == 1 and counts["PromptResponse"] == 2
