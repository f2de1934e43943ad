"""Which of a process's children it waits for itself, though they lead sessions of their own: ``Children``.

A supervisor is a child subreaper, so it reaps the orphans it adopts (``orphans``). A child that leads a session of
its own may be one of those (a runtime detached a helper and exited before it) or one the supervisor started and
waits for: a worker, the worker template and the workers it forks, a tool command, a sandbox probe. Reaping one of
the latter would steal its exit status (its owner would read "exit 0"). So each such child is *owned* in the
registry from the moment its start begins until it has been reaped, and the sweep leaves owned children alone.

One registry per process that sweeps: the sweep can only leave alone what it is told of, so every spawner in the
process and the sweep must share one. Whoever makes the process a child subreaper makes it and hands it down: the
``codesdk`` command's front (before the supervisor exists: its headstart worker is owned from its start), else
``service.assembly.open_engine``; a process running several engines at once (the test suite) hands each the same.

Standard library only: ``codesdk run`` owns the worker it starts ahead before it imports trio or psutil.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class Children:
    """The children a process owns (it waits for them itself), and the starts of such children under way."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # starts happen on the event loop (or before it), sweeps in a thread
        self._owned: set[int] = set()
        self._starting: set[int] = set()
        self._tokens = itertools.count()

    @contextmanager
    def starting(self) -> Iterator[Callable[[int], None]]:
        """Around the start of a child its starter will wait for itself, which leads a session of its own: until its
        pid is known here, the sweep reaps no unowned child (the kernel may show this one before that). Call the
        yielded ``own(pid)`` as soon as the pid is known; it stays owned after the block, until ``disown(pid)`` once
        it has been reaped (``owned_child`` does that for a child reaped within the block)."""
        with self._lock:
            token = next(self._tokens)
            self._starting.add(token)

        def own(pid: int) -> None:
            with self._lock:
                self._owned.add(pid)
                self._starting.discard(token)

        try:
            yield own
        finally:
            with self._lock:
                self._starting.discard(token)

    @contextmanager
    def owned_child(self) -> Iterator[Callable[[int], None]]:
        """``starting`` for a child that is reaped before the block ends: what it owned is disowned on leaving."""
        pids: list[int] = []
        try:
            with self.starting() as own:
                def own_until_the_end(pid: int) -> None:
                    pids.append(pid)
                    own(pid)

                yield own_until_the_end
        finally:
            for pid in pids:
                self.disown(pid)

    def disown(self, pid: int) -> None:
        """``pid``, owned through ``starting``, has been reaped: that pid may be an orphan's from now on."""
        with self._lock:
            self._owned.discard(pid)

    def owned(self) -> frozenset[int]:
        """The pids owned now."""
        with self._lock:
            return frozenset(self._owned)

    def starts_under_way(self) -> frozenset[int]:
        """A token for each start under way now (the same token for as long as that start is under way)."""
        with self._lock:
            return frozenset(self._starting)
