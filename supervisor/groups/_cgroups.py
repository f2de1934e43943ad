"""The kernel's cgroups, read and written directly (no well-kept Python library does this): the hierarchies this
host offers the supervisor, and one subtree of the project's own in them.

cgroup v2 where the unified hierarchy has the controllers in the supervisor's own group (the root of a container's
cgroup namespace, or a group delegated to the service: ``Delegate=yes`` with the controllers enabled in its
``cgroup.subtree_control``); else the v1 controllers that are mounted (``pids``, ``memory``, ``cpu``/``cpuacct``,
``blkio``). Every group is created below the supervisor's own group of each hierarchy (``/proc/self/cgroup``), in
``codesdk-<hash of the data dir>``; nothing outside that subtree is ever written.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from ._spec import (
    GroupLimits,
    parse_proc_cgroup,
    subtree_name,
    v1_blkio_weight,
    v1_cpu_shares,
)

log = logging.getLogger("codesdk.supervisor.groups")

#: The v1 controllers used, and what each bounds or measures.
V1_CONTROLLERS = ("pids", "memory", "cpu", "cpuacct", "blkio")
#: The v2 controllers a subtree needs (``io`` is used where offered).
V2_REQUIRED = ("pids", "memory")
V2_WANTED = ("pids", "memory", "cpu", "io")
#: v2, in a group delegated to the service: the leaf the supervisor moves itself into.
SUPERVISOR_LEAF = "codesdk-supervisor"
#: Rounds of "kill every member" before giving up on a group that keeps refilling (a pids-capped group cannot).
KILL_ROUNDS = 1000
#: Seconds an emptied group may stay busy (its last processes exiting) before its removal is given up.
REMOVE_GUARD_S = 10.0


class GroupsUnavailable(Exception):
    """No group can be created here; the message says why (read by operators at start-up and in /readyz)."""


@dataclass(frozen=True)
class Hierarchy:
    controllers: frozenset[str]
    base: Path  # the supervisor's subtree in this hierarchy

    def has(self, controller: str) -> bool:
        return controller in self.controllers


@dataclass(frozen=True)
class GroupStats:
    processes: int
    memory_bytes: int
    cpu_seconds: float
    pids_limit_hits: int
    memory_limit_hits: int
    oom_kills: int


@dataclass(frozen=True)
class _Mount:
    point: Path
    fstype: str
    options: frozenset[str]


def _mounts(text: str) -> list[_Mount]:
    mounts = []
    for line in text.splitlines():
        before, sep, after = line.partition(" - ")
        fields, rest = before.split(), after.split()
        if not sep or len(fields) < 5 or len(rest) < 3:
            continue
        point = fields[4].replace("\\040", " ")
        mounts.append(_Mount(Path(point), rest[0], frozenset(rest[2].split(","))))
    return mounts


class CgroupTree:
    """The supervisor's subtree, in one v2 hierarchy or several v1 ones. Paths below it are ``rel``s such as
    ``ns-user.alice/worker``."""

    def __init__(self, version: int, hierarchies: tuple[Hierarchy, ...], delegated: Path | None = None) -> None:
        self.version = version
        self.hierarchies = hierarchies
        #: v2: the group delegated to the service that the supervisor itself is in (None: its controllers are
        #: enabled already, e.g. the root of a container's cgroup namespace).
        self.delegated = delegated

    def prepare(self) -> None:
        """Create the subtree. v2: the controllers are enabled for its children (and, in a delegated group, the
        supervisor first moves itself into a leaf of its own there: v2 allows no processes in a group whose
        children have controllers)."""
        if self.delegated is not None:
            leaf = self.delegated / SUPERVISOR_LEAF
            leaf.mkdir(exist_ok=True)
            (leaf / "cgroup.procs").write_text(str(os.getpid()))
            _enable(self.delegated, self.controllers)
        for hierarchy in self.hierarchies:
            hierarchy.base.mkdir(exist_ok=True)
            if self.version == 2:
                _enable(hierarchy.base, hierarchy.controllers)

    def create(self, rel: str) -> None:
        for hierarchy in self.hierarchies:
            self._dir(hierarchy, rel).mkdir(exist_ok=True)

    @property
    def controllers(self) -> frozenset[str]:
        return frozenset().union(*(h.controllers for h in self.hierarchies))

    def describe(self) -> str:
        return (f"cgroup v{self.version} ({', '.join(sorted(self.controllers))}) under "
                + ", ".join(str(h.base) for h in self.hierarchies))

    def to_json_obj(self) -> dict[str, object]:
        return {"version": self.version, "hierarchies": [
            {"controllers": sorted(h.controllers), "base": str(h.base)} for h in self.hierarchies]}

    def _dir(self, hierarchy: Hierarchy, rel: str) -> Path:
        return hierarchy.base / rel if rel else hierarchy.base

    def _of(self, controller: str) -> Hierarchy | None:
        return next((h for h in self.hierarchies if h.has(controller)), None)

    # -- writing ----------------------------------------------------------------------------------------------

    def exists(self, rel: str) -> bool:
        return all(self._dir(h, rel).is_dir() for h in self.hierarchies)

    def apply(self, rel: str, limits: GroupLimits) -> list[str]:
        """Write ``limits`` on the group; returns what this host could not bound (e.g. no IO weight)."""
        missing: list[str] = []
        writes: list[tuple[str, str, str]] = []
        if self.version == 2:
            writes = [("pids", "pids.max", str(limits.pids)), ("memory", "memory.max", str(limits.memory)),
                      ("memory", "memory.swap.max", "0"), ("cpu", "cpu.weight", str(limits.cpu_weight)),
                      ("io", "io.weight", f"default {limits.io_weight}")]
        else:
            writes = [("pids", "pids.max", str(limits.pids)),
                      ("memory", "memory.limit_in_bytes", str(limits.memory)),
                      ("cpu", "cpu.shares", str(v1_cpu_shares(limits.cpu_weight))),
                      ("blkio", "blkio.weight", str(v1_blkio_weight(limits.io_weight)))]
        for controller, name, value in writes:
            hierarchy = self._of(controller)
            path = self._dir(hierarchy, rel) / name if hierarchy is not None else None
            if path is None or not path.exists():
                if name != "memory.swap.max":
                    missing.append(name)
                continue
            path.write_text(value)
        return missing

    def join_files(self, rel: str) -> list[Path]:
        """The ``cgroup.procs`` files a process writes itself into to join the group (one per hierarchy)."""
        return [self._dir(h, rel) / "cgroup.procs" for h in self.hierarchies]

    def move(self, rel: str, pid: int) -> None:
        """Move ``pid`` into the group (ProcessLookupError-like ESRCH: it is gone, which is fine)."""
        for path in self.join_files(rel):
            try:
                path.write_text(str(pid))
            except ProcessLookupError:
                return

    def members(self, rel: str) -> set[int]:
        """Every process in the group and below it, in any hierarchy."""
        pids: set[int] = set()
        for hierarchy in self.hierarchies:
            top = self._dir(hierarchy, rel)
            for directory, _, _ in os.walk(top):
                try:
                    pids.update(int(line) for line in (Path(directory) / "cgroup.procs").read_text().split())
                except (FileNotFoundError, ProcessLookupError):
                    continue
        return pids

    def kill(self, rel: str) -> bool:
        """SIGKILL everything in the group and below it until it is empty; True when it is. v2: ``cgroup.kill``
        (atomic); v1: kill every member, again, until none is left (a pids-capped fork bomb cannot outgrow it)."""
        if not self.exists(rel):
            return True
        kill_file = self._dir(self.hierarchies[0], rel) / "cgroup.kill"
        if self.version == 2 and kill_file.exists():
            kill_file.write_text("1")
        for _ in range(KILL_ROUNDS):
            pids = self.members(rel)
            if not pids:
                return True
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            os.sched_yield()
        return not self.members(rel)

    def remove(self, rel: str) -> bool:
        """Kill what is in the group, then remove it and its children (deepest first). True when it is gone; a
        group whose last members are still exiting (EBUSY) stays, and is emptied again by the next attempt."""
        if not self.kill(rel):
            log.error("cgroup %s: processes kept appearing after %d rounds of SIGKILL", rel, KILL_ROUNDS)
        gone = True
        for hierarchy in self.hierarchies:
            top = self._dir(hierarchy, rel)
            if not top.is_dir():
                continue
            for directory, _, _ in sorted(os.walk(top), key=lambda entry: -len(Path(entry[0]).parts)):
                deadline = time.monotonic() + REMOVE_GUARD_S
                while True:
                    try:
                        os.rmdir(directory)
                        break
                    except FileNotFoundError:
                        break
                    except OSError as exc:  # EBUSY: its last processes are still exiting
                        if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                            log.warning("cgroup %s could not be removed: %s", directory, exc)
                            gone = False
                            break
                        self.kill(rel)
                        time.sleep(0.001)
        return gone

    def children(self) -> list[str]:
        """The groups directly below the subtree (namespaces' groups)."""
        top = self.hierarchies[0].base
        try:
            return sorted(entry.name for entry in top.iterdir() if entry.is_dir())
        except FileNotFoundError:
            return []

    # -- reading ----------------------------------------------------------------------------------------------

    def stats(self, rel: str) -> GroupStats:
        def read(controller: str, name: str) -> str:
            hierarchy = self._of(controller)
            if hierarchy is None:
                return ""
            try:
                return (self._dir(hierarchy, rel) / name).read_text()
            except OSError:
                return ""

        def keyed(text: str, key: str) -> int:
            for line in text.splitlines():
                parts = line.split()
                if len(parts) == 2 and parts[0] == key and parts[1].isdigit():
                    return int(parts[1])
            return 0

        def number(text: str) -> int:
            text = text.strip()
            return int(text) if text.isdigit() else 0

        processes = number(read("pids", "pids.current"))
        pids_hits = keyed(read("pids", "pids.events"), "max")
        if self.version == 2:
            events = read("memory", "memory.events")
            return GroupStats(processes, number(read("memory", "memory.current")),
                              keyed(read("cpu", "cpu.stat"), "usage_usec") / 1e6, pids_hits,
                              keyed(events, "max"), keyed(events, "oom_kill"))
        return GroupStats(processes, number(read("memory", "memory.usage_in_bytes")),
                          number(read("cpuacct", "cpuacct.usage")) / 1e9, pids_hits,
                          number(read("memory", "memory.failcnt")),
                          keyed(read("memory", "memory.oom_control"), "oom_kill"))


def _enable(group: Path, controllers: frozenset[str]) -> None:
    """Enable ``controllers`` for the children of ``group`` (one of ours), those it does not have yet."""
    control = group / "cgroup.subtree_control"
    try:
        enabled = set(control.read_text().split())
    except FileNotFoundError:
        enabled = set()
    missing = sorted(controllers - enabled)
    if missing:
        control.write_text(" ".join(f"+{c}" for c in missing))


def _delegated_to_us(group: Path) -> bool:
    """The group is ours to shape: we may write its ``cgroup.subtree_control`` and only we are in it."""
    try:
        members = {int(pid) for pid in (group / "cgroup.procs").read_text().split()}
    except (OSError, ValueError):
        return False
    return os.access(group / "cgroup.subtree_control", os.W_OK) and members <= {os.getpid()}


def detect(data_dir: str, *, proc_cgroup: str | None = None, mountinfo: str | None = None) -> CgroupTree:
    """The subtree this supervisor may use for ``data_dir`` (not created yet), or ``GroupsUnavailable`` saying why."""
    own = parse_proc_cgroup(proc_cgroup if proc_cgroup is not None else Path("/proc/self/cgroup").read_text())
    mounts = _mounts(mountinfo if mountinfo is not None else Path("/proc/self/mountinfo").read_text())
    name = subtree_name(data_dir)
    v2_why = "no cgroup2 hierarchy is mounted"
    for mount in mounts:
        if mount.fstype != "cgroup2" or "" not in own:
            continue
        group = mount.point / own[""].lstrip("/")
        try:
            offered = set((group / "cgroup.controllers").read_text().split())
            enabled = set((group / "cgroup.subtree_control").read_text().split())
        except OSError as exc:
            v2_why = f"the cgroup2 hierarchy at {mount.point} cannot be read ({exc.strerror})"
            continue
        lacking = [c for c in V2_REQUIRED if c not in enabled]
        if not lacking:
            return CgroupTree(2, (Hierarchy(frozenset(c for c in V2_WANTED if c in enabled), group / name),))
        if set(lacking) <= offered and own[""] != "/" and _delegated_to_us(group):
            # A group delegated to the service (systemd Delegate=yes) holding only us: we move into a leaf of our
            # own there and enable the controllers for its children (``CgroupTree.prepare``).
            wanted = frozenset(c for c in V2_WANTED if c in offered)
            return CgroupTree(2, (Hierarchy(wanted, group / name),), delegated=group)
        v2_why = (f"the cgroup2 hierarchy at {mount.point} has {', '.join(lacking)} "
                  + ("not enabled in this supervisor's group " if set(lacking) <= offered else "not offered to ")
                  + f"{own['']} (delegate it to the service: systemd Delegate=yes, with nothing else in its group)")
        break
    hierarchies: dict[Path, set[str]] = {}
    seen: set[str] = set()
    for mount in mounts:
        if mount.fstype != "cgroup":
            continue
        for controller in V1_CONTROLLERS:
            if controller in mount.options and controller in own and controller not in seen:
                seen.add(controller)
                hierarchies.setdefault(mount.point / own[controller].lstrip("/") / name, set()).add(controller)
    found = set().union(*hierarchies.values()) if hierarchies else set()
    if not {"pids", "memory"} <= found:
        raise GroupsUnavailable(f"{v2_why}, and the v1 pids and memory controllers are not both mounted")
    return CgroupTree(1, tuple(Hierarchy(frozenset(c), base) for base, c in hierarchies.items()))
