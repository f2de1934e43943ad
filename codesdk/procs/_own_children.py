"""Which of the supervisor's children it waits for itself, though they lead sessions of their own.

The supervisor is a child subreaper, so it reaps orphans it adopted (``_orphans``). A child that leads a session
of its own may be one of those (a runtime detached a helper and exited before it) or one the supervisor started
and waits for: a worker, the worker template and the workers it forks, a tool command, a sandbox probe. Reaping
one of the latter would steal its exit status (its owner would read "exit 0"). So each such child is *owned* here
from the moment its start begins until it has been reaped, and the sweep leaves owned children alone.

Stdlib only: ``codesdk run`` owns the worker it starts ahead before it imports trio or psutil.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

_lock = threading.Lock()  # starts happen on the event loop (or before it), sweeps in a thread
_owned: set[int] = set()
_starting: set[int] = set()
_tokens = itertools.count()


@contextmanager
def starting() -> Iterator[Callable[[int], None]]:
    """Around the start of a child the supervisor will wait for itself, which leads a session of its own: until
    its pid is known here, the sweep reaps no unowned child (the kernel may show this one before that). Call the
    yielded ``own(pid)`` as soon as the pid is known; it stays owned after the block, until ``disown(pid)`` once it
    has been reaped (``owned_child`` does that for a child reaped within the block)."""
    with _lock:
        token = next(_tokens)
        _starting.add(token)

    def own(pid: int) -> None:
        with _lock:
            _owned.add(pid)
            _starting.discard(token)

    try:
        yield own
    finally:
        with _lock:
            _starting.discard(token)


@contextmanager
def owned_child() -> Iterator[Callable[[int], None]]:
    """``starting`` for a child that is reaped before the block ends: what it owned is disowned on leaving."""
    pids: list[int] = []
    try:
        with starting() as own:
            def own_until_the_end(pid: int) -> None:
                pids.append(pid)
                own(pid)

            yield own_until_the_end
    finally:
        for pid in pids:
            disown(pid)


def disown(pid: int) -> None:
    """``pid``, owned through ``starting``, has been reaped: that pid may be an orphan's from now on."""
    with _lock:
        _owned.discard(pid)


def own_children() -> frozenset[int]:
    """The pids owned now."""
    with _lock:
        return frozenset(_owned)


def starts_under_way() -> frozenset[int]:
    """A token for each start under way now (the same token for as long as that start is under way)."""
    with _lock:
        return frozenset(_starting)

