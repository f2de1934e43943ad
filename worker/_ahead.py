"""A runtime's program started ahead of its task, while the worker and its supervisor are still starting.

Claude Code spends ~0.5 s starting before it reads its stdin; a cold ``codesdk run`` would otherwise pay that after
both interpreters have started. ``codesdk run`` knows what its one task will ask (runtime, runtime_config, workspace)
before anything is imported, and tells the worker it launches ahead of its supervisor (``RUNTIME_AHEAD_ENV``, a JSON
object). The worker composes that runtime's launch from it — with the function its adapter uses for a task — and
starts the program at once, before it imports trio. The task adopts it (``adapters.runtime_process.RuntimeAhead``) only if
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

from codesdk.procs.launch import Launch

from .adapters.claude import launch as claude
from .command import RUNTIME_AHEAD_ENV
from .adapters.codex import launch as codex

log = logging.getLogger("codesdk.worker.ahead")

#: Seconds a runtime started ahead waits for its task before it is ended.
AHEAD_TTL_S = 60.0

#: How one runtime composes the launch of a new session's first task from what ``codesdk run`` knows of it: its
#: ``runtime_config``, its workspace and the worker's environment; None when it cannot (missing program, unusable
#: config: the task itself then says why).
#: (``interactive``: the task may ask its user, which changes Claude Code's tools.)
Composer = Callable[[Mapping[str, object], str, Mapping[str, str], bool], Launch | None]


#: The runtimes that can be started ahead, each with the composer its adapter's task uses too.
COMPOSERS: dict[str, Composer] = {"claude": claude.launch_ahead, "codex": codex.launch_ahead}


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
    launch: Launch
    popen: subprocess.Popen[bytes]


def start_ahead(runtime: str, hint: Mapping[str, object]) -> StartedAhead | None:
    """Start ``runtime``'s program as ``hint`` describes its task; None (logged) where that cannot be done."""
    composer = COMPOSERS.get(runtime)
    config, workspace = hint.get("runtime_config", {}), hint.get("workspace")
    launch = None
    if composer is not None and isinstance(config, dict) and isinstance(workspace, str) and workspace:
        launch = composer(config, workspace, dict(os.environ), hint.get("interactive") is True)
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

