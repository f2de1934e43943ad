"""A runtime's program started ahead of its task, while the worker and its supervisor are still starting.

Claude Code spends ~0.5 s starting before it reads its stdin; a cold ``codesdk run`` would otherwise pay that after
both interpreters have started. ``codesdk run`` knows what its one task will ask (runtime, runtime_config, workspace)
before anything is imported, and tells the worker it launches ahead of its supervisor (``RUNTIME_AHEAD_ENV``, a JSON
object). The worker composes that runtime's launch from it — with the function its adapter uses for a task — and
starts the program at once, before it imports trio. The task adopts it (``adapters._process.RuntimeAhead``) only if
the launch it composes from its own parameters is exactly the same (argv, environment, directory); otherwise, and
when no task claims it within ``AHEAD_TTL_S``, it is killed and reaped. A runtime started ahead is only ever an
optimisation: whatever goes wrong with it, the task starts its own.

The standard library only, on purpose: this runs before the worker's heavy imports (trio ~0.2 s, the protocol's
models more), which the program's own start then overlaps.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass

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
    #: Written to the program's stdin as soon as it starts, before anyone waits for it (Claude Code's
    #: ``initialize``): the program reads it while the worker is still importing. Part of what must be equal.
    opening: bytes = b""


#: How one runtime composes its launch from a hint (``{"runtime_config": {...}, "workspace": "..."}``) and the
#: worker's environment; None when it cannot (missing program, unusable config).
Composer = Callable[[Mapping[str, object], Mapping[str, str]], RuntimeLaunch | None]


def _composers() -> dict[str, Composer]:
    from .adapters.claude._launch import launch_ahead as claude  # light: no protocol models
    from .adapters.codex._launch import launch_ahead as codex

    return {"claude": claude, "codex": codex}


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


@dataclass(frozen=True)
class StartedAhead:
    """A runtime's program started ahead: what it was started as, and its process (stdio pipes, own group)."""

    runtime: str
    launch: RuntimeLaunch
    popen: subprocess.Popen[bytes]


def start_ahead(runtime: str, hint: Mapping[str, object]) -> StartedAhead | None:
    """Start ``runtime``'s program as ``hint`` describes its task; None (logged) where that cannot be done."""
    composer = _composers().get(runtime)
    launch = composer(hint, dict(os.environ)) if composer is not None else None
    if launch is None:
        log.info("not starting %s ahead of its task: no launch for it here", runtime)
        return None
    try:
        popen = subprocess.Popen(list(launch.argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, env=dict(launch.env), cwd=launch.cwd, process_group=0)
    except OSError as exc:  # the task's own start reports a real problem, in context
        log.info("not starting %s ahead of its task: %s", runtime, exc)
        return None
    if launch.opening:
        assert popen.stdin is not None
        try:  # a few hundred bytes into an empty pipe: this does not block
            popen.stdin.write(launch.opening)
            popen.stdin.flush()
        except OSError as exc:  # it died at once: the task starts its own, which then says why
            log.info("not starting %s ahead of its task: %s", runtime, exc)
            popen.kill()
            popen.wait()
            return None
    log.info("started %s ahead of its task (pid %d)", runtime, popen.pid)
    return StartedAhead(runtime, launch, popen)


def differences(a: RuntimeLaunch, b: RuntimeLaunch) -> list[str]:
    """Which parts of two launches differ (names only, never values: the environment holds credentials)."""
    parts = [name for name in ("argv", "cwd", "opening") if getattr(a, name) != getattr(b, name)]
    return parts + [f"env[{key}]" for key in sorted(set(a.env) | set(b.env)) if a.env.get(key) != b.env.get(key)]
