"""The HTTP API through a real HTTP client over the unix socket."""

from __future__ import annotations

import stat

import pytest
import trio

from tests.api.conftest import Api, read_sse

# Leaving an SSE stream mid-way (the point of the reconnect test) abandons httpx2's nested byte-stream async
# generators; trio's finalizer then warns that they were garbage collected unexhausted. Harmless here.
pytestmark = [
    pytest.mark.filterwarnings("ignore:Async generator .* was garbage collected:ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]


async def test_socket_and_admin_token_are_private(api: Api) -> None:
    with trio.fail_after(10):
        assert (await api.client.get("/healthz")).status_code == 200
        assert stat.S_IMODE(api.socket.stat().st_mode) == 0o600
        data_dir = api.engine.config.data_dir
        assert stat.S_IMODE((data_dir / "admin.token").stat().st_mode) == 0o600
        tokens = (data_dir / "api-tokens.json").read_text()
        assert api.admin not in tokens and api.alice not in tokens  # hashes only


async def test_healthz_readyz_metrics(api: Api) -> None:
    with trio.fail_after(10):
        assert (await api.client.get("/healthz")).status_code == 200
        assert (await api.client.get("/readyz")).status_code == 200
        assert (await api.client.get("/metrics")).status_code == 401
        assert (await api.client.get("/metrics", headers=api.auth(api.alice))).status_code == 403
        r = await api.client.get("/metrics", headers=api.auth(api.admin))
        assert r.status_code == 200
        assert "codesdk_active_tasks" in r.text and "codesdk_workers" in r.text


@pytest.mark.parametrize("header", [None, "Bearer not-a-token", "Basic YWRtaW46eA==", "Bearer"])
async def test_missing_or_bad_token_is_401(api: Api, header: str | None) -> None:
    with trio.fail_after(10):
        headers = {} if header is None else {"Authorization": header}
        r = await api.client.get("/v1/sessions", headers=headers)
        assert r.status_code == 401
        assert r.json()["error"]["code"] == "unauthorized"
        r = await api.client.post("/v1/sessions", json={"namespace": "user:alice"}, headers=headers)
        assert r.status_code == 401


async def test_full_task_with_sse(api: Api) -> None:
    with trio.fail_after(20):
        session = await api.create_session(api.alice, "user:alice")
        sid = session["session_id"]
        assert session["namespace"] == "user:alice"
        r = await api.client.get(f"/v1/sessions/{sid}", headers=api.auth(api.alice))
        assert r.status_code == 200 and r.json()["session_id"] == sid
        task = await api.run_task(api.alice, sid, "echo")
        async with api.client.stream("GET", f"/v1/sessions/{sid}/events/stream?until_terminal=true",
                                     headers=api.auth(api.alice)) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            frames = await read_sse(response)
        seqs = [int(f["id"]) for f in frames]
        assert seqs == list(range(1, len(frames) + 1))
        assert frames[0]["event"] == "session.created"
        assert frames[-1]["event"] == "task.completed"
        assert all(f["event"] == f["data"]["type"] and int(f["id"]) == f["data"]["seq"] for f in frames)
        assert any(f["event"] == "model.output.delta" for f in frames)
        r = await api.client.get(f"/v1/tasks/{task['task_id']}", headers=api.auth(api.alice))
        assert r.status_code == 200 and r.json()["state"] == "completed"
        # paged events agree with the stream
        got: list[int] = []
        after = 0
        while True:
            r = await api.client.get(f"/v1/sessions/{sid}/events", params={"after_seq": after, "limit": 3},
                                     headers=api.auth(api.alice))
            assert r.status_code == 200
            page = r.json()
            got += [e["seq"] for e in page["events"]]
            after = page["next_after_seq"]
            if not page["has_more"]:
                break
        assert got == seqs
        r = await api.client.get(f"/v1/sessions/{sid}/transcript", headers=api.auth(api.alice))
        assert r.status_code == 200
        roles = [m["role"] for m in r.json()["messages"]]
        assert roles[0] == "user" and "assistant" in roles
        r = await api.client.get("/v1/sessions", headers=api.auth(api.alice))
        assert [s["session_id"] for s in r.json()["sessions"]] == [sid]


async def test_sse_reconnect_with_last_event_id_sees_exactly_the_rest(api: Api) -> None:
    with trio.fail_after(25):
        sid = (await api.create_session(api.bob, "user:bob"))["session_id"]
        task_id = (await api.run_task(api.bob, sid, "slow-stream"))["task_id"]
        url = f"/v1/sessions/{sid}/events/stream"
        async with api.client.stream("GET", url, headers=api.auth(api.bob)) as response:
            first = await read_sse(response, stop_after=5)
        last = first[-1]["id"]
        # stop the task while we're away so the stream has an end
        r = await api.client.post(f"/v1/tasks/{task_id}/stop", json={"reason": "enough"},
                                  headers=api.auth(api.bob))
        assert r.status_code == 200 and r.json()["state"] == "stopped"
        async with api.client.stream("GET", url + "?until_terminal=true",
                                     headers={**api.auth(api.bob), "Last-Event-ID": last}) as response:
            rest = await read_sse(response)
        seqs = [int(f["id"]) for f in first + rest]
        assert seqs == list(range(1, len(seqs) + 1)), "gap or duplicate across the reconnect"
        assert rest[-1]["event"] == "task.stopped"
        # ?after_seq= does the same as Last-Event-ID
        async with api.client.stream("GET", url + f"?until_terminal=true&after_seq={last}",
                                     headers=api.auth(api.bob)) as response:
            again = await read_sse(response)
        assert [f["id"] for f in again] == [f["id"] for f in rest]
        # stopping again: 409
        r = await api.client.post(f"/v1/tasks/{task_id}/stop", headers=api.auth(api.bob))
        assert r.status_code == 409 and r.json()["error"]["code"] == "task_not_active"


async def test_busy_session_is_409(api: Api) -> None:
    with trio.fail_after(20):
        sid = (await api.create_session(api.admin, "default"))["session_id"]
        task = await api.run_task(api.admin, sid, "hang")
        r = await api.client.post(f"/v1/sessions/{sid}/tasks", json={"prompt": "again"},
                                  headers=api.auth(api.admin))
        assert r.status_code == 409 and r.json()["error"]["code"] == "session_busy"
        r = await api.client.post(f"/v1/tasks/{task['task_id']}/stop", headers=api.auth(api.admin))
        assert r.status_code == 200


async def test_unknown_ids_are_404(api: Api) -> None:
    with trio.fail_after(10):
        for method, path in [("GET", "/v1/sessions/ses_nope"), ("GET", "/v1/tasks/task_nope"),
                             ("POST", "/v1/tasks/task_nope/stop"), ("GET", "/v1/sessions/ses_nope/events"),
                             ("GET", "/v1/sessions/ses_nope/events/stream"),
                             ("GET", "/v1/sessions/ses_nope/transcript"), ("POST", "/v1/sessions/ses_nope/tasks")]:
            r = await api.client.request(method, path, headers=api.auth(api.admin), json={"prompt": "x"})
            assert r.status_code == 404, (method, path, r.text)
            assert r.json()["error"]["code"] in {"session_not_found", "task_not_found"}
