"""A task's stop grace (``runtime_config.stop_grace_s``), checked the same way for every adapter.

Dependency-free until a task sets one: the path that starts a runtime ahead of its task reads the task's settings
before the worker imports the protocol's models.
"""

from __future__ import annotations

from collections.abc import Mapping


class BadGrace(ValueError):
    """The task's ``stop_grace_s`` cannot be used (the caller's mistake); the message says what it must be."""


def stop_grace(config: Mapping[str, object], default: float) -> float:
    """Seconds the runtime gets to stop by itself once asked: the task's, else ``default``. ``BadGrace``."""
    if "stop_grace_s" not in config:
        return default
    from codesdk.protocol import MAX_STOP_GRACE_S  # a stop waits out the grace: it may not hold a session for long

    grace = config["stop_grace_s"]
    if not isinstance(grace, int | float) or isinstance(grace, bool) or not 0 <= grace <= MAX_STOP_GRACE_S:
        raise BadGrace(f"runtime_config.stop_grace_s must be a number of seconds from 0 to {MAX_STOP_GRACE_S:.0f}")
    return float(grace)
