"""A session's life through the API: retitled, archived and brought back, forked at an event into a new session
whose runtime gets the conversation up to there, and deleted whole — events, tasks, the blobs only it held, its
default workspace — but never while a task of it runs, and never what another session still holds."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import trio

from codesdk.protocol import api as models

from tests.api.conftest import Api
from tests.waits import HANG_GUARD_S


async def _run(api: Api, token: str, session_id: str, prompt: str = "hello", scenario: str = "echo",
               ) -> dict[str, Any]:
    """Start a task and wait for its end; the task as answered then."""
    r = await api.client.post(f"/v1/sessions/{session_id}/tasks", headers=api.auth(token),
                              json={"prompt": prompt, "runtime_config": {"scenario": scenario}})
    assert r.status_code == 202, r.text
    return await api.ended(token, r.json()["task_id"])


async def _events(api: Api, token: str, session_id: str) -> list[dict[str, Any]]:
    page = await api.client.get(f"/v1/sessions/{session_id}/events?limit=1000", headers=api.auth(token))
    assert page.status_code == 200, page.text
    return list(page.json()["events"])


async def _session(api: Api, token: str, namespace: str, title: str | None = None) -> str:
    body: dict[str, Any] = {"namespace": namespace} | ({"title": title} if title else {})
    r = await api.client.post("/v1/sessions", json=body, headers=api.auth(token))
    assert r.status_code == 201, r.text
    return str(r.json()["session_id"])


async def _listed(api: Api, token: str, query: str = "") -> list[str]:
    r = await api.client.get(f"/v1/sessions{query}", headers=api.auth(token))
    assert r.status_code == 200, r.text
    return [s["session_id"] for s in r.json()["sessions"]]


async def test_a_fork_racing_the_deletion_of_its_session_is_whole_or_not_at_all(api: Api) -> None:
    """Deleting a session while it is being forked: the fork is refused (404), or it holds what it copied — its
    blobs and its shared workspace stay, and it runs tasks."""
    with trio.fail_after(120):
        auth = api.auth(api.alice)
        outcomes: set[int] = set()
        for _ in range(8):
            sid = await _session(api, api.alice, "user:alice")
            await _run(api, api.alice, sid)
            [ref] = [e["payload"]["input_ref"] for e in await _events(api, api.alice, sid) if e["type"] == "model.input"]
            answers: dict[str, Any] = {}
            async with trio.open_nursery() as nursery:
                async def fork() -> None:
                    answers["fork"] = await api.client.post(f"/v1/sessions/{sid}/fork", headers=auth, json={})

                async def delete() -> None:
                    answers["delete"] = await api.client.delete(f"/v1/sessions/{sid}", headers=auth)

                nursery.start_soon(fork)
                nursery.start_soon(delete)
            assert answers["delete"].status_code == 200, answers["delete"].text
            forked = answers["fork"]
            outcomes.add(forked.status_code)
            assert forked.status_code in (201, 404), forked.text
            if forked.status_code == 201:
                made = forked.json()
                assert Path(made["workspace"]).is_dir()
                got = await api.client.get(f"/v1/sessions/{made['session_id']}/blobs/{ref}", headers=auth)
                assert got.status_code == 200, got.text
                assert (await _run(api, api.alice, made["session_id"]))["state"] == "completed"
        print(f"fork answers seen: {sorted(outcomes)}")


async def test_limits_kept_per_principal_are_not_shared_by_tokens_of_one_name(api: Api) -> None:
    """Token names are unique per namespace only: another tenant's token of the same name shares no limit."""
    with trio.fail_after(HANG_GUARD_S * 3):
        eve = api.tokens.add_principal("alice", ["user:eve"])
        for token, namespace in ((api.alice, "user:alice"), (eve, "user:eve")):
            sid = await _session(api, token, namespace)
            # built at the lowest CPU priority (SCHED_IDLE): on a busy machine it waits for idle time
            r = await api.client.get(f"/v1/sessions/{sid}/bundle", headers=api.auth(token), timeout=None)
            assert r.status_code == 200, r.text  # eve's first bundle is not within alice's interval


async def test_archived_sessions_leave_the_listings_and_come_back(api: Api) -> None:
    with trio.fail_after(60):
        auth = api.auth(api.alice)
        parser = await _session(api, api.alice, "user:alice", "Fix the parser")
        assert (await api.client.get(f"/v1/sessions/{parser}", headers=auth)).json()["last_seq"] == 1
        other = await _session(api, api.alice, "user:alice")
        await _run(api, api.alice, other, "Rewrite the README intro")
        r = await api.client.patch(f"/v1/sessions/{parser}", json={"archived": True}, headers=auth)
        assert r.status_code == 200 and r.json()["state"] == "archived" and r.json()["archived_at"], r.text
        assert await _listed(api, api.alice) == [other]
        assert await _listed(api, api.alice, "?state=archived") == [parser]
        assert await _listed(api, api.alice, "?state=all") == [parser, other]
        assert await _listed(api, api.alice, "?state=all&q=PARSER") == [parser]
        assert await _listed(api, api.alice, "?q=readme") == [other]  # a prompt of its task
        assert await _listed(api, api.admin, "?state=archived") == [parser]
        assert await _listed(api, api.bob, "?state=all&q=parser") == []  # not his
        await _run(api, api.alice, parser, "still usable")  # archived is kept whole, and usable
        r = await api.client.patch(f"/v1/sessions/{parser}", json={"archived": False, "title": "Parser, done"},
                                   headers=auth)
        assert r.json()["state"] == "idle" and r.json()["title"] == "Parser, done" and "archived_at" not in r.json()
        assert await _listed(api, api.alice) == [parser, other]
        r = await api.client.patch(f"/v1/sessions/{parser}", json={"title": None}, headers=auth)
        assert r.status_code == 200 and "title" not in r.json()  # null removes it
        for bad in ({"archived": "yes"}, {"title": ""}, {"title": "x" * 201}, {"owner": "bob"}, {"title": "a\x00b"},
                    {"metadata": {"blob": "x" * (64 * 1024)}}):
            r = await api.client.patch(f"/v1/sessions/{parser}", json=bad, headers=auth)
            assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request", (bad, r.text)
        for query in ("state=all&state=archived", "namespace=bad%20ns"):
            r = await api.client.get(f"/v1/sessions?{query}", headers=auth)
            assert r.status_code == 422, (query, r.text)
        r = await api.client.get("/v1/sessions?state=gone", headers=auth)
        assert r.status_code == 422 and "state" in r.json()["error"]["message"]
        r = await api.client.get("/v1/sessions", params={"q": "a\x00"}, headers=auth)
        assert r.status_code == 422 and "NUL" in r.json()["error"]["message"], r.text
        r = await api.client.patch(f"/v1/sessions/{parser}", json={"archived": True}, headers=api.auth(api.bob))
        assert r.status_code == 404 and r.json()["error"]["code"] == "session_not_found"


async def test_a_fork_holds_the_conversation_up_to_its_seq_and_its_runtime_is_given_it(api: Api) -> None:
    with trio.fail_after(60):
        auth = api.auth(api.alice)
        parent = await _session(api, api.alice, "user:alice", "Origin")
        await _run(api, api.alice, parent, "first prompt")
        await _run(api, api.alice, parent, "second prompt")
        events = await _events(api, api.alice, parent)
        first_end = next(e["seq"] for e in events if e["type"] == "task.completed")
        inside = next(e["seq"] for e in events if e["type"] == "model.input")
        r = await api.client.post(f"/v1/sessions/{parent}/fork", json={"at_seq": inside}, headers=auth)
        assert r.status_code == 422 and r.json()["error"]["code"] == "fork_inside_task", r.text
        details = r.json()["error"]["details"]
        assert details["ended_seq"] == first_end and details["fork_before"] == 1
        r = await api.client.post(f"/v1/sessions/{parent}/fork", json={"at_seq": events[-1]["seq"] + 1}, headers=auth)
        assert r.status_code == 422 and r.json()["error"]["code"] == "fork_past_end", r.text
        r = await api.client.post(f"/v1/sessions/{parent}/fork", json={"at_seq": first_end}, headers=api.auth(api.bob))
        assert r.status_code == 404
        r = await api.client.post(f"/v1/sessions/{parent}/fork", json={"at_seq": first_end}, headers=auth)
        assert r.status_code == 201, r.text
        fork = models.Session.model_validate(r.json())
        assert fork.forked_from == models.ForkPoint(session_id=parent, seq=first_end)
        assert (fork.title, fork.namespace, fork.runtime, fork.last_seq) == ("Origin", "user:alice", "scripted",
                                                                          first_end)
        assert fork.workspace == (await api.client.get(f"/v1/sessions/{parent}", headers=auth)).json()["workspace"]
        copied = await _events(api, api.alice, fork.session_id)
        assert [(e["seq"], e["type"]) for e in copied[1:]] == [(e["seq"], e["type"]) for e in events[1:first_end]]
        assert copied[0]["payload"]["forked_from"] == {"session_id": parent, "seq": first_end}
        transcript = (await api.client.get(f"/v1/sessions/{fork.session_id}/transcript", headers=auth)).json()
        assert [m["blocks"][0]["text"] for m in transcript["messages"]] == ["first prompt", "You said: first prompt"]
        await _run(api, api.alice, fork.session_id, "third prompt")
        after = await _events(api, api.alice, fork.session_id)
        [compiled] = [e["payload"] for e in after[first_end:] if e["type"] == "model.input"]
        assert compiled["message_count"] == 3 and compiled["resume"] != "native"  # rebuilt from the copies
        assert (await api.client.get(f"/v1/sessions/{parent}", headers=auth)).json()["last_seq"] == events[-1]["seq"]
        r = await api.client.post(f"/v1/sessions/{parent}/fork", json={"workspace": "new", "title": "Apart"},
                                  headers=auth)
        apart = models.Session.model_validate(r.json())
        assert apart.forked_from == models.ForkPoint(session_id=parent, seq=events[-1]["seq"])
        assert apart.workspace is not None and Path(apart.workspace).is_dir() and apart.workspace != fork.workspace


async def test_a_busy_session_forks_before_its_running_task_and_is_not_deleted(api: Api) -> None:
    with trio.fail_after(60):
        auth = api.auth(api.alice)
        sid = await _session(api, api.alice, "user:alice")
        await _run(api, api.alice, sid, "done")
        done = (await api.client.get(f"/v1/sessions/{sid}", headers=auth)).json()["last_seq"]
        task = await api.run_task(api.alice, sid, "hang")
        while (await api.client.get(f"/v1/sessions/{sid}", headers=auth)).json()["last_seq"] <= done + 1:
            await trio.sleep(0.05)  # the running task has events of its own
        busy = (await api.client.get(f"/v1/sessions/{sid}", headers=auth)).json()
        assert busy["state"] == "busy" and busy["active_task_id"] == task["task_id"]
        assert await _listed(api, api.alice, "?state=busy") == [sid]
        r = await api.client.post(f"/v1/sessions/{sid}/fork", headers=auth)
        assert r.status_code == 201 and r.json()["forked_from"]["seq"] == done, r.text
        r = await api.client.delete(f"/v1/sessions/{sid}", headers=auth)
        assert r.status_code == 409 and r.json()["error"]["code"] == "session_busy", r.text
        assert "stop it before deleting" in r.json()["error"]["message"]
        r = await api.client.post(f"/v1/tasks/{task['task_id']}/stop", headers=auth)
        assert r.status_code == 200
        r = await api.client.delete(f"/v1/sessions/{sid}", headers=auth)
        assert r.status_code == 200, r.text


async def test_deleting_removes_the_session_whole_but_not_what_a_fork_still_holds(
        api: Api, caplog: pytest.LogCaptureFixture) -> None:
    with trio.fail_after(HANG_GUARD_S * 3), caplog.at_level(logging.INFO, logger="codesdk.audit"):
        auth = api.auth(api.alice)
        sid = await _session(api, api.alice, "user:alice")
        task = await _run(api, api.alice, sid)
        events = await _events(api, api.alice, sid)
        [ref] = [e["payload"]["input_ref"] for e in events if e["type"] == "model.input"]
        fork = (await api.client.post(f"/v1/sessions/{sid}/fork", headers=auth)).json()["session_id"]
        lonely = await _session(api, api.alice, "user:alice")
        await _run(api, api.alice, lonely, "only here")
        [lonely_ref] = [e["payload"]["input_ref"] for e in await _events(api, api.alice, lonely)
                        if e["type"] == "model.input"]
        assert (await api.client.get(f"/v1/sessions/{sid}/bundle", headers=auth, timeout=None)).status_code == 200
        cache = api.engine.config.data_dir / "bundle-cache"
        assert any(p.name.startswith(sid) for p in cache.iterdir())
        workspace = Path((await api.client.get(f"/v1/sessions/{sid}", headers=auth)).json()["workspace"])
        (workspace / "notes.txt").write_text("kept for the fork")
        r = await api.client.delete(f"/v1/sessions/{sid}", headers=api.auth(api.bob))
        assert r.status_code == 404  # another tenant's: not found, never removed
        r = await api.client.delete(f"/v1/sessions/{sid}", headers=auth)
        assert r.status_code == 200, r.text
        deleted = models.DeletedSession.model_validate(r.json())
        assert (deleted.events, deleted.blobs, deleted.workspace_removed) == (len(events), 0, False)
        assert deleted.stored_bytes > 0
        for path in (f"/v1/sessions/{sid}", f"/v1/sessions/{sid}/events", f"/v1/sessions/{sid}/transcript",
                     f"/v1/tasks/{task['task_id']}", f"/v1/sessions/{sid}/blobs/{ref}"):
            r = await api.client.get(path, headers=auth)
            assert r.status_code == 404, (path, r.text)
        assert (await api.client.delete(f"/v1/sessions/{sid}", headers=auth)).status_code == 404
        assert workspace.is_dir()  # the fork works in it
        assert not any(p.name.startswith(sid) for p in cache.iterdir())  # its cached bundle went with it
        r = await api.client.get(f"/v1/sessions/{fork}/blobs/{ref}", headers=auth)
        assert r.status_code == 200  # the fork names it too
        r = await api.client.delete(f"/v1/sessions/{fork}", headers=auth)
        assert r.json()["blobs"] >= 1 and r.json()["workspace_removed"] is True
        assert not workspace.exists()
        r = await api.client.delete(f"/v1/sessions/{lonely}", headers=api.auth(api.admin))
        assert r.status_code == 200 and r.json()["workspace_removed"] is True
        assert not await api.engine.store.blob_exists(lonely_ref) and not await api.engine.store.blob_exists(ref)
        lines = [r.getMessage() for r in caplog.records if r.name == "codesdk.audit"]
        assert any(line.startswith(f"session.deleted by api:alice@user:alice: session={sid} ") for line in lines), lines
        assert any(line.startswith(f"session.deleted by api:admin: session={lonely} ") for line in lines), lines
        assert all(api.alice not in line for line in lines)  # never a token


async def test_a_stream_of_a_deleted_session_ends(api: Api) -> None:
    with trio.fail_after(60):
        auth = api.auth(api.alice)
        sid = await _session(api, api.alice, "user:alice")
        await _run(api, api.alice, sid)
        last = (await api.client.get(f"/v1/sessions/{sid}", headers=auth)).json()["last_seq"]
        ids: list[int] = []
        all_sent = trio.Event()
        async with api.client.stream("GET", f"/v1/sessions/{sid}/events/stream", headers=auth) as response:
            async with trio.open_nursery() as nursery:
                async def follow() -> None:
                    async for line in response.aiter_lines():  # ends with the body
                        if line.startswith("id: "):
                            ids.append(int(line.removeprefix("id: ")))
                            if len(ids) == last:
                                all_sent.set()

                nursery.start_soon(follow)
                await all_sent.wait()
                r = await api.client.delete(f"/v1/sessions/{sid}", headers=auth)
                assert r.status_code == 200
        assert ids == list(range(1, last + 1))  # all it had, then the end: no follower left hanging
