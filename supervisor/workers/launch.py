"""How a namespace's worker is launched, and a worker launched ahead of the supervisor (a headstart).

Light on purpose — the standard library and the namespace helpers only, no trio, no protocol models — so that
``codesdk run`` can start the namespace's worker before its own heavy imports (trio, pydantic, the store: about
half a second) and the two interpreters start side by side instead of one after the other. The pool adopts such
a headstart only if it was launched exactly as the pool itself would launch it now (``Launch``: argv,
environment, directory, identity); otherwise it is killed and the pool starts its own. A headstart is only ever
an optimisation: whatever goes wrong with it, the pool's own start follows.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from codesdk.procs.children import Children
from codesdk.procs.launch import Launch
from codesdk.worker.command import RUNTIMES_DIR_ENV, TEST_STEPS_ENV, worker_argv
from ..namespaces import (
    DEFAULT_PATH,
    RUNTIME_AHEAD_ENV,
    Identity,
    Namespace,
    NamespaceDisks,
    NamespaceEnv,
    NamespaceVariables,
    Quarantines,
    UidRange,
    UnsafeDataDir,
    build_env,
    namespace_identity,
    operator_dirs,
    prepare_namespace,
    prepare_session_dirs,
    secure_data_dir,
    tighten_data_dir,
)

if TYPE_CHECKING:
    from codesdk.procs.process import StartedProcess

    from ..groups import ResourceGroups

log = logging.getLogger("codesdk.supervisor.pool")



@dataclass(frozen=True)
class WorkerPolicy:
    """When a namespace's worker is let go, restarted or refused. The one definition of these defaults: the
    service's flags (``codesdk-supervisor serve``) and ``SupervisorOptions`` hold one, and give it to the
    pool."""

    idle_timeout_s: float = 300.0  # an unused worker is shut down after this long
    max_restarts: int = 5  # burst intensity: this many crashes within restart_window_s quarantine the namespace
    restart_window_s: float = 60.0
    sustained_max_restarts: int = 20  # sustained intensity: this many within sustained_window_s do too
    sustained_window_s: float = 3600.0
    quarantine_s: float = 600.0  # how long a quarantined namespace refuses new workers (an operator may lift it)
    shutdown_grace_s: float = 5.0  # time to exit after runtime.shutdown, before SIGTERM then SIGKILL
    #: Liveness: a running worker is pinged (``runtime.ping``) this often (0: never); one that answers no ping and
    #: sends nothing for ``liveness_timeout_s`` is taken for frozen and killed as crashed (docs/reliability.md).
    liveness_interval_s: float = 10.0
    liveness_timeout_s: float = 30.0


@dataclass(frozen=True)
class PoolConfig:
    data_dir: Path
    argv: tuple[str, ...] = ()
    policy: WorkerPolicy = field(default_factory=WorkerPolicy)
    backoff_initial_s: float = 0.25  # delay before restarting after a crash; doubles per recent crash
    backoff_max_s: float = 10.0
    handshake_timeout_s: float = 30.0
    path: str | None = None  # PATH for workers
    # namespace (or "*") -> variables given at start-up; they win over the stored ones (``NamespaceEnv``)
    env: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    # Each namespace's worker runs as its own uid+gid from this range (None: as the supervisor's uid).
    worker_uids: UidRange | None = None
    #: Each namespace's disk quota (its own ext4 volume, mounted before its worker starts); None: no quotas.
    disks: NamespaceDisks | None = field(default=None, compare=False)
    #: Where the namespaces' stored variables are kept: one instance for the pool and every launch (default: the
    #: data dir's files; the shared database with ``--store postgresql://``).
    variables: NamespaceVariables = field(default=None, compare=False, repr=False)  # type: ignore[assignment]
    #: Quarantines every supervisor sees (the shared database); None: the pool's own, in memory.
    quarantines: Quarantines | None = field(default=None, compare=False, repr=False)
    # Fork ``codesdk-worker``s from a pre-imported template (workers/template.py): ~30 ms and ~6 MB of their own
    # (idle) instead of ~0.5 s and ~24 MB. Worth its one-off start for a service; not for one ``codesdk run``.
    template: bool = False
    #: The registry of this process's children (``codesdk.procs.children``): every worker the pool starts, and a
    #: headstart, is owned there until reaped, and the engine's orphan sweep reads it. One per process: whoever
    #: makes the process a child subreaper makes it (the ``codesdk`` front, else ``open_engine``) and hands it here.
    children: Children = field(default_factory=Children, compare=False, repr=False)
    #: Each namespace's resource group (``codesdk.supervisor.groups``): its worker is put there before it is sent
    #: anything, and whatever is left there is killed when the worker ends. None: no groups.
    groups: ResourceGroups | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.variables is None:
            object.__setattr__(self, "variables", NamespaceEnv(self.data_dir))

    def worker_argv(self) -> list[str]:
        return list(self.argv) or worker_argv()

    def env_for(self, namespace: str) -> dict[str, str]:
        return {**self.env.get("*", {}), **self.env.get(namespace, {})}


def template_env(config: PoolConfig) -> dict[str, str]:
    """The worker template's own environment: what every worker's starts with, and nothing of any namespace (each
    forked worker then takes its whole environment from its launch)."""
    return {"PATH": config.path or DEFAULT_PATH, "LANG": "C.UTF-8"}


def workers_env(env: Mapping[str, Mapping[str, str]], *, test_scenarios: bool,
                environ: Mapping[str, str] = os.environ) -> dict[str, Mapping[str, str]]:
    """The operator's variables per namespace (``PoolConfig.env``), with the scripted runtime's test instruments
    switched on for every namespace when ``test_scenarios``, and the supervisor's own ``RUNTIMES_DIR_ENV`` (an
    operator's setting, not a tenant's) for every namespace unless given."""
    composed = dict(env)
    defaults = {RUNTIMES_DIR_ENV: environ[RUNTIMES_DIR_ENV]} if environ.get(RUNTIMES_DIR_ENV) else {}
    if test_scenarios:
        defaults[TEST_STEPS_ENV] = "1"
    if defaults:
        composed["*"] = {**defaults, **composed.get("*", {})}
    return composed





#: The isolation levels (``protocol.IsolationLevel``'s values: this module imports no models).
NAMESPACED, EPHEMERAL, SHARED = "namespaced", "ephemeral", "shared"


@dataclass(frozen=True)
class Placement:
    """Which worker runs a session's tasks, each its own pool slot: its namespace's (``namespaced``), one of the
    session's own with a HOME made for it (``ephemeral``, ``session_id`` given), or the one with the service user's
    own HOME (``shared``)."""

    namespace: str
    isolation: str = NAMESPACED
    session_id: str | None = None

    def __post_init__(self) -> None:
        if self.isolation not in (NAMESPACED, EPHEMERAL, SHARED):
            raise ValueError(f"unknown isolation level {self.isolation!r}")
        if (self.isolation == EPHEMERAL) != (self.session_id is not None):
            raise ValueError("an ephemeral placement, and only one, names its session")

    @property
    def key(self) -> str:
        """The pool slot's name: the namespace's own for ``namespaced`` (as before there were levels)."""
        if self.isolation == EPHEMERAL:
            return f"{self.namespace}~{self.session_id}"
        return self.namespace if self.isolation == NAMESPACED else f"{self.namespace}~shared"

    @property
    def group_leaf(self) -> str:
        """The worker's leaf in its namespace's resource group (``groups.place_worker``)."""
        if self.isolation == EPHEMERAL:
            return f"worker-{self.session_id}"
        return "worker" if self.isolation == NAMESPACED else "worker-shared"


@dataclass(frozen=True)
class PreparedLaunch:
    launch: Launch
    identity: Identity | None
    env_stamp: str  # the namespace's stored variables' stamp, taken before they were read


def prepare_launch(config: PoolConfig, namespace: Namespace, placement: Placement | None = None) -> PreparedLaunch:
    """Make the namespace's directories (and identity, with a uid range) and compose its worker's launch — or,
    for another ``placement``, an ephemeral session's own directories (owned by the namespace's identity: its
    worker works in the namespace's workspaces), or the service user's own (shared: run as the service's uid).
    Blocking file work: the pool runs it in a thread. ``UidRangeError``; ``OSError``."""
    isolation = placement.isolation if placement is not None else NAMESPACED
    volume = None
    if config.disks is not None and isolation != SHARED:  # its volume first: the directories are then made on it
        volume = config.disks.ensure(namespace)  # (an ephemeral session's HOME, and its workspace, too)
    if isolation == EPHEMERAL:
        assert placement is not None and placement.session_id is not None
        identity = (namespace_identity(config.data_dir, config.worker_uids, namespace)
                    if config.worker_uids is not None else None)
        dirs = prepare_session_dirs(volume or config.data_dir, placement.session_id, identity)
        if identity is not None:
            tighten_data_dir(config.data_dir)
    elif isolation == SHARED:
        dirs, identity = operator_dirs(), None
    else:
        dirs, identity = prepare_namespace(config.data_dir, namespace, config.worker_uids)
    stored_env = config.variables
    stamp = stored_env.stamp(namespace.name)  # before the values: a write in between shows as a change
    env = build_env(dirs, {**stored_env.values(namespace.name), **config.env_for(namespace.name)}, config.path)
    launch = Launch(argv=tuple(config.worker_argv()), env=env, cwd=str(dirs.home),
                          user=identity.uid if identity else None, group=identity.gid if identity else None,
                          extra_groups=() if identity else None)
    return PreparedLaunch(launch, identity, stamp)


class Headstart:
    """A worker launched before the supervisor runs, waiting (its handshake unanswered) to be adopted by the pool.

    ``take`` hands it over if it was launched as asked; ``discard`` kills and reaps it otherwise. Either happens
    exactly once; both are safe to call again.
    """

    def __init__(self, namespace: str, launch: Launch, process: subprocess.Popen[bytes], children: Children) -> None:
        self.namespace = namespace
        self.launch = launch
        self._process: subprocess.Popen[bytes] | None = process
        #: Where it is owned from its start until reaped (its ``PoolConfig``'s): the pool adopting it must use it.
        self.children = children

    @classmethod
    def start(cls, config: PoolConfig, namespace: str, runtime_ahead: Mapping[str, object] | None = None,
              ) -> Headstart | None:
        """Launch ``namespace``'s worker now, as the pool would; None (logged) when that cannot be done here —
        the pool then starts the worker itself, and reports any real problem with a clear error.

        ``runtime_ahead``: what the worker's first task will ask (``runtime``, ``runtime_config``, ``workspace``),
        so that the worker starts that runtime's program at once (``worker._ahead``). It goes to the worker in
        ``RUNTIME_AHEAD_ENV``, outside the launch the pool compares: the worker takes it out of its environment
        before anything reads it, and its task uses that program only if it asks for exactly that launch."""
        if not hasattr(os, "pidfd_open"):  # adoption waits for the process through a pidfd
            return None
        try:
            secure_data_dir(config.data_dir)  # as the supervisor does before anything is made inside
            launch = prepare_launch(config, Namespace.parse(namespace)).launch
            env = dict(launch.env)
            if runtime_ahead is not None:
                env[RUNTIME_AHEAD_ENV] = json.dumps(dict(runtime_ahead))
            with config.children.starting() as own:  # the pool reaps it (``AdoptedProcess``), or ``discard`` does
                process = subprocess.Popen(
                    list(launch.argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    env=env, cwd=launch.cwd, start_new_session=True, user=launch.user,
                    group=launch.group, extra_groups=launch.extra_groups)
                own(process.pid)
        except (OSError, ValueError, UnsafeDataDir) as exc:  # the pool's own start says what is wrong, in context
            log.debug("no headstart for namespace %s: %s", namespace, exc)
            return None
        return cls(namespace, launch, process, config.children)

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def take(self, launch: Launch) -> StartedProcess | None:
        """The process, if it is still unclaimed, alive, and was launched exactly as ``launch``: its pipes, and who
        reaps it; else it is discarded and None returned (the caller starts its own worker)."""
        from codesdk.procs.process import StartedProcess  # only now: it needs trio, which a headstart runs without

        process = self._process
        if process is None:
            return None
        why = ", ".join(self.launch.differences(launch))
        if not why and process.poll() is not None:
            why = "it has exited"
        if not why:
            try:
                taken = StartedProcess.of_popen(process, self.children)
            except OSError as exc:  # no descriptor to take its pipes with
                why = str(exc)
            else:
                self._process = None
                return taken
        log.info("namespace %s: not adopting the worker started ahead (%s); starting another", self.namespace, why)
        self.discard()
        return None

    def discard(self) -> None:
        """Kill the unclaimed worker and everything it started (its own session, where a runtime started ahead
        leads a process group of its own), and reap them."""
        process, self._process = self._process, None
        if process is None:
            return
        from codesdk.procs.orphans import discard  # only now: it needs psutil and trio, which a headstart runs without
        from codesdk.procs.scan import Scans

        for stream in (process.stdin, process.stdout, process.stderr):
            if stream is not None:
                stream.close()
        discard(process, self.children, Scans())
