"""The live tail across supervisors: LISTEN for other processes' commits, nudge local subscribers to read.

A notification is only a wake-up; the events table stays the truth. Each commit that stored events announces
their sessions on ``CHANNEL`` (``PostgresDb.announce``, inside the transaction, so the notice is delivered only
if it commits). The listener runs in a thread on a connection of its own and nudges the hub for sessions another
store appended to (its own appends reach local subscribers directly). Whenever it (re)connects it nudges every
subscriber, since notices sent while it was away are lost; subscribers then read from their last seq, so a lost
connection costs a read, never a gap or a duplicate.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import threading
from collections.abc import Callable
from typing import Any

import psycopg
import trio

from ._pg import CHANNEL, connect, first_line
from ._subscribe import Hub

log = logging.getLogger("codesdk.supervisor.store")

#: Seconds between attempts to reconnect: doubling from the first to the last.
MIN_BACKOFF_S = 0.1
MAX_BACKOFF_S = 5.0


class Listener:
    def __init__(self, url: str, location: str, origin: str, hub: Hub) -> None:
        self._url = url
        self._location = location
        self._origin = origin
        self._hub = hub
        self._stop = threading.Event()
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._pipe_open = True
        #: whether notifications are being received now (what readiness can report)
        self.listening = False

    async def run(self) -> None:
        """Listen until ``stop``."""
        token = trio.lowlevel.current_trio_token()
        try:
            await trio.to_thread.run_sync(self._listen, token)
        finally:
            self._pipe_open = False  # ``stop`` and this run on the trio thread: no write to a closed (reused) fd
            os.close(self._wake_r)
            os.close(self._wake_w)

    def stop(self) -> None:
        self._stop.set()
        if self._pipe_open:
            with contextlib.suppress(BlockingIOError):
                os.write(self._wake_w, b"x")  # ends a wait for notices at once

    def _listen(self, token: trio.lowlevel.TrioToken) -> None:
        backoff = MIN_BACKOFF_S
        try:
            while not self._stop.is_set():
                try:
                    with connect(self._url) as conn:
                        conn.execute(f"LISTEN {CHANNEL}")
                        self.listening, backoff = True, MIN_BACKOFF_S
                        self._to_trio(token, self._hub.nudge_all)  # what was committed while we were not listening
                        self._receive(conn, token)
                except trio.RunFinishedError:
                    return
                except psycopg.Error as exc:
                    if self.listening:
                        log.warning("lost the notification connection to %s (%s); subscribers poll until it is "
                                    "back", self._location, first_line(exc))
                except Exception:  # a wake-up service: whatever breaks it, subscribers poll, and it tries again
                    log.exception("the notification listener for %s failed; subscribers poll until it is back",
                                  self._location)
                self.listening = False
                self._stop.wait(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
        finally:
            self.listening = False

    def _receive(self, conn: psycopg.Connection[Any], token: trio.lowlevel.TrioToken) -> None:
        """Wait on the connection's socket and the stop pipe together; hand each round's sessions to trio."""
        with selectors.DefaultSelector() as selector:  # (select.select fails for a descriptor past 1023)
            selector.register(conn.fileno(), selectors.EVENT_READ)
            selector.register(self._wake_r, selectors.EVENT_READ)
            while not self._stop.is_set():
                if any(key.fd == self._wake_r for key, _ in selector.select()):
                    return
                self._hand_over(conn, token)

    def _hand_over(self, conn: psycopg.Connection[Any], token: trio.lowlevel.TrioToken) -> None:
        """Hand the sessions of the notices that have arrived to trio, those someone here follows."""
        sessions: set[str] = set()
        for notice in conn.notifies(timeout=0):  # what has arrived; raises if the connection is gone
            origin, _, session_id = notice.payload.partition(" ")
            if origin != self._origin and self._hub.count(session_id):  # a dict lookup: safe from this thread
                sessions.add(session_id)
        if sessions:
            self._to_trio(token, self._nudge, sessions)

    def _nudge(self, sessions: set[str]) -> None:
        for session_id in sessions:
            self._hub.nudge(session_id)

    @staticmethod
    def _to_trio(token: trio.lowlevel.TrioToken, function: Callable[..., None], *args: Any) -> None:
        trio.from_thread.run_sync(function, *args, trio_token=token)
