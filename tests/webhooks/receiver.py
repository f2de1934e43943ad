"""A webhook receiver on 127.0.0.1 for the tests: a small HTTP/1.1 server (trio + h11) that records each request
and answers as its ``answer`` says: a status, or None to accept the request and never answer it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import h11
import trio


@dataclass(frozen=True)
class Received:
    headers: dict[str, str]
    body: bytes


#: The status for the n-th request (1-based), or None: keep the connection and never answer.
Answer = Callable[[int], int | None]


@dataclass
class Receiver:
    answer: Answer = lambda n: 204
    #: The body of every answer.
    body: bytes = b"ok"
    #: Send the status and headers, then hold the body back forever (a receiver that trickles it).
    stall_body: bool = False
    received: list[Received] = field(default_factory=list)
    #: Requests held unanswered right now.
    holding: int = 0
    port: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    @property
    def allow(self) -> str:
        """The ``--webhook-allow`` pattern for it."""
        return f"127.0.0.1:{self.port}"

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self._connection, listeners)

    async def _connection(self, stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER)
        headers: dict[str, str] = {}
        body = bytearray()
        try:
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    data = await stream.receive_some(65536)
                    if not data:
                        return
                    conn.receive_data(data)
                elif isinstance(event, h11.Request):
                    headers = {k.decode().lower(): v.decode() for k, v in event.headers}
                elif isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, h11.EndOfMessage):
                    break
                else:
                    return
            with self._lock:
                self.received.append(Received(headers, bytes(body)))
                number = len(self.received)
            status = self.answer(number)
            if status is None:
                self.holding += 1
                try:
                    await trio.sleep_forever()
                finally:
                    self.holding -= 1
            length = str(len(self.body))
            await stream.send_all(conn.send(h11.Response(status_code=status, headers=[("content-length", length)])))
            if self.stall_body:
                self.holding += 1
                try:
                    await trio.sleep_forever()
                finally:
                    self.holding -= 1
            await stream.send_all(conn.send(h11.Data(data=self.body)) + conn.send(h11.EndOfMessage()))
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError):
            return
        finally:
            await trio.aclose_forcefully(stream)
