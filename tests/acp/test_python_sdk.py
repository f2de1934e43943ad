"""``codesdk acp`` driven by an independent client: the official Python SDK (``agent-client-protocol``) over real
pipes, against a service on a unix socket. Every line the agent writes is checked against ACP's stable schema."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from acp import RequestError, text_block

from tests.api.conftest import serve_test_api
from tests.conftest import MakeEngine

from .sdk import Recorder, connect, in_thread
from .wire import check_log

#: A prompt longer than ``task.started`` keeps.
LONG_PROMPT = "write both files, " + "and mind the details " * 20


async def test_an_sdk_client_runs_cancels_loads_and_lists(make_engine: MakeEngine, tmp_path: Path) -> None:
    log = tmp_path / "wire.jsonl"
    cwd = str(tmp_path)
    async with serve_test_api(make_engine, tmp_path) as api:
        live = Recorder(answers=["allow_once", "reject_once"])

        async def first() -> tuple[str, str, Any, Any, Any]:
            async with connect(api.socket, api.alice, log, live) as conn:
                info = await conn.initialize(protocol_version=1)
                assert info.agent_capabilities.load_session
                session = await conn.new_session(cwd=cwd, mcp_servers=[],
                                                 codesdk={"runtimeConfig": {"scenario": "write-twice"}})
                done = await conn.prompt(session_id=session.session_id, prompt=[text_block(LONG_PROMPT)])
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
        assert live.asked[0][0].locations[0].path == str(Path(workspace) / "first.txt")
        assert (Path(workspace) / "first.txt").read_text() == "one\n"
        assert not (Path(workspace) / "second.txt").exists()
        assert "Not allowed" in live.text()
        assert cancelled.stop_reason == "cancelled"
        assert cancelled.field_meta["codesdk"]["receipt"]  # the stop's receipt
        assert session_id in [s.session_id for s in listed.sessions]

        # a second connection loads the session: the same history
        again = Recorder()

        async def second() -> tuple[Any, Any]:
            async with connect(api.socket, api.alice, log, again) as conn:
                loaded = await conn.load_session(cwd=cwd, session_id=session_id, mcp_servers=[])
                changed = await conn.set_config_option(config_id="mode", session_id=session_id, value="yolo")
                return loaded, changed

        loaded, changed = await in_thread(second)
        assert again.tool_states() == live.tool_states()
        assert again.text() == live.text()
        prompts = [u.content.text for u in again.updates if u.session_update == "user_message_chunk"]
        assert prompts == [LONG_PROMPT, "think"]  # whole, though the task's event keeps 200 characters
        assert loaded.field_meta["codesdk"]["lastSeq"] > 0
        mode = next(o for o in changed.config_options if o.id == "mode")
        assert mode.current_value == "yolo"

        # another tenant sees nothing of it
        async def stranger() -> tuple[Any, list[int]]:
            codes: list[int] = []
            async with connect(api.socket, api.bob, log, Recorder()) as conn:
                listed = await conn.list_sessions()
                for attempt in (conn.load_session(cwd=cwd, session_id=session_id, mcp_servers=[]),
                                conn.resume_session(cwd=cwd, session_id=session_id)):
                    try:
                        await attempt
                    except RequestError as exc:
                        codes.append(exc.code)
                return listed, codes

        bobs, refused = await in_thread(stranger)
        assert session_id not in [s.session_id for s in bobs.sessions]
        assert refused == [-32002, -32002]  # resource not found: it reveals nothing

    counts = check_log(log)
    assert counts["SessionNotification"] > 10 and counts["RequestPermissionRequest"] == 2
    assert counts["Error"] == 2 and counts["PromptResponse"] == 2


async def test_allow_always_is_a_session_grant_and_resume_picks_up_after_a_seq(make_engine: MakeEngine,
                                                                                tmp_path: Path) -> None:
    """"Always allow" on the first write grants the session's later calls of it: the second write is not asked
    about. A second connection resumes after the seq it last saw and gets only what came since."""
    log = tmp_path / "wire.jsonl"
    cwd = str(tmp_path)
    async with serve_test_api(make_engine, tmp_path) as api:
        live = Recorder(answers=["allow_session"])

        async def first() -> tuple[str, str, Any, int]:
            async with connect(api.socket, api.alice, log, live) as conn:
                session = await conn.new_session(cwd=cwd, mcp_servers=[],
                                                 codesdk={"runtimeConfig": {"scenario": "write-twice"}})
                done = await conn.prompt(session_id=session.session_id, prompt=[text_block("write both")])
                seen = max(u.field_meta["codesdk"]["seq"] for u in live.updates)
                return session.session_id, session.field_meta["codesdk"]["workspace"], done, seen

        session_id, workspace, done, seen = await in_thread(first)
        assert done.stop_reason == "end_turn"
        assert [call.tool_call_id for call, _ in live.asked] == ["call_first"]  # the grant answered the second
        assert live.tool_states() == {"call_first": "completed", "call_second": "completed"}
        assert (Path(workspace) / "second.txt").read_text() == "two\n"
        grants = (await api.client.get(f"/v1/sessions/{session_id}/grants", headers=api.auth(api.alice))).json()
        [grant] = grants["grants"]
        assert grant["scope"] == "session" and grant["tool_name"] == "workspace.write"

        # meanwhile another prompt runs elsewhere (the service's own API): the client missed it
        task = await api.run_task(api.alice, session_id, "echo")
        await api.ended(api.alice, task["task_id"])
        later = Recorder()

        async def second() -> Any:
            async with connect(api.socket, api.alice, log, later) as conn:
                return await conn.resume_session(cwd=cwd, session_id=session_id, codesdk={"afterSeq": seen})

        resumed = await in_thread(second)
        seqs = [u.field_meta["codesdk"]["seq"] for u in later.updates]
        assert seqs and min(seqs) > seen  # nothing it had seen again
        assert [u.content.text for u in later.updates if u.session_update == "user_message_chunk"] == ["hello"]
        assert resumed.field_meta["codesdk"]["lastSeq"] >= max(seqs)
    check_log(log)


async def test_a_runtimes_question_is_a_form_for_a_client_that_takes_them(make_engine: MakeEngine,
                                                                          tmp_path: Path) -> None:
    """The scripted runtime asks two questions (a choice, free text): a client that offers form elicitation is
    asked with one form and its answers reach the runtime; a declined form declines the question."""
    log = tmp_path / "wire.jsonl"
    async with serve_test_api(make_engine, tmp_path) as api:
        live = Recorder(forms=[{"colour": "red", "name": "kite"}, None], elicits=True)

        async def run() -> tuple[Any, Any]:
            async with connect(api.socket, api.alice, log, live) as conn:
                session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[],
                                                 codesdk={"runtimeConfig": {"scenario": "ask-user"}})
                answered = await conn.prompt(session_id=session.session_id, prompt=[text_block("a kite")])
                declined = await conn.prompt(session_id=session.session_id, prompt=[text_block("a boat")])
                return answered, declined

        answered, declined = await in_thread(run)
    assert answered.stop_reason == declined.stop_reason == "end_turn"
    message, mode = live.elicited[0]
    assert "a kite" in message and set(mode.requested_schema.properties) == {"colour", "name"}
    assert "Colour red, name kite." in live.text()
    assert "No answer (declined in the ACP client)" in live.text()
    assert check_log(log)["CreateElicitationRequest"] == 2


async def test_a_task_outlives_its_connection_and_another_takes_it_up(make_engine: MakeEngine,
                                                                      tmp_path: Path) -> None:
    """The first client goes away while its prompt waits for a permission; the task waits in the service. A
    second client loads the session: it sees the history, is asked for the pending permission, allows it, and the
    rest of the task streams to it."""
    log = tmp_path / "wire.jsonl"
    async with serve_test_api(make_engine, tmp_path) as api:
        gone = Recorder(answers=["never"])

        async def first() -> str:
            async with connect(api.socket, api.alice, log, gone) as conn:
                session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[],
                                                 codesdk={"runtimeConfig": {"scenario": "write-or-deny"}})
                prompt = asyncio.ensure_future(conn.prompt(session_id=session.session_id,
                                                           prompt=[text_block("take notes")]))
                await gone.until(lambda: gone.asked)
                prompt.cancel()
                return str(session.session_id)

        session_id = await in_thread(first)
        later = Recorder(answers=["allow_once"])

        async def second() -> Any:
            async with connect(api.socket, api.alice, log, later) as conn:
                loaded = await conn.load_session(cwd=str(tmp_path), session_id=session_id, mcp_servers=[])
                await later.until(lambda: "Wrote notes.txt" in later.text())
                return loaded

        loaded = await in_thread(second)
        session = (await api.client.get(f"/v1/sessions/{session_id}", headers=api.auth(api.alice))).json()
    assert loaded.field_meta["codesdk"]["activeTaskId"]
    assert [call.tool_call_id for call, _ in later.asked] == ["call_write"]
    assert later.tool_states() == {"call_write": "completed"}
    assert "I will write notes.txt." in later.text()  # the replayed start, then the live rest
    [usage] = [u for u in later.updates if u.session_update == "usage_update"]
    assert (usage.used, usage.size) == (60, 100_000)  # the scenario's tokens, in the runtime's context window
    assert (Path(session["workspace"]) / "notes.txt").is_file()
    check_log(log)
