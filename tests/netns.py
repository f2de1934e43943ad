"""Guards for tests that start real agent runtimes: they run only with no way off this machine. And
``FreshNetns``: a network namespace of a test's own for its servers."""

from __future__ import annotations

import socket
import threading
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import outcome
import pytest
import trio

from codesdk.testing import loopback_only

if TYPE_CHECKING:
    from codesdk.supervisor.egress import IPAddress

T = TypeVar("T")

skip_outside_netns = pytest.mark.skipif(
    not loopback_only(),
    reason="real runtimes run only inside a loopback-only network namespace: use ./scripts/test "
           "(it wraps pytest in scripts/netns-run), or scripts/netns-run .venv/bin/pytest …",
)


_CLONE_NEWNET = 0x40000000
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
NO_NETNS_THREAD = ("a thread cannot get a network namespace of its own here (unshare(CLONE_NEWNET) needs root or "
                   "CAP_SYS_ADMIN; CI runs as root)")


def _enter_fresh_netns() -> None:
    """Move the calling thread (only it: namespaces are per thread) into a new network namespace, loopback up."""
    import ctypes
    import fcntl
    import os
    import socket
    import struct

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(_CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise PermissionError(errno, os.strerror(errno))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH", b"lo", 0)
        flags = struct.unpack("16sH", fcntl.ioctl(sock, _SIOCGIFFLAGS, request)[:18])[1]
        fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack("16sH", b"lo", flags | _IFF_UP))


class _NoLookups(trio.abc.HostnameResolver):
    """The resolver of the namespace's loop: a name look-up there would run in one of trio's worker threads."""

    async def getaddrinfo(self, host: bytes | None, port: bytes | str | int | None, family: int = 0, type: int = 0,
                          proto: int = 0, flags: int = 0) -> list[Any]:
        raise RuntimeError(f"no name look-ups inside a FreshNetns ({host!r}): its loop may not start worker threads "
                           "(they would keep its namespace); give servers numeric addresses")

    async def getnameinfo(self, sockaddr: tuple[str, int] | tuple[str, int, int, int], flags: int) -> tuple[str, str]:
        raise RuntimeError("no name look-ups inside a FreshNetns")


class FreshNetns:
    """A network namespace of its own (only ``lo``, up) for a test's servers, reached from the test's own trio
    loop only through ``connect``.

    Why this shape: a network namespace belongs to a thread (``unshare(CLONE_NEWNET)``), and every thread that
    thread starts inherits it. Running a whole test under ``trio.run`` in such a thread would put its worker
    threads — ``trio.to_thread``, which the engine, the store and the tools use all the time — in there too, and
    trio keeps idle workers in one process-wide cache for seconds: a later test in the same process could then
    look up a name, connect or spawn a process in a finished test's namespace (only its ``lo``, nothing on it).
    So only the servers live in the
    namespace, in one plain ``threading.Thread`` running its own ``trio.run`` that never starts a worker thread
    (its loop refuses name look-ups, the one way serving code would; ``tests.tools.http_server`` needs none);
    the code under test runs in the test's thread as it does in production. A socket stays in the namespace it
    was made in, wherever it is used after: ``connect`` has the namespace's loop make the socket and connects it
    from the caller's loop (``FetchPolicy.connect`` is the seam).

    Talk between the loops goes through ``TrioToken.run_sync_soon`` both ways, so neither blocks nor needs a
    worker thread. Skips where no namespace can be made.
    """

    def __init__(self) -> None:
        self._back = trio.lowlevel.current_trio_token()
        self._ready, self._stopped = trio.Event(), trio.Event()
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None
        self._skip: str | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._body, name="fresh-netns", daemon=True)

    @property
    def nursery(self) -> trio.Nursery:
        """The namespace loop's nursery: for what ``run`` starts there (servers), not for the caller's loop."""
        assert self._nursery is not None
        return self._nursery

    def _tell_caller(self, fn: Callable[[], object]) -> None:
        try:
            self._back.run_sync_soon(fn)
        except trio.RunFinishedError:
            pass

    def _body(self) -> None:
        try:
            _enter_fresh_netns()
        except OSError as exc:
            self._skip = f"{NO_NETNS_THREAD}: {exc}"
            self._tell_caller(self._ready.set)
            return
        try:
            trio.run(self._serve)
        except BaseException as exc:  # handed to the caller's loop, which raises it on leaving
            self._error = exc
        finally:
            self._tell_caller(self._ready.set)  # in case the loop failed before it was ready
            self._tell_caller(self._stopped.set)

    async def _serve(self) -> None:
        trio.socket.set_custom_hostname_resolver(_NoLookups())
        async with trio.open_nursery() as nursery:
            self._nursery, self._token = nursery, trio.lowlevel.current_trio_token()
            self._tell_caller(self._ready.set)
            await trio.sleep_forever()

    async def __aenter__(self) -> FreshNetns:
        self._thread.start()
        await self._ready.wait()
        if self._skip is not None:
            self._thread.join()
            pytest.skip(self._skip)
        if self._token is None:
            await self._stopped.wait()
            self._thread.join()
            assert self._error is not None
            raise self._error
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._token is not None and self._nursery is not None
        try:
            self._token.run_sync_soon(self._nursery.cancel_scope.cancel)
        except trio.RunFinishedError:
            pass
        with trio.CancelScope(shield=True):
            await self._stopped.wait()
        self._thread.join()  # it has nothing left to do but return
        if self._error is not None and exc_info[0] is None:
            raise self._error

    async def run(self, async_fn: Callable[[], Awaitable[T]]) -> T:
        """``async_fn()`` run in the namespace's loop (tasks it starts in ``nursery`` live until the end)."""
        assert self._token is not None and self._nursery is not None, "use FreshNetns as an async context manager"
        nursery, done = self._nursery, trio.Event()
        result: list[outcome.Outcome[T]] = []

        async def job() -> None:
            result.append(await outcome.acapture(async_fn))
            self._tell_caller(done.set)

        self._token.run_sync_soon(nursery.start_soon, job)
        await done.wait()
        return result[0].unwrap()

    async def connect(self, address: IPAddress, port: int) -> trio.SocketStream:
        """A TCP connection to ``address``:``port`` inside the namespace (a ``FetchPolicy.connect``)."""
        family = socket.AF_INET6 if address.version == 6 else socket.AF_INET

        async def make() -> socket.socket:
            return socket.socket(family, socket.SOCK_STREAM)

        sock = trio.socket.from_stdlib_socket(await self.run(make))
        try:
            await sock.connect((str(address), port))
        except BaseException:
            sock.close()
            raise
        return trio.SocketStream(sock)
