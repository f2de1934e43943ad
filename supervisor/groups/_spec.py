"""Sans-IO pieces of the resource groups: what a namespace is limited to, sizes as people write them, the lines of
``/proc/<pid>/cgroup``, the names of the project's own groups, and how a weight maps onto cgroup v1's files.

Pure functions of their arguments (no files, no ``os``), property-tested in ``tests/groups/test_spec.py``.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, fields, replace
from typing import Self

#: Processes one namespace may hold at once by default: far below any host's pid_max (32768 at least here).
DEFAULT_PIDS = 512
#: Memory one namespace may use by default, tmpfs pages its processes write included.
DEFAULT_MEMORY = 2 * 1024**3
#: cgroup v2's weight range and default (cpu.weight, io.weight).
WEIGHT_MIN, WEIGHT_MAX, DEFAULT_WEIGHT = 1, 10_000, 100
#: The supervisor's subtree: ``codesdk-<hash of its data dir>``; a namespace's group below it: ``ns-<safe name>``.
SUBTREE_PREFIX = "codesdk-"
NAMESPACE_PREFIX = "ns-"
#: The leaf a namespace's worker (and every runtime it starts) lives in; each exec call gets ``exec-<n>``.
WORKER_LEAF = "worker"
EXEC_PREFIX = "exec-"

_SIZE = re.compile(r"^\s*(\d+)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}
_SAFE = re.compile(r"[^A-Za-z0-9_.@-]")


class LimitError(ValueError):
    """A limit that cannot be used (not a number, out of range); the message says which and what is allowed."""


def parse_size(text: str) -> int:
    """Bytes from ``1048576``, ``64M``, ``64MiB``, ``2G``, ``2GiB`` (binary units, case-insensitive)."""
    match = _SIZE.fullmatch(text)
    if match is None:
        raise LimitError(f"invalid size {text!r}: use bytes or a number with K, M, G or T (e.g. 512M, 2G)")
    value = int(match.group(1)) * _UNITS[match.group(2).lower()]
    if value <= 0:
        raise LimitError(f"invalid size {text!r}: it must be more than 0")
    return value


def format_size(value: int) -> str:
    """The shortest exact binary-unit spelling of ``value`` bytes (``parse_size`` reads it back)."""
    for unit in ("T", "G", "M", "K"):
        if value % _UNITS[unit.lower()] == 0:
            return f"{value // _UNITS[unit.lower()]}{unit}"
    return str(value)


@dataclass(frozen=True)
class GroupLimits:
    """What one namespace's group is limited to (every process of its worker, its runtimes and its exec calls)."""

    pids: int = DEFAULT_PIDS
    memory: int = DEFAULT_MEMORY
    cpu_weight: int = DEFAULT_WEIGHT
    io_weight: int = DEFAULT_WEIGHT

    def __post_init__(self) -> None:
        if not 1 <= self.pids <= 4_194_304:
            raise LimitError(f"invalid process limit {self.pids}: use 1 to 4194304")
        if self.memory < 4 * 1024**2:
            raise LimitError(f"invalid memory limit {self.memory}: use at least 4M")
        for name, weight in (("CPU", self.cpu_weight), ("IO", self.io_weight)):
            if not WEIGHT_MIN <= weight <= WEIGHT_MAX:
                raise LimitError(f"invalid {name} weight {weight}: use {WEIGHT_MIN} to {WEIGHT_MAX} "
                                 f"(default {DEFAULT_WEIGHT})")

    def with_overrides(self, overrides: LimitOverrides) -> GroupLimits:
        return replace(self, **{f.name: getattr(overrides, f.name) for f in fields(overrides)
                                if getattr(overrides, f.name) is not None})

    def to_json_obj(self) -> dict[str, int]:
        return {"pids": self.pids, "memory": self.memory, "cpu_weight": self.cpu_weight,
                "io_weight": self.io_weight}


@dataclass(frozen=True)
class LimitOverrides:
    """An operator's overrides for one namespace (``namespace limits set``); None: the service's default."""

    pids: int | None = None
    memory: int | None = None
    cpu_weight: int | None = None
    io_weight: int | None = None

    def merged(self, newer: LimitOverrides) -> LimitOverrides:
        return replace(self, **{f.name: getattr(newer, f.name) for f in fields(newer)
                                if getattr(newer, f.name) is not None})

    def to_json_obj(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    @classmethod
    def from_json_obj(cls, obj: object) -> Self:
        if not isinstance(obj, dict) or set(obj) - {f.name for f in fields(cls)}:
            raise LimitError(f"invalid stored limits {obj!r}")
        values = {key: value for key, value in obj.items() if value is not None}
        if any(not isinstance(value, int) or isinstance(value, bool) for value in values.values()):
            raise LimitError(f"invalid stored limits {obj!r}: every value must be an integer")
        GroupLimits().with_overrides(cls(**values))  # validated as a whole
        return cls(**values)


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """``/proc/<pid>/cgroup`` as {controller: path}: each v1 controller of a line (``4:memory:/a``, ``2:cpu,cpuacct:/``)
    by its name, a named hierarchy as ``name=…``, the v2 hierarchy (``0::/b``) as ``""``. Malformed lines are
    skipped (the file is the kernel's; a future format must not stop the supervisor)."""
    groups: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3 or not parts[0].isdigit() or not parts[2].startswith("/"):
            continue
        for controller in parts[1].split(",") if parts[1] else [""]:
            groups.setdefault(controller, parts[2])
    return groups


def subtree_name(data_dir: str) -> str:
    """The supervisor's own subtree for this data dir: a restart with the same data dir finds (and empties) it."""
    return SUBTREE_PREFIX + hashlib.sha256(data_dir.encode()).hexdigest()[:12]


def namespace_group(namespace: str) -> str:
    """``ns-<name>``: ':' becomes '.' (as the namespace's directory), anything else outside the grammar '_'."""
    return NAMESPACE_PREFIX + _SAFE.sub("_", namespace.replace(":", ".", 1))


def v1_cpu_shares(weight: int) -> int:
    """cgroup v1 ``cpu.shares`` for a v2 ``cpu.weight``: the default 100 maps to the default 1024."""
    return max(2, min(262_144, weight * 1024 // DEFAULT_WEIGHT))


def v1_blkio_weight(weight: int) -> int:
    """cgroup v1 ``blkio.weight`` (10-1000, default 500) for a v2 ``io.weight`` (1-10000, default 100)."""
    return max(10, min(1000, weight * 5))
