"""Idempotent retries: a POST with an ``Idempotency-Key`` runs once however often it is sent, through the API, both
clients and the CLI; a connection that breaks before the answer came is retried by the clients with the same key."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from codesdk import AsyncClient, Client

from tests.api.conftest import Api


async def _tasks(api: Api, session_id: str) -> list[str]:
    events = (await api.client.get(f"/v1/sessions/{session_id}/events?limit=1000",
                                   headers=api.auth(api.admin))).json()["events"]
    return sorted({e["trace"]["task_id"] for e in events if e["type"] == "task.started"})


async def test_the_same_post_with_the_same_key_runs_once(api: Api) -> None:
    with trio.fail_after(60):
        sid = (await api.create_session(api.alice, "user:alice"))["session_id"]
        url, key = f"/v1/sessions/{sid}/tasks", str(uuid.uuid4())
        body = {"prompt": "hello", "runtime_config": {"scenario": "echo"}}
        first = await api.client.post(url, headers={**api.auth(api.alice), "Idempotency-Key": key}, json=body)
        assert first.status_code == 202, first.text
        assert "idempotent-replayed" not in first.headers
        # the same body, its keys in another order: the same request
        again = await api.client.post(url, headers={**api.auth(api.alice), "Idempotency-Key": key},
                                      json=dict(reversed(body.items())))
        assert again.status_code == 202 and again.json() == first.json()
        assert again.headers["idempotent-replayed"] == "true"
        other = await api.client.post(url, headers={**api.auth(api.alice), "Idempotency-Key": key},
                                      json={"prompt": "something else"})
        assert other.status_code == 409 and other.json()["error"]["code"] == "idempotency_key_reused"
        elsewhere = await api.client.post("/v1/sessions", headers={**api.auth(api.alice), "Idempotency-Key": key},
                                          json={"namespace": "user:alice"})
        assert elsewhere.status_code == 409  # a key names one request, whatever its route
        bob_sid = (await api.create_session(api.bob, "user:bob"))["session_id"]
        bobs = await api.client.post(f"/v1/sessions/{bob_sid}/tasks",
                                     headers={**api.auth(api.bob), "Idempotency-Key": key}, json=body)
        assert bobs.status_code == 202  # keys are each token's own
        # a name is unique per namespace only: another tenant's token of the same name shares nothing of alice's
        namesake = api.tokens.add_principal("alice", ["user:bob"])
        replayed = await api.client.post(url, headers={**api.auth(namesake), "Idempotency-Key": key}, json=body)
        assert replayed.status_code == 404, replayed.text  # her session is not its to see, key or no key
        while (await api.client.get(f"/v1/tasks/{first.json()['task_id']}",
                                    headers=api.auth(api.alice))).json()["state"] in ("pending", "running"):
            await trio.sleep(0.05)
        assert await _tasks(api, sid) == [first.json()["task_id"]]


async def test_a_request_that_failed_leaves_its_key_free_and_a_bad_key_is_refused(api: Api) -> None:
    with trio.fail_after(60):
        sid = (await api.create_session(api.alice, "user:alice"))["session_id"]
        url, key = f"/v1/sessions/{sid}/tasks", str(uuid.uuid4())
        auth = {**api.auth(api.alice), "Idempotency-Key": key}
        refused = await api.client.post(url, headers=auth, json={"prompt": ""})
        assert refused.status_code == 422  # changed nothing: the key is not spent on it
        huge = await api.client.post(url, headers=auth, json={"prompt": "x", "max_input_tokens": 2**53 + 1})
        assert huge.status_code == 422, huge.text  # a body RFC 8785 cannot canonicalize is still fingerprinted
        fixed = await api.client.post(url, headers=auth, json={"prompt": "hello"})
        assert fixed.status_code == 202, fixed.text
        for bad in ("", "a b", "x" * 256, "é"):
            headers = [(b"authorization", f"Bearer {api.alice}".encode()), (b"idempotency-key", bad.encode())]
            r = await api.client.post(url, headers=headers, json={"prompt": "hi"})
            assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_idempotency_key", (bad, r.text)
        unauthorized = await api.client.post(url, headers={"Idempotency-Key": key}, json={"prompt": "hello"})
        assert unauthorized.status_code == 401  # who asks comes first: nothing is told of the key


@asynccontextmanager
async def dropping_proxy(upstream: Path, at: Path, marker: bytes) -> AsyncIterator[list[int]]:
    """A unix-socket proxy to ``upstream`` that, the first time a request containing ``marker`` passes, lets it
    reach the service and then breaks the connection instead of returning the answer: the request ran, its client
    never heard. Yields the count of connections broken so."""
    broken: list[int] = []
    listener = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    await listener.bind(str(at))
    listener.listen(16)

    async def serve(client: trio.SocketStream) -> None:
        server = await trio.open_unix_socket(str(upstream))
        sent_marked = trio.Event()
        async with client, server, trio.open_nursery() as nursery:
            async def up() -> None:
                async for data in client:
                    if marker in data and not broken:
                        broken.append(1)
                        sent_marked.set()
                    await server.send_all(data)
                nursery.cancel_scope.cancel()

            async def down() -> None:
                async for data in server:
                    if sent_marked.is_set():
                        nursery.cancel_scope.cancel()  # the answer is dropped: both ends are closed
                        return
                    await client.send_all(data)
                nursery.cancel_scope.cancel()

            nursery.start_soon(up)
            nursery.start_soon(down)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, serve, [trio.SocketListener(listener)])
        yield broken
        nursery.cancel_scope.cancel()


async def test_both_clients_retry_a_broken_post_and_it_runs_once(api: Api, tmp_path: Path) -> None:
    with trio.fail_after(90):
        sid = (await api.create_session(api.alice, "user:alice"))["session_id"]
        async with dropping_proxy(api.socket, tmp_path / "async.sock", b"/tasks") as broken:
            async with AsyncClient(socket=tmp_path / "async.sock", token=api.alice) as client:
                task = await client.start_task(sid, "hello", runtime_config={"scenario": "echo"})
            assert broken == [1]
        assert await _tasks(api, task.session_id) == [task.task_id]
        while (await api.client.get(f"/v1/tasks/{task.task_id}",
                                    headers=api.auth(api.alice))).json()["state"] in ("pending", "running"):
            await trio.sleep(0.05)

        def blocking() -> str:
            with Client(socket=tmp_path / "sync.sock", token=api.alice) as sync_client:
                return sync_client.start_task(sid, "again", runtime_config={"scenario": "echo"}).task_id

        async with dropping_proxy(api.socket, tmp_path / "sync.sock", b"/tasks") as broken:
            second = await trio.to_thread.run_sync(blocking)
            assert broken == [1]
        assert await _tasks(api, sid) == sorted([task.task_id, second])


async def test_the_cli_run_through_a_broken_connection_starts_one_task(api: Api, tmp_path: Path) -> None:
    with trio.fail_after(120):
        async with dropping_proxy(api.socket, tmp_path / "cli.sock", b"/tasks") as broken:
            done = await trio.run_process(
                [sys.executable, "-m", "codesdk.supervisor.cli.front", "--url", f"unix:{tmp_path / 'cli.sock'}",
                 "--token", api.alice, "run", "hello", "--namespace", "user:alice", "--scenario", "echo", "--json",
                 "--non-interactive"], capture_stdout=True, capture_stderr=True, check=False,
                env={**os.environ, "CODESDK_DATA_DIR": str(tmp_path / "unused")})
            assert broken == [1]
        assert done.returncode == 0, done.stderr.decode()
        lines = done.stdout.decode().splitlines()
        assert '"type":"task.completed"' in lines[-1]
        sessions = (await api.client.get("/v1/sessions", headers=api.auth(api.alice))).json()["sessions"]
        [session] = sessions
        assert len(await _tasks(api, session["session_id"])) == 1
