"""A session's life through both Python clients and the ``codesdk`` command: created with a title, found by text and
state, archived and brought back, forked at an event (its transcript the conversation up to there, and a task of its
own after it), refused a fork inside a task with the seqs around it, and deleted — never another tenant's, never
while a task of it runs. The command line does the same through a service (``--url``) and on a data dir."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from codesdk import AsyncClient, Client, Conflict, DeletedSession, InvalidRequest, NotFound, Session, SessionState
from codesdk.protocol import EventType, NormalizedEvent
from codesdk.protocol import api as models
from codesdk.supervisor.cli import common

from tests.api.conftest import Api

CLI = [sys.executable, "-m", "codesdk.supervisor.cli.front"]
#: What the clients are bound by overall: the hang guard of each test, never a claim about its speed.
GUARD_S = 90
#: A task that says something, then waits until it is stopped.
HANG = {"scenario": "hang"}


def _texts(transcript: models.Transcript) -> list[str]:
    return [str(text) for message in transcript.messages for block in message.blocks
            if (text := getattr(block, "text", None))]


def _ends(events: list[NormalizedEvent]) -> list[int]:
    return [e.seq for e in events if e.type == EventType.TASK_COMPLETED]


def _ids(page: models.SessionList) -> list[str]:
    return [s.session_id for s in page.sessions]


async def _cli(api: Api, token: str, *args: str) -> subprocess.CompletedProcess[bytes]:
    """The ``codesdk`` command through the service; nothing on its stdin (as in CI)."""
    return await trio.run_process([*CLI, "--url", f"unix:{api.socket}", "--token", token, *args],
                                  stdin=subprocess.DEVNULL, capture_stdout=True, capture_stderr=True, check=False)


def _one_line(done: subprocess.CompletedProcess[bytes]) -> str:
    """A refusal: nothing on stdout, one line on stderr (no traceback); that line."""
    lines = done.stderr.decode().strip().splitlines()
    assert done.stdout == b"" and len(lines) == 1, done.stderr.decode()
    return lines[0]


async def _until_state(client: AsyncClient, session_id: str, state: SessionState) -> Session:
    """Poll the session until it is in ``state`` (the test's ``fail_after`` is the hang guard); it then."""
    while (session := await client.get_session(session_id)).state != state:
        await trio.sleep(0.02)
    return session


def test_the_command_line_knows_titles_and_states_as_the_protocol_does() -> None:
    assert common.MAX_TITLE == models.MAX_TITLE
    assert common.SESSION_STATES == tuple(f.value for f in models.SessionFilter)
    assert common.SESSION_STATES[0] == models.SessionsQuery().state  # the default first


async def test_the_async_client_titles_finds_archives_and_brings_back(api: Api) -> None:
    with trio.fail_after(GUARD_S):
        async with AsyncClient(socket=api.socket, token=api.alice) as client:
            titled = await client.create_session(namespace="user:alice", title="Fix the Parser")
            assert titled.title == "Fix the Parser" and titled.state == SessionState.IDLE
            assert titled.archived_at is None and titled.forked_from is None and titled.active_task_id is None
            plain = await client.create_session(namespace="user:alice")
            assert plain.title is None
            await client.run(plain.session_id, "look at the tokenizer-73", runtime_config={"scenario": "echo"}).wait()
            assert _ids(await client.list_sessions(q="parser")) == [titled.session_id]  # any case
            assert _ids(await client.list_sessions(q="TOKENIZER-73")) == [plain.session_id]  # a prompt's text
            assert _ids(await client.list_sessions(q="nowhere")) == []
            assert _ids(await client.list_sessions(state="idle")) == [titled.session_id, plain.session_id]
            assert _ids(await client.list_sessions(state=models.SessionFilter.BUSY)) == []

            archived = await client.archive(titled.session_id)
            assert archived.state == SessionState.ARCHIVED and archived.archived_at is not None
            assert _ids(await client.list_sessions()) == [plain.session_id]  # left out by default
            assert _ids(await client.list_sessions(q="parser")) == []
            assert _ids(await client.list_sessions(state="archived")) == [titled.session_id]
            assert _ids(await client.list_sessions(state="all", q="parser")) == [titled.session_id]
            assert (await client.get_session(titled.session_id)).state == SessionState.ARCHIVED  # still readable
            back = await client.unarchive(titled.session_id)
            assert back.state == SessionState.IDLE and back.archived_at is None
            assert _ids(await client.list_sessions()) == [titled.session_id, plain.session_id]

            changed = await client.update_session(plain.session_id, title="Tokenizer", metadata={"ticket": 73})
            assert (changed.title, changed.metadata) == ("Tokenizer", {"ticket": 73})
            kept = await client.update_session(plain.session_id, archived=False)  # only what is given changes
            assert (kept.title, kept.metadata, kept.state) == ("Tokenizer", {"ticket": 73}, SessionState.IDLE)
            for bad in ("", "x" * (models.MAX_TITLE + 1)):
                with pytest.raises(InvalidRequest):
                    await client.create_session(namespace="user:alice", title=bad)
                with pytest.raises(InvalidRequest):
                    await client.update_session(plain.session_id, title=bad)
            with pytest.raises(InvalidRequest):
                await client.list_sessions(state="sleeping")
            with pytest.raises(TypeError):
                await client.update_session(plain.session_id, archived="yes")  # type: ignore[arg-type]
        async with AsyncClient(socket=api.socket, token=api.bob) as bobs:
            assert _ids(await bobs.list_sessions(q="parser", state="all")) == []  # not his to find
            with pytest.raises(NotFound):
                await bobs.archive(titled.session_id)
            with pytest.raises(NotFound):
                await bobs.fork_session(titled.session_id)
        assert (await api.client.get(f"/v1/sessions/{titled.session_id}",
                                     headers=api.auth(api.alice))).json()["state"] == "idle"


async def test_a_fork_at_a_tasks_end_has_the_conversation_up_to_there_and_goes_on(api: Api) -> None:
    with trio.fail_after(GUARD_S):
        async with AsyncClient(socket=api.socket, token=api.alice) as client:
            parent = await client.create_session(namespace="user:alice", title="Parent",
                                                  metadata={"origin": "parent"})
            sid = parent.session_id
            await client.run(sid, "first question", runtime_config={"scenario": "echo"}).wait()
            await client.run(sid, "second question", runtime_config={"scenario": "echo"}).wait()
            events = await client.events(sid)
            first_end = _ends(events)[0]

            fork = await client.fork_session(sid, at_seq=first_end, title="Fork")
            assert fork.session_id != sid and fork.title == "Fork" and fork.metadata == {"origin": "parent"}
            assert fork.forked_from is not None and (fork.forked_from.session_id, fork.forked_from.seq) == (
                sid, first_end)
            assert fork.namespace == parent.namespace and fork.runtime == parent.runtime
            assert fork.workspace == parent.workspace  # shared: the default
            copied = await client.events(fork.session_id)
            assert copied[0].type == EventType.SESSION_CREATED
            assert [(e.type, e.payload) for e in copied[1:]] == [(e.type, e.payload) for e in events[1:first_end]]
            said = " ".join(_texts(await client.transcript(fork.session_id)))
            assert "first question" in said and "second question" not in said

            task = await client.run(fork.session_id, "third question", runtime_config={"scenario": "echo"}).wait()
            assert task.state == models.TaskState.COMPLETED and task.session_id == fork.session_id
            said = " ".join(_texts(await client.transcript(fork.session_id)))
            assert "first question" in said and "third question" in said and "second question" not in said
            assert (await client.get_session(sid)).last_seq == events[-1].seq  # the parent is left as it was

            whole = await client.fork_session(sid, workspace="new")  # the newest event; a workspace of its own
            assert whole.forked_from is not None and whole.forked_from.seq == events[-1].seq
            assert whole.workspace != parent.workspace and whole.title == "Parent"
            assert "second question" in " ".join(_texts(await client.transcript(whole.session_id)))


async def test_a_fork_inside_a_task_or_past_the_end_is_refused_with_where_to_fork(api: Api) -> None:
    with trio.fail_after(GUARD_S):
        async with AsyncClient(socket=api.socket, token=api.alice) as client:
            sid = (await client.create_session(namespace="user:alice")).session_id
            task = await client.run(sid, "one", runtime_config={"scenario": "echo"}).wait()
            events = await client.events(sid)
            started = next(e.seq for e in events if e.type == EventType.TASK_STARTED)
            end = _ends(events)[0]
            with pytest.raises(InvalidRequest) as inside:
                await client.fork_session(sid, at_seq=started + 1)
            assert inside.value.code == "fork_inside_task" and inside.value.status == 422
            assert inside.value.details == {"task_id": task.task_id, "started_seq": started, "ended_seq": end,
                                            "fork_before": started - 1}
            with pytest.raises(InvalidRequest) as past:
                await client.fork_session(sid, at_seq=end + 100)
            assert past.value.code == "fork_past_end"

            def blocking() -> dict[str, Any]:
                with Client(socket=api.socket, token=api.alice) as sync_client:
                    with pytest.raises(InvalidRequest) as refused:
                        sync_client.fork_session(sid, at_seq=started + 1)
                    assert refused.value.code == "fork_inside_task"
                    return refused.value.details

            assert (await trio.to_thread.run_sync(blocking))["fork_before"] == started - 1
            assert _ids(await client.list_sessions(state="all")) == [sid]  # nothing was made

            refused = await _cli(api, api.alice, "fork", sid, "--at", str(started + 1))
            assert refused.returncode == 2 and "fork_inside_task" in _one_line(refused)
            assert f"fork at {started - 1}" in _one_line(refused)  # it says where a fork may be cut


async def test_delete_removes_the_session_and_says_what_and_is_only_the_owners(api: Api) -> None:
    with trio.fail_after(GUARD_S):
        async with AsyncClient(socket=api.socket, token=api.alice) as client:
            sid = (await client.create_session(namespace="user:alice", title="Doomed")).session_id
            await client.run(sid, "to delete", runtime_config={"scenario": "echo"}).wait()
            events = await client.events(sid)
            workspace = (await client.get_session(sid)).workspace
            assert workspace is not None and Path(workspace).is_dir()
            async with AsyncClient(socket=api.socket, token=api.bob) as bobs:
                with pytest.raises(NotFound):
                    await bobs.delete_session(sid)
            assert (await client.get_session(sid)).last_seq == events[-1].seq  # untouched

            deleted = await client.delete_session(sid)
            assert isinstance(deleted, DeletedSession) and deleted.session_id == sid
            assert deleted.events == len(events) and deleted.stored_bytes > 0 and deleted.blobs >= 1
            assert deleted.workspace_removed and not Path(workspace).exists()
            for gone in (client.get_session(sid), client.events(sid), client.delete_session(sid)):
                with pytest.raises(NotFound):
                    await gone
            assert _ids(await client.list_sessions(state="all")) == []


async def test_a_busy_session_is_not_deleted_until_its_task_is_stopped(api: Api) -> None:
    with trio.fail_after(GUARD_S):
        async with AsyncClient(socket=api.socket, token=api.alice) as client:
            sid = (await client.create_session(namespace="user:alice")).session_id
            await client.run(sid, "before", runtime_config={"scenario": "echo"}).wait()
            before = (await client.get_session(sid)).last_seq
            task = await client.start_task(sid, "wait", runtime_config=HANG)
            assert (await _until_state(client, sid, SessionState.BUSY)).active_task_id == task.task_id
            assert _ids(await client.list_sessions(state="busy")) == [sid]
            assert _ids(await client.list_sessions(state="idle")) == []
            with pytest.raises(Conflict) as busy:
                await client.delete_session(sid)
            assert busy.value.code == "session_busy" and task.task_id in busy.value.message

            def blocking() -> str:
                with Client(socket=api.socket, token=api.alice) as sync_client:
                    with pytest.raises(Conflict) as refused:
                        sync_client.delete_session(sid)
                    return refused.value.code

            assert await trio.to_thread.run_sync(blocking) == "session_busy"
            cli = await _cli(api, api.alice, "delete", sid)
            assert cli.returncode == common.EXIT_UNAVAILABLE and "session_busy" in _one_line(cli)

            fork = await client.fork_session(sid)  # a busy session forks before its running task
            assert fork.forked_from is not None and fork.forked_from.seq == before
            assert fork.state == SessionState.IDLE

            await client.stop_task(task.task_id, "done waiting")
            assert (await _until_state(client, sid, SessionState.IDLE)).active_task_id is None
            deleted = await client.delete_session(sid)
            assert deleted.events > before and not deleted.workspace_removed  # the fork still works in it
            assert (await client.get_session(fork.session_id)).state == SessionState.IDLE


async def test_the_blocking_client_does_all_of_it(api: Api) -> None:
    def blocking() -> None:
        with Client(socket=api.socket, token=api.alice) as client:
            session = client.create_session(namespace="user:alice", title="Blocking one")
            sid = session.session_id
            client.run(sid, "blocking prompt", runtime_config={"scenario": "echo"}).wait()
            assert [s.session_id for s in client.list_sessions(q="blocking ONE").sessions] == [sid]
            assert client.archive(sid).state == SessionState.ARCHIVED
            assert client.list_sessions().sessions == ()
            assert [s.session_id for s in client.list_sessions(state="archived").sessions] == [sid]
            assert client.unarchive(sid).state == SessionState.IDLE
            assert client.update_session(sid, title="Renamed").title == "Renamed"
            end = _ends(client.events(sid))[0]
            fork = client.fork_session(sid, at_seq=end, workspace=models.ForkWorkspace.NEW, metadata={"k": 1})
            assert fork.forked_from is not None and fork.forked_from.seq == end and fork.metadata == {"k": 1}
            assert fork.workspace != session.workspace and fork.title == "Renamed"
            for gone in (fork.session_id, sid):
                deleted = client.delete_session(gone)
                assert deleted.session_id == gone and deleted.workspace_removed
                with pytest.raises(NotFound):
                    client.get_session(gone)

    with trio.fail_after(GUARD_S):
        await trio.to_thread.run_sync(blocking)


async def test_the_command_line_through_the_service(api: Api) -> None:
    with trio.fail_after(GUARD_S * 2):
        ran = await _cli(api, api.alice, "run", "first prompt", "--title", "CLI made", "--namespace", "user:alice",
                         "--scenario", "echo", "--non-interactive")
        assert ran.returncode == 0, ran.stderr.decode()
        async with AsyncClient(socket=api.socket, token=api.alice) as client:
            [session] = (await client.list_sessions()).sessions
            sid, end = session.session_id, _ends(await client.events(session.session_id))[0]
            assert session.title == "CLI made"

            found = await _cli(api, api.alice, "sessions", "--search", "cli MADE")
            assert found.returncode == 0 and found.stdout.decode().split()[0] == sid
            assert found.stdout.decode().rstrip().endswith("state=idle  CLI made")
            none = await _cli(api, api.alice, "sessions", "--state", "busy")
            assert none.returncode == 0 and none.stdout == b""

            archived = await _cli(api, api.alice, "archive", sid)
            assert archived.returncode == 0, archived.stderr.decode()
            assert archived.stdout.decode().split()[0] == sid and "state=archived" in archived.stdout.decode()
            assert (await _cli(api, api.alice, "sessions")).stdout == b""
            listed = await _cli(api, api.alice, "sessions", "--state", "archived", "--json")
            assert [json.loads(line)["session_id"] for line in listed.stdout.decode().splitlines()] == [sid]
            back = await _cli(api, api.alice, "unarchive", sid, "--json")
            assert back.returncode == 0 and json.loads(back.stdout)["state"] == "idle"

            forked = await _cli(api, api.alice, "fork", sid, "--at", str(end), "--title", "CLI fork")
            assert forked.returncode == 0, forked.stderr.decode()
            fork_id = forked.stdout.decode().splitlines()[0].split()[0]  # the new id, first on its line
            fork = await client.get_session(fork_id)
            assert fork.title == "CLI fork" and fork.forked_from is not None
            assert (fork.forked_from.session_id, fork.forked_from.seq) == (sid, end)
            assert f"run --session {fork_id}" in forked.stderr.decode()  # how to go on
            new = await _cli(api, api.alice, "fork", sid, "--new-workspace", "--json")
            assert new.returncode == 0 and json.loads(new.stdout)["workspace"] != session.workspace

            theirs = await _cli(api, api.bob, "delete", sid)
            assert theirs.returncode == 2 and _one_line(theirs)
            as_json = await _cli(api, api.alice, "delete", sid, "--json")
            assert as_json.returncode == 0, as_json.stderr.decode()
            assert models.DeletedSession.model_validate_json(as_json.stdout) == models.DeletedSession(
                session_id=sid, events=session.last_seq, stored_bytes=json.loads(as_json.stdout)["stored_bytes"],
                blobs=json.loads(as_json.stdout)["blobs"], workspace_removed=False)  # the first fork works in it
            deleted = await _cli(api, api.alice, "delete", fork_id)
            assert deleted.returncode == 0, deleted.stderr.decode()
            line = deleted.stdout.decode().strip()
            assert line.startswith(f"{fork_id} deleted: ") and " events, " in line and " blobs, " in line
            assert line.endswith("workspace removed")  # no session works in it any more
            again = await _cli(api, api.alice, "delete", fork_id)
            assert again.returncode == 2 and "not_found" in _one_line(again)

            for bad in (["fork", sid, "--at", "0"], ["fork", sid, "--title", "x" * (common.MAX_TITLE + 1)],
                        ["sessions", "--state", "sleeping"], ["sessions", "--search", ""], ["archive"]):
                refused = await _cli(api, api.alice, *bad)
                assert refused.returncode == 2 and _one_line(refused), bad


def _local(data: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CODESDK_")} | {"NO_COLOR": "1"}
    return subprocess.run([*CLI, "--data-dir", str(data), *args], capture_output=True, text=True, env=env,
                          stdin=subprocess.DEVNULL, timeout=GUARD_S, check=False)


async def test_the_command_line_on_a_data_dir(tmp_path: Path) -> None:
    """Without a service: the same commands work on the data dir, through a supervisor of their own."""
    data = tmp_path / "data"

    def drive() -> None:
        ran = _local(data, "run", "local prompt", "--title", "On disk", "--scenario", "echo", "--non-interactive")
        assert ran.returncode == 0, ran.stderr
        listed = _local(data, "sessions", "--search", "on DISK", "--json")
        [row] = [json.loads(line) for line in listed.stdout.splitlines()]
        sid = row["session_id"]
        assert row["title"] == "On disk" and row["state"] == "idle"
        inside = _local(data, "fork", sid, "--at", "3")
        assert inside.returncode == 2 and inside.stdout == "" and len(inside.stderr.strip().splitlines()) == 1
        assert "falls inside task" in inside.stderr
        end = max(json.loads(line)["seq"] for line in _local(data, "events", sid, "--json").stdout.splitlines())
        forked = _local(data, "fork", sid, "--at", str(end), "--new-workspace")
        assert forked.returncode == 0, forked.stderr
        fork_id = forked.stdout.split()[0]
        assert _local(data, "archive", sid).returncode == 0
        assert [line.split()[0] for line in _local(data, "sessions").stdout.splitlines()] == [fork_id]
        archived = _local(data, "sessions", "--state", "archived").stdout.splitlines()
        assert [line.split()[0] for line in archived] == [sid] and "state=archived" in archived[0]
        deleted = _local(data, "delete", fork_id)
        assert deleted.returncode == 0 and deleted.stdout.startswith(f"{fork_id} deleted: "), deleted.stderr
        assert deleted.stdout.rstrip().endswith("workspace removed")
        missing = _local(data, "delete", fork_id)
        assert missing.returncode == 2 and missing.stdout == "" and len(missing.stderr.strip().splitlines()) == 1

    with trio.fail_after(GUARD_S * 3):
        await trio.to_thread.run_sync(drive)
