"""Waiting for a condition from synchronous test code (a process's state, a socket, a file): poll until it holds,
with a hang guard that only a broken product reaches — never a duration that depends on this machine's speed."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

T = TypeVar("T")

#: Seconds after which a wait is a hang: far beyond anything a working product needs, even on a loaded machine.
HANG_GUARD_S = 120.0


def wait_for(what: str, condition: Callable[[], T | None], guard_s: float = HANG_GUARD_S) -> T:
    """Poll ``condition`` until it is truthy; its value. Fails naming ``what`` once ``guard_s`` has passed."""
    deadline = time.monotonic() + guard_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up after {guard_s:g} s waiting for {what}")
        time.sleep(0.02)


async def until(what: str, condition: Callable[[], object]) -> None:
    """In a trio test: poll ``condition`` until it is truthy, letting the rest of the test's tasks run (the test's
    own ``trio.fail_after`` is the hang guard). ``what`` names the wait in the failure."""
    import trio

    try:
        while not condition():
            await trio.sleep(0.02)
    except trio.Cancelled as exc:
        exc.add_note(f"while waiting for {what}")
        raise


@contextmanager
def real_time_limit(what: str, seconds: float = HANG_GUARD_S) -> Iterator[None]:
    """In a trio test on a clock that stands still (the ``still_clock`` fixture), fail the block once ``seconds``
    of real time have passed: ``trio.fail_after`` counts trio's time, which there moves only when the test moves
    it. A timer thread cancels the block through the run's token; ``what`` names it in the failure."""
    import trio

    token = trio.lowlevel.current_trio_token()
    with trio.CancelScope() as block:

        def expire() -> None:
            try:
                token.run_sync_soon(block.cancel)
            except trio.RunFinishedError:
                pass  # the test is over already

        timer = threading.Timer(seconds, expire)
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()
    if block.cancelled_caught:
        raise AssertionError(f"gave up after {seconds:g} s of real time: {what}")
