"""A small HTTP/1.1 server for the http.fetch tests, to run inside a test's own network namespace
(``serve_in`` a ``tests.netns.FreshNetns``). Plain trio, no name look-ups and no worker threads, as that
namespace's loop requires. Routes:

``/text`` ``/json`` ``/bin`` ``/big`` (100 000 bytes of text) ``/slow`` (never answers) ``/garbage`` (not HTTP)
``/close`` (hangs up) ``/loop`` (redirects to itself) ``/redirect?to=URL`` (302 to URL) ``/echo`` (the request back, as JSON). Every request is recorded in
``hits``, so a test can show a refused fetch never reached a server.
"""

from __future__ import annotations

import json
import ssl
from dataclasses import dataclass, field
from functools import partial
from urllib.parse import parse_qs, urlsplit

import trio

from codesdk.supervisor.tools import Connector

from tests.netns import FreshNetns

BIG = 100_000


@dataclass
class Served:
    host: str
    port: int
    hits: list[str] = field(default_factory=list)
    #: How the test's own loop reaches it (``FetchPolicy.connect``): set by ``serve_in``.
    connect: Connector | None = None


async def _read_request(stream: trio.abc.Stream) -> tuple[str, str, dict[str, str], bytes] | None:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = await stream.receive_some(65536)
        if not chunk:
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, target, _ = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        body += await stream.receive_some(65536)
    return method, target, headers, body


def _response(status: int, content_type: str, body: bytes, extra: dict[str, str] | None = None) -> bytes:
    headers = {"Content-Type": content_type, "Content-Length": str(len(body)), "Connection": "close",
               "Set-Cookie": "session=secret", **(extra or {})}
    head = f"HTTP/1.1 {status} X\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    return head.encode("latin-1") + body


async def _handle(served: Served, tls: ssl.SSLContext | None, stream: trio.abc.Stream) -> None:
    if tls is not None:
        stream = trio.SSLStream(stream, tls, server_side=True)
    try:
        request = await _read_request(stream)
        if request is None:
            return
        method, target, headers, body = request
        served.hits.append(target)
        parts = urlsplit(target)
        path = parts.path
        if path == "/text":
            answer = _response(200, "text/plain; charset=utf-8", b"hello from the namespace")
        elif path == "/json":
            answer = _response(200, "application/json", b'{"ok": true}')
        elif path == "/bin":
            answer = _response(200, "application/octet-stream", bytes(range(256)))
        elif path == "/big":
            answer = _response(200, "text/plain", b"x" * BIG)
        elif path == "/slow":
            await trio.sleep_forever()
        elif path == "/garbage":
            answer = b"NOT HTTP AT ALL\r\n\r\n"
        elif path == "/close":
            return
        elif path == "/loop":
            answer = _response(302, "text/plain", b"", {"Location": "/loop"})
        elif path == "/redirect":
            status = int(parse_qs(parts.query).get("status", ["302"])[0])
            answer = _response(status, "text/plain", b"", {"Location": parse_qs(parts.query)["to"][0]})
        elif path == "/charset":  # a charset that is no text encoding: decoding by it raises
            answer = _response(200, "text/plain; charset=idna", b"caf\xc3\xa9 \xff")
        elif path == "/echo":
            echoed = {"method": method, "headers": headers, "body": body.decode("utf-8", "replace")}
            answer = _response(200, "application/json", json.dumps(echoed).encode())
        else:
            answer = _response(404, "text/plain", b"no such page")
        await stream.send_all(answer)
    except (trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError):
        pass
    finally:
        await trio.aclose_forcefully(stream)


async def serve(nursery: trio.Nursery, host: str, tls: ssl.SSLContext | None = None, port: int = 0) -> Served:
    """Start the server on ``host`` (``port``, or a free one) in ``nursery``; what it has served so far."""
    listeners = await trio.open_tcp_listeners(port, host=host)
    served = Served(host, listeners[0].socket.getsockname()[1])
    nursery.start_soon(trio.serve_listeners, partial(_handle, served, tls), listeners)
    return served


async def serve_in(netns: FreshNetns, host: str, tls: ssl.SSLContext | None = None, port: int = 0) -> Served:
    """``serve`` in ``netns``'s own loop, until it closes; ``connect`` of what it returns reaches it from outside."""
    served = await netns.run(partial(serve, netns.nursery, host, tls, port))
    served.connect = netns.connect
    return served
