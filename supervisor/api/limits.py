"""What API clients may hold (``codesdk-supervisor serve`` flags), apart from the server that enforces it: the
service's options are built without importing the HTTP stack (a CLI that never serves stays quick to start)."""

from __future__ import annotations

import resource
from dataclasses import dataclass, field

from ..bundle import BundleLimits

#: Connections answered with a canned 503 at the same time (beyond the cap); further ones are closed unanswered.
MAX_REFUSING = 16
#: A response is written in pieces of this size, each of which the client has ``send_timeout_s`` to take.
SEND_CHUNK = 64 * 1024


@dataclass(frozen=True)
class ApiLimits:
    """Bounds on what clients of the API can hold (``codesdk-supervisor serve`` flags; docs/operations.md)."""

    #: Open connections on all listeners together (clamped to RLIMIT_NOFILE minus ``fd_reserve``).
    max_connections: int = 1024
    #: Open connections charged to one principal (token).
    max_connections_per_principal: int = 128
    #: Open SSE event streams of one principal.
    max_streams_per_principal: int = 32
    #: Seconds from a connection's start (or its previous response) to its request's complete headers.
    header_timeout_s: float = 10.0
    #: Seconds a request body may take to arrive.
    body_timeout_s: float = 30.0
    #: Seconds a client may take to read each ``SEND_CHUNK`` of a response (an event stream's each event).
    send_timeout_s: float = 30.0
    #: Descriptors never given to connections (None: a quarter of RLIMIT_NOFILE, at least 64).
    fd_reserve: int | None = None
    #: What support bundles may cost (size cap, interval per token, cache on disk).
    bundles: BundleLimits = field(default_factory=BundleLimits)

    def __post_init__(self) -> None:
        if min(self.max_connections, self.max_connections_per_principal, self.max_streams_per_principal) < 1:
            raise ValueError("connection and stream limits must be >= 1")
        if min(self.header_timeout_s, self.body_timeout_s, self.send_timeout_s) <= 0:
            raise ValueError("header, body and send timeouts must be > 0 seconds")
        if self.fd_reserve is not None and self.fd_reserve < 0:
            raise ValueError("fd_reserve must be >= 0")

    def connection_cap(self) -> int:
        """``max_connections``, lowered so that connections (and refusals) never take the reserve."""
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            return self.max_connections
        reserve = self.fd_reserve if self.fd_reserve is not None else max(64, soft // 4)
        return max(1, min(self.max_connections, soft - reserve - MAX_REFUSING))
