"""Serving the API under trio, on a unix socket (0600) and/or 127.0.0.1:PORT.

Hypercorn speaks HTTP (its trio ``TCPServer`` per connection); this module owns the sockets, the accept loop and
the connections, so that no number of clients can take the service's file descriptors away from it:

- every accepted connection holds a slot of a ``ConnectionGuard`` for its whole life. The slots are capped
  (``ApiLimits.max_connections``, and never more than RLIMIT_NOFILE minus a reserve kept for the store, worker
  spawns, blob writes and ``/healthz``). When all are taken, the connection idle longest (waiting for its request's
  headers, or between keep-alive requests) is closed to make room; if every connection is busy with a request, the
  new one gets a canned ``503`` JSON answer (``/healthz`` a canned ``200``) and is closed;
- a connection is charged to the principal whose token its first request carries; one principal holds at most
  ``max_connections_per_principal`` (its idle ones are closed first, else ``429``);
- request headers must be complete within ``header_timeout_s`` of the connection's start (or of the end of its
  previous response) — hypercorn's keep-alive timer; bodies within ``body_timeout_s`` (the app answers ``408``);
- a response must be taken: each ``SEND_CHUNK`` of it within ``send_timeout_s``, else the connection is cut. Hypercorn
  shields its writes from cancellation, so without this a client that stops reading (or a peer that vanished while
  its answer was on the way) would hold its connection, and keep the service from stopping, for as long as it liked;
- a peer that has gone (closed, reset, killed — also while its connection is paused or its response stalled) is
  noticed within about a second by polling every connection for ``POLLRDHUP``/``POLLHUP``, and its connection is
  ended: the app's handler is cancelled (an SSE stream's subscriber and feed go with it) and the descriptor closed.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
import resource
import select
import socket
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

import trio
from hypercorn.config import Config
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.statsd import StatsdLogger
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import AppWrapper, ConnectionState
from hypercorn.utils import repr_socket_addr, wrap_app
from starlette.types import ASGIApp, Receive, Scope, Send

from .limits import MAX_REFUSING, SEND_CHUNK, ApiLimits
from ..engine import Engine
from ._app import CHUNK_WRITER, KEEPALIVE_S, StreamDrain, create_app
from ._auth import TokenAuth
from ..webhooks import WebhookService

log = logging.getLogger(__name__)

#: Seconds between looks at every connection's peer (gone, or half-closed).
PEER_CHECK_S = 1.0
#: Seconds a connection whose peer half-closed it may still finish the request it is serving.
HALF_CLOSED_GRACE_S = 5.0
#: Seconds a refused connection gets to send its request line (to tell /healthz from the rest) and to read the answer.
REFUSE_READ_S = 1.0
REFUSE_DRAIN_S = 1.0
#: Listen backlog of each socket (connections the kernel holds while the accept loop is busy) at the least; it is the
#: connection cap when that is larger (the kernel clamps it to net.core.somaxconn). A burst of clients must wait in
#: this queue, not be turned away: past a full backlog a unix socket's nonblocking connect() fails with EAGAIN, which
#: trio (and so httpx) takes for "in progress", leaving the client an unconnected socket whose first read fails EINVAL.
BACKLOG = 128
#: TCP keep-alive of accepted loopback connections: a peer that vanished without a FIN/RST is noticed in ~1 min.
TCP_KEEPALIVE = ((socket.SO_KEEPALIVE, 1, socket.SOL_SOCKET), (socket.TCP_KEEPIDLE, 30, socket.IPPROTO_TCP),
                 (socket.TCP_KEEPINTVL, 10, socket.IPPROTO_TCP), (socket.TCP_KEEPCNT, 3, socket.IPPROTO_TCP))


class _Connection:
    """One accepted connection: its socket, the scope that ends it, and what it is doing."""

    __slots__ = ("active", "ended", "half_closed_at", "idle_since", "principal", "scope", "sending", "sock", "stream")

    def __init__(self, sock: trio.socket.SocketType, now: float) -> None:
        self.sock = sock
        self.scope = trio.CancelScope()
        self.principal: str | None = None
        self.active = 0  # requests the app is serving on it (HTTP/1.1: 0 or 1)
        self.idle_since = now
        self.half_closed_at: float | None = None
        self.sending: trio.CancelScope | None = None  # the write in progress (hypercorn shields it: see _BoundedStream)
        self.stream: _BoundedStream | None = None  # what hypercorn writes to (set once it serves the connection)
        self.ended = False

    def end(self) -> None:
        """Cancel everything serving it, the shielded write in progress included; later writes fail at once."""
        self.ended = True
        self.scope.cancel()
        if self.sending is not None:
            self.sending.cancel()


class _BoundedStream(trio.abc.HalfCloseableStream):
    """The connection's stream as hypercorn sees it: each ``SEND_CHUNK`` written must be taken by the client within
    ``timeout_s``, and a write ends at once when its connection is ended (evicted, peer gone, service stopping) —
    hypercorn runs its writes in a shielded scope, which nothing else could interrupt."""

    def __init__(self, stream: trio.SocketStream, conn: _Connection, timeout_s: float) -> None:
        self.stream = stream
        self.socket = stream.socket  # hypercorn reads the addresses from it
        self._conn = conn
        self._timeout_s = timeout_s

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        conn = self._conn
        fd = self.socket.fileno()
        if not conn.ended and fd >= 0:
            # What the socket takes now goes in one write(2), without a timed scope or a trip through the scheduler
            # (hypercorn's send lock already made this a checkpoint): an event stream's write, small and almost
            # always taken whole, costs a quarter of what it did. What is left waits its turn below, timed.
            try:
                written = os.write(fd, data)
            except OSError:  # full (EAGAIN), or broken: the path below waits, or says how it broke
                written = 0
            if written >= len(data):
                return
            if written:
                data = memoryview(data)[written:]
        with memoryview(data) as view:
            for start in range(0, max(len(view), 1), SEND_CHUNK):
                with trio.CancelScope(deadline=trio.current_time() + self._timeout_s) as sending:
                    if conn.ended:
                        sending.cancel()
                    conn.sending = sending
                    try:
                        await self.stream.send_all(view[start:start + SEND_CHUNK])
                    finally:
                        conn.sending = None
                if sending.cancelled_caught:
                    if not conn.ended:
                        log.info("API client %s did not read its response for %g s; connection closed",
                                 _peer(self.socket), self._timeout_s)
                        conn.end()
                    raise trio.BrokenResourceError("the connection was ended while a response was being written")

    async def wait_send_all_might_not_block(self) -> None:
        await self.stream.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        await self.stream.send_eof()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        return await self.stream.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self.stream.aclose()


def _chunk_writer(conn: _Connection, stream: _BoundedStream) -> Callable[[bytes], Awaitable[None]]:
    """The ``CHUNK_WRITER`` of a request on ``conn``: a piece of its response's body as one HTTP/1.1 chunk, written
    to the connection as hypercorn would have (h11 sends a GET's response without a content-length chunked to an
    HTTP/1.1 client; it keeps no count of a chunked body, and writes nothing else until the app ends the response),
    without the ASGI message, h11's event, hypercorn's send lock and shielded scope per piece."""
    async def write(data: bytes) -> None:
        if not data:
            return  # an empty chunk would end the body
        try:
            await stream.send_all(b"%x\r\n%b\r\n" % (len(data), data))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            # The client is gone (or was cut off): end what serves the connection, as the peer watch would (hypercorn
            # would have told the app "disconnected"); the writer, inside it, unwinds cancelled.
            conn.end()
            await trio.lowlevel.checkpoint()
            raise
    return write


def _peer(sock: trio.socket.SocketType) -> str:
    try:
        return repr_socket_addr(sock.family, sock.getpeername())
    except OSError:
        return "(gone)"


#: The connection the current task serves (set by the connection's handler; hypercorn's tasks for it inherit it).
_CURRENT: contextvars.ContextVar[_Connection | None] = contextvars.ContextVar("codesdk_api_connection", default=None)


class ConnectionGuard:
    """Slots for connections: the total and per-principal caps, eviction of idle ones, and the peer watch."""

    def __init__(self, cap: int, per_principal: int) -> None:
        self.cap = cap
        self.per_principal = per_principal
        self._open: dict[_Connection, None] = {}  # oldest first
        self._by_principal: dict[str, int] = {}
        self.refusing = 0
        self.evicted = 0
        self.refused = 0
        self.peers_gone = 0

    @property
    def open_count(self) -> int:
        return len(self._open)

    def admit(self, sock: trio.socket.SocketType) -> _Connection | None:
        """A slot for a new connection (evicting the connection idle longest if need be), or None: full."""
        if len(self._open) >= self.cap and not self._evict_idle(None):
            return None
        conn = _Connection(sock, trio.current_time())
        self._open[conn] = None
        return conn

    def release(self, conn: _Connection) -> None:
        if conn in self._open:
            del self._open[conn]
            self._uncharge(conn)

    def claim(self, principal: str) -> str | None:
        """Charge the current connection to ``principal`` (its token authenticated a request on it); a message
        saying why not if the principal holds too many connections already, none of them idle."""
        conn = _CURRENT.get()
        if conn is None or conn.principal == principal or conn not in self._open:
            return None
        self._uncharge(conn)
        if self._by_principal.get(principal, 0) >= self.per_principal and not self._evict_idle(principal):
            return (f"this token already holds {self.per_principal} open API connections, each busy with a "
                    f"request (the limit per token: `codesdk-supervisor serve --max-connections-per-principal`); "
                    f"close some, or reuse them")
        conn.principal = principal
        self._by_principal[principal] = self._by_principal.get(principal, 0) + 1
        return None

    def _uncharge(self, conn: _Connection) -> None:
        if conn.principal is not None:
            left = self._by_principal[conn.principal] - 1
            if left:
                self._by_principal[conn.principal] = left
            else:
                del self._by_principal[conn.principal]
            conn.principal = None

    def _evict_idle(self, principal: str | None) -> bool:
        """End the connection (of ``principal``, if given) idle longest; False if none is idle."""
        idle = [c for c in self._open if not c.active and (principal is None or c.principal == principal)]
        if not idle:
            return False
        self._end(min(idle, key=lambda c: c.idle_since))
        self.evicted += 1
        return True

    def _end(self, conn: _Connection) -> None:
        """Free the slot now; the handler unwinds (and closes the descriptor) at its next checkpoint."""
        self.release(conn)
        conn.end()

    def end_all(self) -> None:
        """End every connection (the service is stopping): also the writes hypercorn shields."""
        for conn in list(self._open):
            conn.end()

    # -- requests (the app wrapper) --

    def wrap(self, app: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
        """The ASGI app, counting each connection's requests in flight (a connection without one may be evicted)."""
        async def counted(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
            conn = _CURRENT.get()
            if conn is None or scope["type"] != "http":
                await app(scope, receive, send)
                return
            conn.active += 1
            if scope.get("http_version") == "1.1" and scope.get("method") == "GET" and conn.stream is not None:
                scope = {**scope, "extensions": {**(scope.get("extensions") or {}),
                                                 CHUNK_WRITER: _chunk_writer(conn, conn.stream)}}
            try:
                await app(scope, receive, send)
            finally:
                conn.active -= 1
                if not conn.active:
                    conn.idle_since = trio.current_time()
        return counted

    # -- peers that went away --

    async def watch_peers(self) -> None:
        while True:
            await trio.sleep(PEER_CHECK_S)
            self.check_peers(trio.current_time())

    def check_peers(self, now: float) -> None:
        """End each connection whose peer is gone: reset or fully closed at once; half-closed at once when idle,
        else after ``HALF_CLOSED_GRACE_S`` (it may still be waiting for the answer to its last request)."""
        poller = select.poll()
        by_fd: dict[int, _Connection] = {}
        for conn in self._open:
            fd = conn.sock.fileno()
            if fd >= 0:
                poller.register(fd, select.POLLRDHUP)
                by_fd[fd] = conn
        if not by_fd:
            return
        for fd, events in poller.poll(0):
            conn = by_fd[fd]
            if events & (select.POLLHUP | select.POLLERR | select.POLLNVAL) or not conn.active:
                gone = True
            else:
                if conn.half_closed_at is None:
                    conn.half_closed_at = now
                gone = now - conn.half_closed_at >= HALF_CLOSED_GRACE_S
            if gone:
                self.peers_gone += 1
                log.debug("API connection %s: its peer has gone; ended by the peer watch", conn.principal or "-")
                self._end(conn)


class _Server:
    """Hypercorn's per-connection HTTP server behind our connection slots."""

    def __init__(self, app: AppWrapper, config: Config, guard: ConnectionGuard, send_timeout_s: float) -> None:
        self.app = app
        self.config = config
        self.guard = guard
        self.send_timeout_s = send_timeout_s
        self.context = WorkerContext(None)
        self.state = ConnectionState({})

    async def handle(self, stream: trio.SocketStream) -> None:
        """Serve one accepted connection (``trio.serve_listeners`` closes the stream afterwards)."""
        conn = self.guard.admit(stream.socket)
        if conn is None:
            await self._refuse(stream)
            return
        if stream.socket.family == socket.AF_INET:
            with contextlib.suppress(OSError):
                for option, value, level in TCP_KEEPALIVE:
                    stream.socket.setsockopt(level, option, value)
        token = _CURRENT.set(conn)  # the tasks hypercorn starts for this connection inherit it
        try:
            with conn.scope:
                bounded = conn.stream = _BoundedStream(stream, conn, self.send_timeout_s)
                await TCPServer(self.app, self.config, self.context, self.state, bounded).run()  # type: ignore[arg-type]
        finally:
            _CURRENT.reset(token)
            self.guard.release(conn)

    async def _refuse(self, stream: trio.SocketStream) -> None:
        """Every slot is busy: a canned answer (``/healthz`` still gets its 200), then close. Bounded in number and
        time, so refusing costs at most ``MAX_REFUSING`` descriptors for about two seconds."""
        guard = self.guard
        guard.refused += 1
        if guard.refusing >= MAX_REFUSING:
            return  # closed unanswered: the reserve of descriptors is not for refusals
        guard.refusing += 1
        try:
            head = b""
            with trio.move_on_after(REFUSE_READ_S):
                while b"\r\n" not in head and len(head) < 1024:
                    chunk = await stream.receive_some(1024)
                    if not chunk:
                        break
                    head += chunk
            await stream.send_all(_HEALTHY if head.startswith((b"GET /healthz ", b"GET /healthz?")) else
                                  _busy_answer(guard.cap))
            await stream.send_eof()
            with trio.move_on_after(REFUSE_DRAIN_S):  # closing with unread input would reset the answer away
                while await stream.receive_some(4096):
                    pass
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        finally:
            guard.refusing -= 1


def _canned(status: str, body: dict[str, Any], *headers: str) -> bytes:
    data = json.dumps(body).encode()
    lines = [f"HTTP/1.1 {status}", "content-type: application/json", f"content-length: {len(data)}",
             "connection: close", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + data


_HEALTHY = _canned("200 OK", {"status": "ok"})


def _busy_answer(cap: int) -> bytes:
    return _canned("503 Service Unavailable", {"error": {
        "code": "server_busy",
        "message": f"the supervisor has {cap} API connections open, its limit, each busy with a request; retry "
                   f"shortly, or have the operator raise `codesdk-supervisor serve --max-connections` (and "
                   f"LimitNOFILE=)"}}, "retry-after: 1")


def _unix_listener(path: Path, backlog: int = BACKLOG) -> socket.socket:
    """Bind the unix socket ourselves so it is mode 0600 before anyone can connect (no umask games)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with contextlib.suppress(FileNotFoundError):
        if path.is_socket():
            path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))
        os.chmod(path, 0o600)
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    return sock


def _tcp_listener(port: int, backlog: int = BACKLOG) -> socket.socket:
    """127.0.0.1 only: the API is never reachable from another machine."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    return sock


#: What the metrics port answers: the metrics, and the probes (a scraper's health check).
METRICS_PATHS = frozenset({"/metrics", "/healthz", "/readyz"})


def _metrics_door(app: ASGIApp, metrics_port: int) -> ASGIApp:
    """``app`` where a connection to ``metrics_port`` reaches ``METRICS_PATHS`` alone (404 for anything else)."""

    async def door(scope: Scope, receive: Receive, send: Send) -> None:
        server = scope.get("server")
        if scope["type"] == "http" and server is not None and server[1] == metrics_port \
                and scope["path"] not in METRICS_PATHS:
            body = json.dumps({"error": {"code": "not_found", "message": "the metrics port serves /metrics, /healthz "
                                                                         "and /readyz alone"}}).encode()
            await send({"type": "http.response.start", "status": 404,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        await app(scope, receive, send)

    return door


async def serve_api(engine: Engine, auth: TokenAuth, unix_socket: Path | None = None, tcp_port: int | None = None,
                    *, keepalive_s: float = KEEPALIVE_S, limits: ApiLimits | None = None,
                    drain: StreamDrain | None = None, metrics_port: int | None = None,
                    webhooks: WebhookService | None = None,
                    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve until cancelled; ``task_status.started`` gets the bound addresses (``http://unix:…``,
    ``http://127.0.0.1:…``). ``metrics_port``: also listen on 127.0.0.1 there for /metrics and the probes alone
    (Prometheus' door: nothing else of the API answers on it)."""
    if unix_socket is None and tcp_port is None:
        raise ValueError("serve_api needs a unix socket path and/or a TCP port")
    limits = limits or ApiLimits()
    config = Config()
    config.accesslog = None
    config.errorlog = log
    config.keep_alive_timeout = limits.header_timeout_s  # also the time a connection may take to send its headers
    config.graceful_timeout = 2.0
    config.set_statsd_logger_class(StatsdLogger)
    guard = ConnectionGuard(limits.connection_cap(), limits.max_connections_per_principal)
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    log.info("API connections: at most %d (--max-connections %d, RLIMIT_NOFILE %s), %d per token, %d event streams "
             "per token", guard.cap, limits.max_connections, soft, limits.max_connections_per_principal,
             limits.max_streams_per_principal)
    app = create_app(engine, auth, keepalive_s=keepalive_s, max_streams_per_principal=limits.max_streams_per_principal,
                     body_timeout_s=limits.body_timeout_s, claim_connection=guard.claim, drain=drain,
                     bundle_limits=limits.bundles, webhooks=webhooks)
    served = _metrics_door(app, metrics_port) if metrics_port is not None else app
    wrapped = wrap_app(guard.wrap(served), config.wsgi_max_body_size, "asgi")
    sockets: list[socket.socket] = []
    backlog = max(BACKLOG, guard.cap)
    try:
        if unix_socket is not None:
            sockets.append(_unix_listener(Path(unix_socket), backlog))
        if tcp_port is not None:
            sockets.append(_tcp_listener(tcp_port, backlog))
        if metrics_port is not None:
            sockets.append(_tcp_listener(metrics_port, backlog))
        listeners = [trio.SocketListener(trio.socket.from_stdlib_socket(sock)) for sock in sockets]
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    try:
        await _serve(wrapped, config, guard, limits.send_timeout_s, listeners, task_status)
    finally:
        if unix_socket is not None:
            with contextlib.suppress(FileNotFoundError):
                Path(unix_socket).unlink()


async def _serve(app: AppWrapper, config: Config, guard: ConnectionGuard, send_timeout_s: float,
                 listeners: list[trio.SocketListener], task_status: trio.TaskStatus[list[str]]) -> None:
    """What hypercorn's ``worker_serve`` does (lifespan, accept loop, end), with our connection handler."""
    server = _Server(app, config, guard, send_timeout_s)
    lifespan = Lifespan(app, config, {})
    async with trio.open_nursery() as lifespan_nursery:
        await lifespan_nursery.start(lifespan.handle_lifespan)
        await lifespan.wait_for_startup()
        async with trio.open_nursery() as server_nursery:
            binds = []
            for listener in listeners:
                sock = listener.socket
                binds.append(f"http://{repr_socket_addr(sock.family, sock.getsockname())}")
                await config.log.info(f"Running on {binds[-1]} (CTRL + C to quit)")
            server_nursery.start_soon(guard.watch_peers)
            task_status.started(binds)
            try:
                # serve_listeners survives EMFILE/ENFILE on accept (it logs and retries after 100 ms)
                await trio.serve_listeners(server.handle, listeners, handler_nursery=server_nursery)
            finally:
                await server.context.terminated.set()
                server_nursery.cancel_scope.deadline = trio.current_time() + config.graceful_timeout
                # The accept loop only ends cancelled (the service stops) or failing: either way every handler is being
                # cancelled; the writes hypercorn shields from that end here, else a client that stopped reading would
                # keep the service from ever stopping.
                guard.end_all()
        await lifespan.wait_for_shutdown()
        lifespan_nursery.cancel_scope.cancel()

