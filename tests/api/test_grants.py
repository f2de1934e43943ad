"""Scoped grants, edited inputs and batched decisions over the API, on the scripted runtime."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from codesdk import AsyncClient
from codesdk.protocol import EventType, GrantScope, NormalizedEvent
from codesdk.supervisor.engine import GrantBook
from codesdk.testing.invariants import check_session

from tests.api.conftest import Api


def _write(call_id: str, path: str, content: str = "x\n") -> dict[str, Any]:
    return {"id": call_id, "name": "workspace.write", "input": {"path": path, "content": content}}


def _scenario(*calls: list[dict[str, Any]]) -> dict[str, Any]:
    """Each item one step of tool calls (several: parallel), then the end."""
    steps: list[dict[str, Any]] = [{"tool_calls": step} for step in calls]
    return {"scenario_inline": {"name": "writes", "steps": [*steps, {"text": "done"}, {"complete": {}}]}}


async def _start(api: Api, session_id: str, config: dict[str, Any], token: str | None = None) -> str:
    r = await api.client.post(f"/v1/sessions/{session_id}/tasks", headers=api.auth(token or api.alice), json={
        "prompt": "write", "interaction_mode": "interactive", "runtime_config": config})
    assert r.status_code == 202, r.text
    return str(r.json()["task_id"])


async def _pending(api: Api, count: int = 1) -> list[dict[str, Any]]:
    while len(pending := (await api.client.get("/v1/approvals", headers=api.auth(api.alice))).json()["approvals"]) \
            < count:
        await trio.sleep(0.05)
    return list(pending)


async def _decide(api: Api, approval_id: str, body: dict[str, Any], token: str | None = None) -> Any:
    return await api.client.post(f"/v1/approvals/{approval_id}", headers=api.auth(token or api.alice), json=body)


async def _events(api: Api, session_id: str) -> list[NormalizedEvent]:
    async with AsyncClient(socket=api.socket, token=api.alice) as client:
        return await client.events(session_id, limit=1000)


def _of(events: list[NormalizedEvent], event_type: EventType) -> list[Any]:
    return [e.payload for e in events if e.type == event_type]


async def test_a_session_grant_answers_the_next_matching_call_and_is_revocable(api: Api) -> None:
    with trio.fail_after(60):
        session = (await api.create_session(api.alice, "user:alice"))["session_id"]
        task = await _start(api, session, _scenario([_write("w1", "a.txt")], [_write("w2", "b.txt")]))
        [approval] = await _pending(api)
        r = await _decide(api, approval["approval_id"], {"allow": True, "scope": "session"})
        assert r.status_code == 200, r.text
        assert (await api.ended(api.alice, task))["state"] == "completed"
        events = await _events(api, session)
        check_session(events)
        assert len(_of(events, EventType.APPROVAL_REQUESTED)) == 1  # the second write was not asked
        [grant] = _of(events, EventType.GRANT_CREATED)
        assert (grant.scope, grant.tool_name, grant.approval_id) == (GrantScope.SESSION, "workspace.write",
                                                                      approval["approval_id"])
        by_grant = [p for p in _of(events, EventType.TOOL_CALL_POLICY_EVALUATED) if p.rule == "grant.session"]
        assert [p.grant_id for p in by_grant] == [grant.grant_id]

        listed = await api.client.get(f"/v1/sessions/{session}/grants", headers=api.auth(api.alice))
        assert listed.status_code == 200 and [g["state"] for g in listed.json()["grants"]] == ["active"]
        # Another tenant sees neither the session's grants nor may revoke them.
        assert (await api.client.get(f"/v1/sessions/{session}/grants", headers=api.auth(api.bob))).status_code == 404
        url = f"/v1/sessions/{session}/grants/{grant.grant_id}"
        assert (await api.client.delete(url, headers=api.auth(api.bob))).status_code == 404
        revoked = await api.client.delete(url, headers=api.auth(api.alice))
        assert revoked.status_code == 200 and revoked.json()["state"] == "revoked"
        again = await api.client.delete(url, headers=api.auth(api.alice))
        assert again.status_code == 409 and again.json()["error"]["code"] == "already_revoked"
        unknown = await api.client.delete(f"/v1/sessions/{session}/grants/grt_nope", headers=api.auth(api.alice))
        assert unknown.status_code == 404

        # Revoked, it decides nothing: the next task's write is asked again.
        task = await _start(api, session, _scenario([_write("w3", "c.txt")]))
        [approval] = await _pending(api)
        assert (await _decide(api, approval["approval_id"], {"allow": True})).status_code == 200
        assert (await api.ended(api.alice, task))["state"] == "completed"
        events = await _events(api, session)
        check_session(events)
        assert len(_of(events, EventType.APPROVAL_REQUESTED)) == 2
        assert len(_of(events, EventType.GRANT_REVOKED)) == 1


async def test_a_task_grant_ends_with_its_task_and_a_rule_covers_its_pattern_only(api: Api) -> None:
    with trio.fail_after(60):
        session = (await api.create_session(api.alice, "user:alice"))["session_id"]
        task = await _start(api, session, _scenario([_write("w1", "src/a.txt")], [_write("w2", "src/b.txt")]))
        [approval] = await _pending(api)
        assert (await _decide(api, approval["approval_id"], {"allow": True, "scope": "task"})).status_code == 200
        assert (await api.ended(api.alice, task))["state"] == "completed"
        # the next task is asked (the task grant was the last one's); a rule for src/ answers src/, not docs/
        task = await _start(api, session, _scenario([_write("w3", "src/c.txt")], [_write("w4", "src/d.txt")],
                                                    [_write("w5", "docs/e.txt")]))
        [approval] = await _pending(api)
        r = await _decide(api, approval["approval_id"], {"allow": True, "scope": "rule",
                                                         "pattern": {"kind": "path", "prefix": "src"}})
        assert r.status_code == 200, r.text
        [approval] = await _pending(api)
        assert approval["input"]["path"] == "docs/e.txt"
        assert (await _decide(api, approval["approval_id"], {"allow": False})).status_code == 200
        assert (await api.ended(api.alice, task))["state"] == "completed"
        events = await _events(api, session)
        check_session(events)
        rules = [p.rule for p in _of(events, EventType.TOOL_CALL_POLICY_EVALUATED) if p.source == "user"]
        assert rules == ["user.answer", "grant.task", "user.answer", "grant.rule", "user.answer"]

        # Rebuilt from the events (as after a restart): the rule is live, the task grant too but for its task only.
        session_record = await api.engine.store.get_session(session)
        live = await GrantBook(api.engine.store).live(session_record)
        assert sorted(g.scope.value for g in live) == ["rule", "task"]


async def test_bad_decisions_are_refused_naming_the_field(api: Api) -> None:
    with trio.fail_after(60):
        session = (await api.create_session(api.alice, "user:alice"))["session_id"]
        task = await _start(api, session, _scenario([_write("w1", "a.txt")]))
        [approval] = await _pending(api)
        approval_id = approval["approval_id"]
        for body, field in [
            ({"allow": True, "scope": "forever"}, "scope"),
            ({"allow": True, "scope": "rule"}, "pattern"),
            ({"allow": True, "scope": "session", "pattern": {"kind": "path", "prefix": "src"}}, "pattern"),
            ({"allow": True, "scope": "rule", "pattern": {"kind": "path", "prefix": "../etc"}}, "pattern.path.prefix"),
            ({"allow": True, "scope": "rule", "pattern": {"kind": "command", "argv": ["ls"]}}, "pattern"),
            ({"allow": False, "input": {"path": "b.txt", "content": ""}}, "input"),
            ({"allow": True, "input": {"content": "no path"}}, "input.path"),
            ({"allow": True, "input": {"path": "b.txt", "content": "", "mode": "x"}}, "input.mode"),
            ({"allow": True, "input": {"path": "../../etc/passwd", "content": ""}}, "input.path"),
            ({"allow": True, "input": {"path": "/etc/passwd", "content": ""}}, "input.path"),
            ({"allow": True, "input": {"path": "a\x00b", "content": ""}}, "input.path"),
        ]:
            r = await _decide(api, approval_id, body)
            assert r.status_code == 422, (body, r.text)
            assert f"'{field}'" in r.json()["error"]["message"], (body, r.text)
        # none of them decided it
        assert (await _decide(api, approval_id, {"allow": True})).status_code == 200
        assert (await api.ended(api.alice, task))["state"] == "completed"


async def test_an_approver_edits_the_input_before_allowing(api: Api) -> None:
    with trio.fail_after(60):
        created = await api.create_session(api.alice, "user:alice")
        session = created["session_id"]
        task = await _start(api, session, _scenario([_write("w1", "notes.txt", "original\n")]))
        [approval] = await _pending(api)
        edited = {"path": "edited.txt", "content": "edited\n"}
        assert (await _decide(api, approval["approval_id"], {"allow": True, "input": edited})).status_code == 200
        assert (await api.ended(api.alice, task))["state"] == "completed"
        workspace = Path(created["workspace"])
        assert (workspace / "edited.txt").read_text() == "edited\n" and not (workspace / "notes.txt").exists()
        events = await _events(api, session)
        check_session(events)
        [requested] = _of(events, EventType.TOOL_CALL_REQUESTED)
        [user] = [p for p in _of(events, EventType.TOOL_CALL_POLICY_EVALUATED) if p.source == "user"]
        assert user.input_hash == requested.input_hash and user.edited_input == edited
        assert user.edited_input_hash not in (None, requested.input_hash)
        for later in (EventType.TOOL_CALL_APPROVED, EventType.TOOL_CALL_STARTED, EventType.TOOL_CALL_COMPLETED):
            assert [p.input_hash for p in _of(events, later)] == [user.edited_input_hash]


async def test_batched_decisions_are_each_answered_on_their_own(api: Api) -> None:
    with trio.fail_after(60):
        session = (await api.create_session(api.alice, "user:alice"))["session_id"]
        task = await _start(api, session, _scenario([_write("w1", "a.txt"), _write("w2", "b.txt"),
                                                     _write("w3", "c.txt")]))
        first, second, third = [a["approval_id"] for a in await _pending(api, 3)]
        assert (await _decide(api, third, {"allow": False})).status_code == 200
        r = await api.client.post("/v1/approvals/decisions", headers=api.auth(api.alice), json={"decisions": [
            {"approval_id": first, "allow": True}, {"approval_id": "apr_nope", "allow": True},
            {"approval_id": third, "allow": True},
            {"approval_id": second, "allow": True, "scope": "rule", "pattern": {"kind": "host", "host": "x.org"}},
        ]})
        assert r.status_code == 200, r.text
        assert [(x["approval_id"], x["status"]) for x in r.json()["results"]] == [
            (first, 200), ("apr_nope", 404), (third, 409), (second, 422)]
        assert r.json()["results"][0]["approval"]["state"] == "approved"
        # the one refused for its body is still pending: decided now through the async client's batch
        async with AsyncClient(socket=api.socket, token=api.alice) as c:
            [result] = await c.decide_many([{"approval_id": second, "allow": True}])
            assert result.status == 200 and result.approval is not None
        async with AsyncClient(socket=api.socket, token=api.bob) as bob:
            hidden = await bob.decide_many([{"approval_id": first, "allow": True}])
            assert [x.status for x in hidden] == [404]
        malformed = await api.client.post("/v1/approvals/decisions", headers=api.auth(api.alice),
                                          json={"decisions": [{"approval_id": first, "allow": "yes"}]})
        assert malformed.status_code == 422 and "allow" in malformed.json()["error"]["message"]
        assert (await api.ended(api.alice, task))["state"] == "completed"
        check_session(await _events(api, session))


async def test_the_clients_grant_calls(api: Api) -> None:
    with trio.fail_after(60):
        session = (await api.create_session(api.alice, "user:alice"))["session_id"]
        task = await _start(api, session, _scenario([_write("w1", "src/a.txt")], [_write("w2", "src/b.txt")]))
        [approval] = await _pending(api)
        async with AsyncClient(socket=api.socket, token=api.alice) as c:
            decided = await c.decide(approval["approval_id"], allow=True, scope="rule",
                                     pattern={"kind": "path", "prefix": "src"})
            assert decided.state == "approved"
            assert (await api.ended(api.alice, task))["state"] == "completed"
            [grant] = await c.grants(session)
            assert grant.scope == "rule" and grant.pattern is not None and grant.state == "active"
            revoked = await c.revoke_grant(session, grant.grant_id)
            assert revoked.state == "revoked" and revoked.revoked_by is not None and revoked.revoked_by.startswith("api:")


async def test_the_blocking_client_decides_lists_and_revokes(api: Api) -> None:
    from codesdk import Client
    from codesdk.client import Conflict, NotFound

    with trio.fail_after(60):
        session = (await api.create_session(api.alice, "user:alice"))["session_id"]
        task = await _start(api, session, _scenario([_write("w1", "a.txt"), _write("w2", "b.txt")]))
        first, second = [a["approval_id"] for a in await _pending(api, 2)]

        def blocking() -> list[str]:
            with Client(socket=api.socket, token=api.alice) as client:
                decided = client.decide(first, allow=True, scope="session")
                [late] = client.decide_many([{"approval_id": second, "allow": True}])
                return [decided.state, str(late.status)]

        assert await trio.to_thread.run_sync(blocking) == ["approved", "200"]
        assert (await api.ended(api.alice, task))["state"] == "completed"

        def grants() -> list[str]:
            with Client(socket=api.socket, token=api.alice) as client:
                [grant] = client.grants(session)
                revoked = client.revoke_grant(session, grant.grant_id)
                try:
                    client.revoke_grant(session, grant.grant_id)
                except Conflict:
                    again = "409"
                with Client(socket=api.socket, token=api.bob) as bob:
                    try:
                        bob.grants(session)
                    except NotFound:
                        hidden = "404"
                return [revoked.state, again, hidden]

        assert await trio.to_thread.run_sync(grants) == ["revoked", "409", "404"]
