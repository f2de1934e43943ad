"""Guards for tests that start real agent runtimes: they run only with no way off this machine."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

import pytest

from codesdk.testing import loopback_only

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


def run_in_fresh_netns(async_fn: Callable[[], Awaitable[T]]) -> T:
    """Run ``async_fn`` under its own ``trio.run`` in a new thread that has a network namespace of its own (only
    ``lo``, up): servers it starts and connections it makes are in there, reachable by nothing else and reaching
    nothing else. Skips where no namespace can be made. (Threads that thread starts — trio's worker threads —
    inherit the namespace; nothing in the suite opens sockets in worker threads but name look-ups.)"""
    import threading

    import trio

    outcome: dict[str, Any] = {}

    def body() -> None:
        try:
            _enter_fresh_netns()
        except OSError as exc:
            outcome["skip"] = f"{NO_NETNS_THREAD}: {exc}"
            return
        try:
            outcome["value"] = trio.run(async_fn)
        except BaseException as exc:  # handed to the test's thread, which raises it
            outcome["error"] = exc

    thread = threading.Thread(target=body, name="fresh-netns")
    thread.start()
    thread.join()
    if "skip" in outcome:
        pytest.skip(outcome["skip"])
    if "error" in outcome:
        raise outcome["error"]
    return cast(T, outcome["value"])
