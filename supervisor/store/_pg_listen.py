"""LISTEN for other processes' commits on one or several channels, and hand what they announce to trio.

A notification is only a wake-up; the tables stay the truth. A commit announces what it changed with
``pg_notify`` inside its transaction, so the notice is delivered only if it commits. A ``Listener`` runs in a
thread on a connection of its own, listening on each of its ``Channel``s; each round's payloads go through the
channel's ``wanted`` (in the thread: quick and thread-safe) and, if any remain, to its ``act`` on the trio thread.
Whenever it (re)connects it calls every channel's ``missed`` (on the trio thread), since notices sent while it was
away are lost: whoever relies on them reads everything again then.

The live tail (``events_channel``): each commit that stored events announces their sessions on ``CHANNEL``
(``PostgresDb.announce``); the hub is nudged for sessions another store appended to (its own appends reach local
subscribers directly), and every subscriber at each (re)connect; subscribers then read from their last seq, so a
lost connection costs a read, never a gap or a duplicate.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import threading
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
import trio

from ._pg import CHANNEL, connect, first_line
from ._subscribe import Hub

log = logging.getLogger("codesdk.supervisor.store")

#: Seconds between attempts to reconnect: doubling from the first to the last.
MIN_BACKOFF_S = 0.1
MAX_BACKOFF_S = 5.0


@dataclass(frozen=True)
class Channel:
    """A channel to LISTEN on, and what its notices do."""

    name: str
    #: In the listener's thread, one round's payloads: those to act on (quick, and safe from that thread).
    wanted: Callable[[list[str]], Collection[str]]
    #: On the trio thread, with what ``wanted`` kept (called only when it kept something).
    act: Callable[[Collection[str]], None]
    #: On the trio thread, at every (re)connect: notices sent while the listener was away are lost.
    missed: Callable[[], None]


def events_channel(origin: str, hub: Hub) -> Channel:
    """The live tail: nudge the local subscribers of sessions another store (not ``origin``) appended to."""

    def wanted(payloads: list[str]) -> set[str]:
        sessions = set()
        for payload in payloads:
            sender, _, session_id = payload.partition(" ")
            if sender != origin and hub.count(session_id):  # a dict lookup: safe from the listener's thread
                sessions.add(session_id)
        return sessions

    def act(sessions: Collection[str]) -> None:
        for session_id in sessions:
            hub.nudge(session_id)

    return Channel(CHANNEL, wanted, act, hub.nudge_all)


class Listener:
    def __init__(self, url: str, location: str, channels: Sequence[Channel]) -> None:
        if not channels or len({c.name for c in channels}) != len(channels):
            raise ValueError("a listener needs one channel at least, each named once")
        self._url = url
        self._location = location
        self._channels = {channel.name: channel for channel in channels}
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
                        for name in self._channels:  # our own constant names: never a caller's text
                            conn.execute(f"LISTEN {name}")
                        self.listening, backoff = True, MIN_BACKOFF_S
                        for channel in self._channels.values():  # what was committed while we were not listening
                            self._to_trio(token, channel.missed)
                        self._receive(conn, token)
                except trio.RunFinishedError:
                    return
                except psycopg.Error as exc:
                    if self.listening:
                        log.warning("lost the notification connection to %s (%s); %s poll until it is back",
                                    self._location, first_line(exc), self._who())
                except Exception:  # a wake-up service: whatever breaks it, its users poll, and it tries again
                    log.exception("the notification listener for %s failed; %s poll until it is back",
                                  self._location, self._who())
                self.listening = False
                self._stop.wait(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
        finally:
            self.listening = False

    def _who(self) -> str:
        return " and ".join(sorted({CHANNEL: "event subscribers"}.get(n, f"readers of {n}") for n in self._channels))

    def _receive(self, conn: psycopg.Connection[Any], token: trio.lowlevel.TrioToken) -> None:
        """Wait on the connection's socket and the stop pipe together; hand each round's notices to trio."""
        with selectors.DefaultSelector() as selector:  # (select.select fails for a descriptor past 1023)
            selector.register(conn.fileno(), selectors.EVENT_READ)
            selector.register(self._wake_r, selectors.EVENT_READ)
            while not self._stop.is_set():
                if any(key.fd == self._wake_r for key, _ in selector.select()):
                    return
                self._hand_over(conn, token)

    def _hand_over(self, conn: psycopg.Connection[Any], token: trio.lowlevel.TrioToken) -> None:
        """Hand what each channel wants of the notices that have arrived to trio."""
        payloads: dict[str, list[str]] = {}
        for notice in conn.notifies(timeout=0):  # what has arrived; raises if the connection is gone
            payloads.setdefault(notice.channel, []).append(notice.payload)
        for name, received in payloads.items():
            channel = self._channels.get(name)
            if channel is not None and (kept := channel.wanted(received)):
                self._to_trio(token, channel.act, kept)

    @staticmethod
    def _to_trio(token: trio.lowlevel.TrioToken, function: Callable[..., None], *args: Any) -> None:
        trio.from_thread.run_sync(function, *args, trio_token=token)
