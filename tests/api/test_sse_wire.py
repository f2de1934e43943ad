"""An event stream's bytes on the wire: the SSE frames as stored, in an HTTP/1.1 chunked body (written straight to
the connection, ``CHUNK_WRITER``) or an HTTP/1.0 body delimited by the connection's close (the ASGI path)."""

from __future__ import annotations

import h11
import pytest
import trio

from codesdk.supervisor.store import EventStore

from tests.api.conftest import Api, read_sse

pytestmark = [
    pytest.mark.filterwarnings("ignore:Async generator .* was garbage collected:ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]


async def _finished_session(api: Api) -> tuple[str, bytes]:
    """A session whose task has ended, and the body its whole event stream must be."""
    sid = (await api.create_session(api.alice, "user:alice"))["session_id"]
    task_id = (await api.run_task(api.alice, sid))["task_id"]
    while (await api.client.get(f"/v1/tasks/{task_id}", headers=api.auth(api.alice))).json()["state"] not in (
            "completed", "failed", "stopped"):
        await trio.sleep(0.02)
    stored = await api.engine.store.read_stored(sid, 0, 1000)
    assert stored and stored[-1].is_terminal
    return sid, b": stream\n\n" + b"".join(event.frame for event in stored)


async def test_an_http11_event_stream_is_chunked_frames_as_stored(api: Api) -> None:
    with trio.fail_after(20):
        sid, expected = await _finished_session(api)
        client = h11.Connection(h11.CLIENT)
        stream = await trio.open_unix_socket(str(api.socket))
        async with stream:
            await stream.send_all(client.send(h11.Request(
                method="GET", target=f"/v1/sessions/{sid}/events/stream?after_seq=0&until_terminal=true",
                headers=[("host", "codesdk"), ("authorization", f"Bearer {api.alice}")])))
            await stream.send_all(client.send(h11.EndOfMessage()))
            head, body, chunks = None, b"", 0
            while True:
                event = client.next_event()
                if event is h11.NEED_DATA:
                    data = await stream.receive_some(65536)
                    assert data, "the connection closed before the stream's end"
                    client.receive_data(data)
                elif isinstance(event, h11.Response):
                    head = event
                elif isinstance(event, h11.Data):
                    body += event.data
                    chunks += 1
                elif isinstance(event, h11.EndOfMessage):
                    break
        assert head is not None and head.status_code == 200
        headers = dict(head.headers)
        assert headers[b"transfer-encoding"] == b"chunked" and b"content-length" not in headers
        assert headers[b"content-type"].startswith(b"text/event-stream")
        assert body == expected
        assert chunks >= 2  # the opening comment, then the events (one chunk per write)
        assert client.our_state is h11.DONE and client.their_state is h11.DONE  # the connection may be reused


async def test_an_http10_event_stream_is_the_frames_until_the_close(api: Api) -> None:
    with trio.fail_after(20):
        sid, expected = await _finished_session(api)
        stream = await trio.open_unix_socket(str(api.socket))
        async with stream:
            await stream.send_all(f"GET /v1/sessions/{sid}/events/stream?after_seq=0&until_terminal=true HTTP/1.0\r\n"
                                  f"authorization: Bearer {api.alice}\r\n\r\n".encode())
            received = b""
            while data := await stream.receive_some(65536):
                received += data
        head, _, body = received.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 ") or head.startswith(b"HTTP/1.0 200 "), head
        assert b"transfer-encoding" not in head.lower()
        assert body == expected


async def test_a_stalled_event_stream_holds_neither_the_writer_nor_unbounded_memory(api: Api) -> None:
    """One client of a session's stream stops reading; a flood's events still reach another client of the same
    session whole and in order (appends and the other stream never wait for it), and the stalled stream's pending
    events stay within its feed's bound (past it the feed is emptied: the stream re-reads from the store later)."""
    deltas = 5_000  # ~2.7 MB of frames: far more than the socket buffers and the feed hold
    with trio.fail_after(60):
        store = api.engine.store
        assert isinstance(store, EventStore)  # the SQLite store: its subscribers' feeds are looked at below
        sid = (await api.create_session(api.alice, "user:alice"))["session_id"]
        stalled = await trio.open_unix_socket(str(api.socket))
        async with stalled:
            await stalled.send_all(f"GET /v1/sessions/{sid}/events/stream?after_seq=0 HTTP/1.1\r\nhost: codesdk\r\n"
                                   f"authorization: Bearer {api.alice}\r\n\r\n".encode())
            while store.subscriber_count(sid) < 1:
                await trio.sleep(0.01)
            steps = [{"flood": deltas, "delta": "x" * 400}, {"complete": {}}]
            r = await api.client.post(f"/v1/sessions/{sid}/tasks", headers=api.auth(api.alice), json={
                "prompt": "flood", "runtime_config": {"scenario_inline": {"name": "flood", "steps": steps}}})
            assert r.status_code == 202, r.text
            async with api.client.stream("GET", f"/v1/sessions/{sid}/events/stream?until_terminal=true",
                                         headers=api.auth(api.alice)) as response:
                frames = await read_sse(response)
            assert [int(f["id"]) for f in frames] == list(range(1, len(frames) + 1))
            assert frames[-1]["event"] == "task.completed"
            assert len(frames) > deltas
            feeds = list(store._hub._feeds.get(sid, ()))  # the stalled stream's, still open
            assert len(feeds) == 1
            assert feeds[0].overflowed and len(feeds[0].buffer) <= feeds[0].capacity
