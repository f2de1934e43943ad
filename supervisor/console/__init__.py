"""The web console: its static page (package data) and the console sessions a login makes.

A login exchanges a token for a console session: a random id the browser holds in an HttpOnly cookie, and a CSRF
token the page holds in memory and sends back as ``X-CSRF-Token`` on every request that changes something. The
session keeps only the token's hash: each request authenticates the hash again, so a revoked or rotated token ends
its console sessions at once, and a console session is never more than its token is (docs/console.md).

An open console polls what is waiting every ``POLL_S`` (its script's ``POLL_MS``), on every page: a console session
seen within ``ACTIVE_S`` is someone who can answer the approvals and questions of the namespaces its token may see
(docs/operations.md, "Approval routing").
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources

COOKIE = "codesdk_console"
CSRF_HEADER = "x-csrf-token"
#: A console session ends this long after its login, whatever is done with it.
LIFETIME_S = 8 * 3600.0
#: … and this long after its last request.
IDLE_S = 3600.0
#: How often an open console asks what is waiting (app.js ``POLL_MS``) …
POLL_S = 10.0
#: … and how recently a console session must have been seen to count as someone watching: three polls, so that a
#: late poll (a busy browser, a slow network) does not drop it.
ACTIVE_S = 3 * POLL_S
#: Console sessions one token may hold at once; a new login past it ends that token's oldest.
PER_TOKEN = 16
#: Console sessions of all tokens at once (a bound on memory: only a valid token logs in).
TOTAL = 10_000

#: The Content-Security-Policy of every console response: the page's own script and style, its own origin only.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
       "frame-ancestors 'none'; base-uri 'none'; form-action 'self'")
#: Headers every console response carries (the page and its files, the login and logout answers).
SECURITY_HEADERS = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "no-referrer",
    "cross-origin-opener-policy": "same-origin",
    "cross-origin-resource-policy": "same-origin",
    "permissions-policy": "camera=(), microphone=(), geolocation=(), payment=(), usb=()",
}

#: The files of the page, by the name it is served under, and their media types. Nothing else is served.
ASSETS = {"index.html": "text/html; charset=utf-8", "app.js": "text/javascript; charset=utf-8",
          "app.css": "text/css; charset=utf-8"}


def asset(name: str) -> bytes:
    """One of ``ASSETS``, read from the installed package."""
    if name not in ASSETS:
        raise KeyError(name)
    return resources.files(__name__).joinpath("static", name).read_bytes()


@dataclass
class ConsoleSession:
    session_id: str
    token_sha256: str
    csrf_token: str
    created: float
    last_used: float

    def expires_at(self) -> float:
        """When it ends unless used again (wall-clock, for the page to show)."""
        return min(self.created + LIFETIME_S, self.last_used + IDLE_S)


class ConsoleSessions:
    """The service's console sessions, in memory: a restart (or another supervisor sharing the store) asks for a
    new login, which costs a user one token paste and keeps no session secret on disk."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._sessions: dict[str, ConsoleSession] = {}
        #: Called when a session is used (a login or a request): the service wakes waits for someone to answer.
        self.on_seen: Callable[[], None] | None = None

    def open(self, token_sha256: str) -> ConsoleSession:
        now = self._clock()
        self._expire(now)
        mine = sorted((s for s in self._sessions.values() if s.token_sha256 == token_sha256),
                      key=lambda s: s.created)
        for old in mine[:max(0, len(mine) - PER_TOKEN + 1)]:
            del self._sessions[old.session_id]
        if len(self._sessions) >= TOTAL:
            del self._sessions[min(self._sessions.values(), key=lambda s: s.last_used).session_id]
        session = ConsoleSession(secrets.token_urlsafe(32), token_sha256, secrets.token_urlsafe(32), now, now)
        self._sessions[session.session_id] = session
        self._seen()
        return session

    def find(self, session_id: str | None) -> ConsoleSession | None:
        """The live session of that cookie value (its idle time starts again), or None."""
        if not session_id:
            return None
        now = self._clock()
        session = self._sessions.get(session_id)
        if session is None:
            return None
        if now >= session.expires_at():
            del self._sessions[session_id]
            return None
        session.last_used = now
        self._seen()
        return session

    def active(self, within_s: float = ACTIVE_S) -> list[ConsoleSession]:
        """The live sessions used within the last ``within_s`` seconds (an open console polls)."""
        now = self._clock()
        return [s for s in self._sessions.values() if now - s.last_used < within_s and now < s.expires_at()]

    def close(self, session_id: str | None) -> None:
        if session_id:
            self._sessions.pop(session_id, None)

    def _seen(self) -> None:
        if self.on_seen is not None:
            self.on_seen()

    def _expire(self, now: float) -> None:
        for session_id in [s.session_id for s in self._sessions.values() if now >= s.expires_at()]:
            del self._sessions[session_id]


def csrf_matches(session: ConsoleSession, sent: str | None) -> bool:
    return sent is not None and hmac.compare_digest(session.csrf_token.encode(), sent.encode())
