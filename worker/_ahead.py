"""A runtime's program started ahead of its task, while the worker and its supervisor are still starting.

Claude Code spends ~0.5 s starting before it reads its stdin; a cold ``codesdk run`` would otherwise pay that after
both interpreters have started. ``codesdk run`` knows what its one task will ask (runtime, runtime_config, workspace)
before anything is imported, and tells the worker it launches ahead of its supervisor (``RUNTIME_AHEAD_ENV``, a JSON
object). The worker composes that runtime's launch from it — with the function its adapter uses for a task — and
starts the program at once. The task adopts it only if the launch it composes from its own parameters is exactly the
same (argv, environment, directory); otherwise, and when no task claims it within ``AHEAD_TTL_S``, it is killed and
reaped. A runtime started ahead is only ever an optimisation: whatever goes wrong with it, the task starts its own.

Light on purpose (the standard library and trio, no protocol models): this runs before the worker's heavy imports.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import trio

log = logging.getLogger("codesdk.worker.ahead")

#: The variable through which the supervisor's ``codesdk run`` asks for a runtime ahead
#: (``supervisor.worker_launch.RUNTIME_AHEAD_ENV``; a test holds the two equal). Removed from the worker's
#: environment before anything reads it, so no runtime inherits it.
RUNTIME_AHEAD_ENV = "CODESDK_RUNTIME_AHEAD"
#: Seconds a runtime started ahead waits for its task before it is ended.
AHEAD_TTL_S = 60.0


@dataclass(frozen=True)
class RuntimeLaunch:
    """Everything the operating system is told when a runtime's program starts: two equal launches start the same
    program in the same state."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str


#: How one runtime composes its launch from a hint (``{"runtime_config": {...}, "workspace": "..."}``) and the
#: worker's environment; None when it cannot (missing program, unusable config).
Composer = Callable[[Mapping[str, object], Mapping[str, str]], RuntimeLaunch | None]


def _composers() -> dict[str, Composer]:
    from .adapters.claude._launch import launch_ahead as claude  # light: no protocol models

    return {"claude": claude}


def hint_from_env() -> tuple[str, dict[str, object]] | None:
    """Take ``RUNTIME_AHEAD_ENV`` out of this process's environment: (runtime, hint), or None (absent, malformed)."""
    raw = os.environ.pop(RUNTIME_AHEAD_ENV, None)
    if not raw:
        return None
    try:
        hint = json.loads(raw)
    except ValueError:
        log.warning("ignoring %s: not JSON", RUNTIME_AHEAD_ENV)
        return None
    if not isinstance(hint, dict) or not isinstance(hint.get("runtime"), str):
        log.warning("ignoring %s: not an object naming a runtime", RUNTIME_AHEAD_ENV)
        return None
    return hint["runtime"], hint


class RuntimeAhead:
    """A runtime's program, started before its task: ``take`` hands it over to the task that composes the same
    launch; ``discard`` ends it. Either happens once; both are safe to call again."""

    def __init__(self, runtime: str, launch: RuntimeLaunch, process: trio.Process) -> None:
        self.runtime = runtime
        self.launch = launch
        self._process: trio.Process | None = process

    @classmethod
    async def start(cls, runtime: str, hint: Mapping[str, object]) -> RuntimeAhead | None:
        """Start ``runtime``'s program as ``hint`` describes its task; None (logged) where that cannot be done."""
        composer = _composers().get(runtime)
        launch = composer(hint, dict(os.environ)) if composer is not None else None
        if launch is None:
            log.info("not starting %s ahead of its task: no launch for it here", runtime)
            return None
        try:
            process = await trio.lowlevel.open_process(
                list(launch.argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                env=dict(launch.env), cwd=launch.cwd, process_group=0)
        except OSError as exc:  # the task's own start reports a real problem, in context
            log.info("not starting %s ahead of its task: %s", runtime, exc)
            return None
        log.info("started %s ahead of its task (pid %d)", runtime, process.pid)
        return cls(runtime, launch, process)

    async def take(self, runtime: str, launch: RuntimeLaunch) -> trio.Process | None:
        """The program, if it is unclaimed, alive, of ``runtime`` and launched exactly as ``launch``; else it is
        ended (it can serve nobody else) and None returned: the caller starts its own."""
        process = self._process
        if process is None:
            return None
        if runtime != self.runtime or launch != self.launch or process.returncode is not None:
            why = ", ".join(_differences(self.launch, launch)) if runtime == self.runtime else f"runtime {runtime}"
            log.info("not using the %s started ahead (%s); starting another", self.runtime, why or "it has exited")
            await self.discard()
            return None
        self._process = None
        return process

    async def expire(self, after_s: float = AHEAD_TTL_S) -> None:
        """End the program if no task has claimed it after ``after_s`` (run in the worker's nursery)."""
        await trio.sleep(after_s)
        if self._process is not None:
            log.info("the %s started ahead was not claimed within %.0f s; ending it", self.runtime, after_s)
            await self.discard()

    async def discard(self) -> None:
        """SIGKILL the unclaimed program's process group and reap it."""
        process, self._process = self._process, None
        if process is None:
            return
        with trio.CancelScope(shield=True):
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            await close_and_reap(process)


async def close_and_reap(process: trio.Process) -> None:
    """Close our ends of a started process's pipes and wait for its exit status (what ``trio.run_process`` does
    for a process it started itself)."""
    for stream in (process.stdin, process.stdout, process.stderr):
        if stream is not None:
            with trio.CancelScope(shield=True):
                await stream.aclose()
    with trio.CancelScope(shield=True):
        await process.wait()


def _differences(a: RuntimeLaunch, b: RuntimeLaunch) -> list[str]:
    """Which parts of two launches differ (names only, never values: the environment holds credentials)."""
    parts = [name for name in ("argv", "cwd") if getattr(a, name) != getattr(b, name)]
    return parts + [f"env[{key}]" for key in sorted(set(a.env) | set(b.env)) if a.env.get(key) != b.env.get(key)]
