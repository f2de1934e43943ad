"""One resource group per namespace: the supervisor's side (``ResourceGroups``) and the operator's stored overrides
(``StoredLimits``, ``<data-dir>/namespace-limits.json``).

``<subtree>/ns-<name>/`` carries the namespace's limits; below it ``worker/`` holds its worker and every runtime the
worker starts, and ``exec-<n>/`` one ``workspace.exec`` call each (leaves only: cgroup v2 allows no processes in a
group with children that have controllers). A namespace's group is removed — everything in it killed first — when
its worker ends and no exec call of it runs, so the groups alive are those of namespaces that run something.
"""

from __future__ import annotations

import errno
import itertools
import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from ..namespaces import Namespace, locked, write_private
from ._cgroups import CgroupTree, GroupStats, GroupsUnavailable, Hierarchy, detect
from ._spec import (
    EXEC_PREFIX,
    NAMESPACE_PREFIX,
    WORKER_LEAF,
    GroupLimits,
    LimitError,
    LimitOverrides,
    namespace_group,
    subtree_name,
)

log = logging.getLogger("codesdk.supervisor.groups")

LIMITS_FILE = "namespace-limits.json"
#: Where a running supervisor says which subtree it uses, so that ``namespace limits set`` applies at once.
TREE_FILE = "cgroups.json"


class StoredLimits:
    """The operator's per-namespace overrides, kept in the data dir like the other namespace settings."""

    def __init__(self, data_dir: Path) -> None:
        self.path = Path(data_dir) / LIMITS_FILE

    def all(self) -> dict[str, LimitOverrides]:
        try:
            obj = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise LimitError(f"{self.path} cannot be read ({exc}): fix or remove it") from exc
        if not isinstance(obj, dict):
            raise LimitError(f"{self.path} is not a JSON object: fix or remove it")
        return {name: LimitOverrides.from_json_obj(value) for name, value in obj.items()}

    def get(self, namespace: str) -> LimitOverrides:
        return self.all().get(Namespace.parse(namespace).name, LimitOverrides())

    def set(self, namespace: str, overrides: LimitOverrides) -> LimitOverrides:
        name = Namespace.parse(namespace).name
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)  # set before the service ever ran there
        with locked(self.path.with_suffix(".lock")):
            every = self.all()
            merged = every.get(name, LimitOverrides()).merged(overrides)
            every[name] = merged
            write_private(self.path, json.dumps({k: v.to_json_obj() for k, v in sorted(every.items())}, indent=1))
        return merged


@dataclass
class _Namespace:
    execs: int = 0
    workers: set[str] = field(default_factory=set)  # the leaves its workers run in
    missing: list[str] = field(default_factory=list)


class ResourceGroups:
    """The supervisor's subtree and its namespaces' groups; ``available`` False (and ``reason`` saying why) where
    none can be created: then every method is a no-op and nothing bounds a namespace as a whole."""

    def __init__(self, data_dir: Path, defaults: GroupLimits | None = None, tree: CgroupTree | None = None,
                 reason: str | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.defaults = defaults or GroupLimits()
        self.tree = tree
        self.reason = reason
        self.stored = StoredLimits(self.data_dir)
        self._namespaces: dict[str, _Namespace] = {}
        self._calls = itertools.count(1)
        #: Held while a namespace's group is made, joined, emptied or removed (these run in worker threads): an
        #: exec call's leaf is never made in a group being removed, nor a group removed under a call's leaf.
        self._lock = threading.RLock()

    @classmethod
    def open(cls, data_dir: Path, defaults: GroupLimits | None = None, *, enabled: bool = True) -> ResourceGroups:
        """Detect what the host offers, create the subtree (emptied: whatever a crashed run left in it is killed)
        and say where it is; one log line when no group can be created, and why."""
        if not enabled:
            return cls(data_dir, defaults, reason="resource groups are switched off (serve --no-resource-groups)")
        try:
            tree = detect(str(Path(data_dir).resolve()))
            if os.geteuid() != 0 and tree.delegated is None:
                raise GroupsUnavailable("the supervisor is not root, and no cgroup v2 group is delegated to it "
                                        "(systemd: Delegate=yes)")
            tree.prepare()
            for child in tree.children():
                if child.startswith(NAMESPACE_PREFIX):
                    log.warning("resource groups: emptying %s left by an earlier run", child)
                    tree.remove(child)
        except (GroupsUnavailable, OSError) as exc:
            why = str(exc) if isinstance(exc, GroupsUnavailable) else f"the cgroup file system refused: {exc}"
            log.warning("no per-namespace resource groups: %s; only exec's per-uid process cap (RLIMIT_NPROC) "
                        "bounds a namespace", why)
            return cls(data_dir, defaults, reason=why)
        try:
            write_private(Path(data_dir) / TREE_FILE, json.dumps(
                {**tree.to_json_obj(), "defaults": (defaults or GroupLimits()).to_json_obj()}))
        except OSError as exc:
            log.warning("resource groups: %s could not be written (%s): `namespace limits set` applies to a "
                        "namespace's next worker only", Path(data_dir) / TREE_FILE, exc)
        log.info("resource groups: %s", tree.describe())
        return cls(data_dir, defaults, tree)

    @property
    def available(self) -> bool:
        return self.tree is not None

    def describe(self) -> dict[str, object]:
        """For ``/readyz``: where the groups are, or why there are none (a degraded mode, not unready)."""
        if self.tree is None:
            return {"enforced": False, "reason": self.reason}
        return {"enforced": True, "cgroup": f"v{self.tree.version}",
                "controllers": sorted(self.tree.controllers),
                "not_bounded": sorted({m for ns in self._namespaces.values() for m in ns.missing}),
                "defaults": self.defaults.to_json_obj()}

    def limits_for(self, namespace: str) -> GroupLimits:
        try:
            return self.defaults.with_overrides(self.stored.get(namespace))
        except LimitError as exc:
            log.error("namespace %s: stored limits ignored: %s", namespace, exc)
            return self.defaults

    def _ensure(self, namespace: str) -> tuple[CgroupTree, str] | None:
        if self.tree is None:
            return None
        rel = namespace_group(namespace)
        state = self._namespaces.setdefault(namespace, _Namespace())
        self.tree.create(rel)
        state.missing = self.tree.apply(rel, self.limits_for(namespace))
        return self.tree, rel

    def place_worker(self, namespace: str, pid: int, leaf: str = WORKER_LEAF) -> None:
        """Put a namespace's worker — and whatever it started already (a headstart's runtime) — into its group.
        Called before the worker is sent anything, so no runtime of it starts outside the group. ``leaf``: the
        worker's own leaf (a session's own worker — ephemeral or shared isolation — has one beside ``worker/``,
        so that its end empties only its own)."""
        with self._lock:
            found = self._ensure(namespace)
            if found is None:
                return
            tree, rel = found
            self._namespaces[namespace].workers.add(leaf)
            leaf = f"{rel}/{leaf}"
            tree.create(leaf)
            tree.move(leaf, pid)
        try:
            for child in psutil.Process(pid).children(recursive=True):
                tree.move(leaf, child.pid)
        except psutil.Error:
            pass

    def worker_ended(self, namespace: str, leaf: str = WORKER_LEAF) -> None:
        """Kill everything left in the worker's group (a daemon that escaped its tree too); the namespace's group
        goes when no exec call of it runs."""
        try:
            with self._lock:
                state = self._namespaces.get(namespace)
                if self.tree is None or state is None:
                    return
                state.workers.discard(leaf)
                self.tree.remove(f"{namespace_group(namespace)}/{leaf}")
                self._maybe_remove(namespace, state)
        except OSError as exc:  # the worker's exit must still be reported; the next start empties it again
            log.error("namespace %s: its resource group could not be emptied: %s", namespace, exc)

    def open_exec(self, namespace: str) -> tuple[str, list[Path]]:
        """A fresh leaf group of the namespace for one exec call: (its name, the ``cgroup.procs`` files the command
        writes itself into before it runs anything). ``close_exec`` removes it."""
        with self._lock:
            found = self._ensure(namespace)
            if found is None:
                return "", []
            tree, rel = found
            leaf = f"{rel}/{EXEC_PREFIX}{next(self._calls)}"
            self._namespaces[namespace].execs += 1
            try:
                tree.create(leaf)
            except OSError:
                self.close_exec(namespace, leaf)
                raise
            return leaf, tree.join_files(leaf)

    def close_exec(self, namespace: str, leaf: str) -> None:
        """Kill everything left in the call's leaf (a daemon it started too), and remove it."""
        with self._lock:
            state = self._namespaces.get(namespace)
            if self.tree is None or state is None or not leaf:
                return
            state.execs -= 1
            self.tree.remove(leaf)
            self._maybe_remove(namespace, state)

    def _maybe_remove(self, namespace: str, state: _Namespace) -> None:
        if self.tree is not None and not state.workers and state.execs == 0:
            if self.tree.remove(namespace_group(namespace)):
                self._namespaces.pop(namespace, None)

    def stats(self) -> dict[str, tuple[GroupStats, GroupLimits]]:
        """Each live namespace group's usage and limits (for /metrics: one label per namespace that runs)."""
        if self.tree is None:
            return {}
        out = {}
        with self._lock:
            live = list(self._namespaces)
        for namespace in live:
            rel = namespace_group(namespace)
            if self.tree.exists(rel):
                out[namespace] = (self.tree.stats(rel), self.limits_for(namespace))
        return out

    def close(self) -> None:
        """Kill everything in the subtree and remove it (the supervisor is ending)."""
        if self.tree is None:
            return
        for child in self.tree.children():
            self.tree.remove(child)
        self._namespaces.clear()
        for hierarchy in self.tree.hierarchies:
            try:
                _rmdir_when_empty(hierarchy.base)
            except OSError as exc:
                log.warning("resource groups: %s could not be removed: %s", hierarchy.base, exc)
        try:
            (self.data_dir / TREE_FILE).unlink()
        except FileNotFoundError:
            pass


def service_defaults(data_dir: Path) -> GroupLimits:
    """The defaults a running (or the last) supervisor of ``data_dir`` was started with; the built-in ones if none
    is recorded."""
    try:
        return GroupLimits(**json.loads((Path(data_dir) / TREE_FILE).read_text())["defaults"])
    except (OSError, ValueError, KeyError, TypeError):
        return GroupLimits()


def _rmdir_when_empty(path: Path, guard_s: float = 10.0) -> None:
    """Remove an emptied group; its last processes may still be exiting (EBUSY) for a moment."""
    deadline = time.monotonic() + guard_s
    while True:
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def _recorded(data_dir: Path) -> tuple[CgroupTree, GroupLimits] | None:
    """The subtree a supervisor of ``data_dir`` recorded (``TREE_FILE``), if it is that data dir's own name."""
    try:
        obj = json.loads((Path(data_dir) / TREE_FILE).read_text())
        hierarchies = tuple(Hierarchy(frozenset(h["controllers"]), Path(h["base"])) for h in obj["hierarchies"])
        tree = CgroupTree(int(obj["version"]), hierarchies)
        defaults = GroupLimits(**obj["defaults"])
    except (OSError, KeyError, TypeError, ValueError):
        return None
    expected = subtree_name(str(Path(data_dir).resolve()))
    if not hierarchies or any(h.base.name != expected for h in hierarchies):  # never a group not ours
        return None
    return tree, defaults


def remove_left(data_dir: Path) -> bool:
    """Kill and remove the subtree a supervisor of ``data_dir`` left behind (it was SIGKILLed: nothing closed it).
    True if there was one."""
    found = _recorded(data_dir)
    if found is None:
        return False
    tree, _ = found
    for child in tree.children():
        tree.remove(child)
    for hierarchy in tree.hierarchies:
        _rmdir_when_empty(hierarchy.base)
    (Path(data_dir) / TREE_FILE).unlink(missing_ok=True)
    return True


def apply_stored(data_dir: Path, namespace: str) -> str | None:
    """For ``namespace limits set``: write the namespace's limits on the group a running supervisor of ``data_dir``
    has for it now. Returns where they were applied (None: no running group; the next start applies them)."""
    found = _recorded(data_dir)
    if found is None:
        return None
    tree, defaults = found
    rel = namespace_group(namespace)
    if not tree.exists(rel):
        return None
    tree.apply(rel, defaults.with_overrides(StoredLimits(data_dir).get(namespace)))
    return str(tree.hierarchies[0].base / rel)
