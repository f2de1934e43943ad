"""The SSE send path alone: the service's CPU per event from the store's fan-out to the subscriber's socket.

The real pieces from ``Hub.publish`` on: each subscriber's ``Subscription`` (a store whose past is empty), the
API's ``_SSEResponse`` under Starlette, hypercorn's HTTP/1.1 server behind the service's own connection handling
(``_serve``: the ``ConnectionGuard``, the bounded writes), on a unix socket; N streams read by a child process.
Each round publishes one event to every stream, then waits until every stream has written it (nothing else is
left to run), so that every write carries one event, as in a paced stream. Reported: CPU of this process (the
event loop's thread; the reader is another process) per event, over ROUNDS rounds.

    python scripts/benchmarks/sse_send.py [N] [ROUNDS]     (PYTHONPATH=<another checkout> measures that code)
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import trio
import trio.testing
from hypercorn.config import Config
from hypercorn.utils import wrap_app
from prometheus_client import CollectorRegistry, Counter
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from codesdk.supervisor.api import _app, _serve
from codesdk.supervisor.store._stored import StoredEvent
from codesdk.supervisor.store._subscribe import Hub, Subscription

READER = r"""
import selectors, socket, sys
path, n, expected = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
sel = selectors.DefaultSelector()
for k in range(n):
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    s.sendall(b"GET /s/s%d HTTP/1.1\r\nhost: x\r\n\r\n" % k)
    s.setblocking(False)
    sel.register(s, selectors.EVENT_READ)
seen = 0
while seen < expected:
    for key, _ in sel.select():
        data = key.fileobj.recv(1 << 16)
        if not data:
            sys.exit("a stream ended early")
        seen += data.count(b"\nid: ") + data.startswith(b"id: ")
print("done", flush=True)
"""

BODY = (b'{"schema_version":1,"seq":%d,"session_id":"ses_0123456789abcdef","task_id":"task_0123456789abcdef",'
        b'"type":"item.delta","time":"2026-11-28T20:00:00.000000Z","payload":{"item_id":"item_1","block_id":"paced",'
        b'"delta":"1764360000000000000"},"namespace":"user:s1","runtime":"bench"}')


class _Store:
    def __init__(self) -> None:
        self.hub = Hub()

    @contextlib.asynccontextmanager
    async def subscribe(self, session_id: str, after_seq: int = 0, *,
                        until_terminal: bool = False) -> AsyncIterator[Subscription]:
        feed = self.hub.add(session_id, 1024)

        async def read_page(after: int, limit: int) -> list[StoredEvent]:
            return []

        try:
            yield Subscription(read_page, feed, after_seq, until_terminal=until_terminal, page_size=256,
                               poll_interval_s=3600.0)
        finally:
            self.hub.remove(session_id, feed)


class _Engine:
    def __init__(self) -> None:
        self.store = _Store()


async def run(n: int, rounds: int) -> dict[str, float]:
    engine = _Engine()
    sent = Counter("sse_sent", "", registry=CollectorRegistry())
    slots, drain = _app._StreamSlots(n + 1), _app.StreamDrain()

    async def stream(request: Request) -> Response:
        return _app._SSEResponse(engine, request.path_params["sid"], 0, False, sent, 3600.0,  # type: ignore[arg-type]
                                 streams=slots, principal="p", drain=drain)

    app = Starlette(routes=[Route("/s/{sid}", stream)])
    config = Config()
    config.accesslog = None
    guard = _serve.ConnectionGuard(n + 16, n + 16)
    wrapped = wrap_app(guard.wrap(app), config.wsgi_max_body_size, "asgi")  # type: ignore[arg-type]
    with tempfile.TemporaryDirectory(prefix="codesdk-sse-send-") as tmp:
        path = Path(tmp) / "api.sock"
        listener = trio.SocketListener(trio.socket.from_stdlib_socket(_serve._unix_listener(path)))
        async with trio.open_nursery() as nursery:
            await nursery.start(_serve._serve, wrapped, config, guard, 30.0, [listener])
            reader = await trio.lowlevel.open_process(
                [sys.executable, "-c", READER, str(path), str(n), str(n * rounds)], stdout=subprocess.PIPE)
            sessions = [f"s{k}" for k in range(n)]
            with trio.fail_after(60):
                while any(engine.store.hub.count(s) == 0 for s in sessions):
                    await trio.sleep(0.01)
                await trio.testing.wait_all_tasks_blocked()
            cpu0, wall0 = time.thread_time(), time.perf_counter()
            for r in range(1, rounds + 1):
                for s in sessions:
                    engine.store.hub.publish(s, [StoredEvent(r, "item.delta", BODY % r)])
                await trio.testing.wait_all_tasks_blocked()  # every stream has written its event
            cpu, wall = time.thread_time() - cpu0, time.perf_counter() - wall0
            assert reader.stdout is not None
            with trio.fail_after(60):
                out = await reader.stdout.receive_some()
            assert out.startswith(b"done"), out
            await reader.wait()
            nursery.cancel_scope.cancel()
    return {"n": n, "rounds": rounds, "cpu_per_event_us": cpu / (n * rounds) * 1e6, "wall_s": wall,
            "load": os.getloadavg()[0]}


def main(argv: list[str]) -> None:
    n = int(argv[0]) if argv else 100
    rounds = int(argv[1]) if len(argv) > 1 else 300
    r: dict[str, Any] = trio.run(run, n, rounds)
    print(f"{r['n']} streams x {r['rounds']} events: {r['cpu_per_event_us']:.1f} us of CPU per event "
          f"(event loop thread), load {r['load']:.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])
