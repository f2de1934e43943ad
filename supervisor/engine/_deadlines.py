"""A task's deadlines: ``timeout_s`` (wall clock from its start) and ``idle_timeout_s`` (its runtime silent for
that long), the operator's defaults and maxima, and the watch that says which one passed.

The idle clock restarts at every event the worker sends for the task and whenever the supervisor gives a tool
call back; it does not run while the supervisor holds one of the task's tool calls — from the runtime's
``tool.call.requested`` until the supervisor's answer is sent (the policy, a human's approval, the supervisor
running the tool): the runtime is waiting for us then, not silent. A tool the runtime runs itself is the
runtime's own time (its ``tool.call.started``/``completed`` are its events).

The clocks are trio's (monotonic; a test's ``MockClock``). The wall-clock deadline is also stored with the task
(``task.started``: ``timeout_s``, and the event's time), so a supervisor started again fails a task left running
past it with ``TASK_TIMEOUT`` rather than ``SUPERVISOR_RESTARTED`` (``_leasing``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import trio

from ._errors import InvalidTaskInput

#: ``codesdk-supervisor serve``'s defaults (an embedded supervisor has none): a task may run 4 h, and its runtime
#: stay silent 30 min — far beyond a runtime's own longest tool run (Claude Code's Bash: 10 min at most).
SERVICE_TIMEOUT_S, SERVICE_IDLE_TIMEOUT_S = 4 * 3600.0, 30 * 60.0
#: The service's maxima: without them a tenant could ask for a deadline of 1e308 s and hold its task for ever.
SERVICE_TIMEOUT_MAX_S, SERVICE_IDLE_TIMEOUT_MAX_S = 24 * 3600.0, 4 * 3600.0

#: The two deadlines, by the names a task gives them (API fields, ``Engine.start_task`` arguments, details).
TIMEOUT, IDLE_TIMEOUT = "timeout_s", "idle_timeout_s"


def check_seconds(name: str, value: float | None) -> float | None:
    """``value`` as seconds of a deadline (None: none), else ``ValueError`` saying what is wrong."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number of seconds above 0, not {value!r}")
    return float(value)


@dataclass(frozen=True)
class DeadlineLimits:
    """The operator's deadlines for tasks (seconds; None: none). A task that gives none gets the default — or,
    with no default, the maximum; a task asking for more than the maximum is refused (``InvalidTaskInput``,
    HTTP 422), never silently given less than it asked."""

    timeout_default_s: float | None = None
    timeout_max_s: float | None = None
    idle_default_s: float | None = None
    idle_max_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("timeout_default_s", "timeout_max_s", "idle_default_s", "idle_max_s"):
            check_seconds(name, getattr(self, name))
        for default, most in (("timeout_default_s", "timeout_max_s"), ("idle_default_s", "idle_max_s")):
            d, m = getattr(self, default), getattr(self, most)
            if d is not None and m is not None and d > m:
                raise ValueError(f"the task deadline {default} ({d:g} s) is above {most} ({m:g} s)")

    def resolve(self, timeout_s: float | None, idle_timeout_s: float | None) -> tuple[float | None, float | None]:
        """The deadlines a task gets from what it asked; ``InvalidTaskInput`` (nothing stored) for a value that is
        not a finite number of seconds above 0 or is above the operator's maximum."""
        return (self._one(TIMEOUT, timeout_s, self.timeout_default_s, self.timeout_max_s, "--task-timeout-max"),
                self._one(IDLE_TIMEOUT, idle_timeout_s, self.idle_default_s, self.idle_max_s,
                          "--task-idle-timeout-max"))

    @staticmethod
    def _one(name: str, asked: float | None, default: float | None, most: float | None, flag: str) -> float | None:
        try:
            seconds = check_seconds(name, asked)
        except ValueError as exc:
            raise InvalidTaskInput(str(exc)) from None
        if seconds is None:
            return default if default is not None else most
        if most is not None and seconds > most:
            raise InvalidTaskInput(f"{name} {seconds:g} s is above this supervisor's maximum of {most:g} s "
                                   f"(its operator's {flag}): ask for {most:g} s or less")
        return seconds


@dataclass(frozen=True)
class Expiry:
    """A deadline that passed: which (``TIMEOUT`` or ``IDLE_TIMEOUT``) and its value."""

    deadline: str
    limit_s: float

    @property
    def message(self) -> str:
        if self.deadline == TIMEOUT:
            return (f"the task passed its deadline: timeout_s = {self.limit_s:g} s since it started; it was "
                    f"stopped (give a longer timeout_s, or split the work)")
        return (f"the task passed its deadline: idle_timeout_s = {self.limit_s:g} s without an event from its "
                f"runtime; it was stopped (give a longer idle_timeout_s if the runtime works silently that long)")


@dataclass
class TaskClock:
    """A running task's deadlines: armed at its start, fed by its events, held while the supervisor holds one
    of its tool calls."""

    timeout_s: float | None = None
    idle_timeout_s: float | None = None
    started: float = 0.0
    last_activity: float = 0.0
    held: int = 0
    _changed: trio.Event = field(default_factory=trio.Event)

    @classmethod
    def arm(cls, timeout_s: float | None, idle_timeout_s: float | None) -> TaskClock:
        now = trio.current_time()
        return cls(timeout_s=timeout_s, idle_timeout_s=idle_timeout_s, started=now, last_activity=now)

    @property
    def armed(self) -> bool:
        return self.timeout_s is not None or self.idle_timeout_s is not None

    def activity(self) -> None:
        """An event from the runtime: the idle clock starts again (the watch needs no wake: its deadline moved
        later, it looks again when the old one comes)."""
        self.last_activity = trio.current_time()

    @contextmanager
    def hold(self) -> Iterator[None]:
        """The supervisor holds one of the task's tool calls: the idle clock stops until it is given back, and
        starts again from then."""
        self.held += 1
        self._wake()
        try:
            yield
        finally:
            self.held -= 1
            self.last_activity = trio.current_time()
            self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def _deadlines(self) -> list[tuple[float, Expiry]]:
        found = []
        if self.timeout_s is not None:
            found.append((self.started + self.timeout_s, Expiry(TIMEOUT, self.timeout_s)))
        if self.idle_timeout_s is not None and self.held == 0:
            found.append((self.last_activity + self.idle_timeout_s, Expiry(IDLE_TIMEOUT, self.idle_timeout_s)))
        return found

    async def watch(self) -> Expiry:
        """Returns when one of the deadlines has passed (never, for a clock with none)."""
        while True:
            now, deadlines = trio.current_time(), self._deadlines()
            for at, expiry in sorted(deadlines, key=lambda d: d[0]):
                if now >= at:
                    return expiry
            changed = self._changed
            with trio.move_on_at(min((at for at, _ in deadlines), default=math.inf)):
                await changed.wait()
