"""Resource groups: one cgroup per namespace holding its worker, every runtime it starts and every exec sandbox,
with limits on processes, memory (tmpfs pages its processes write included), CPU weight and IO weight.

``_spec`` (sans-IO: limits, sizes, ``/proc/self/cgroup``, names), ``_cgroups`` (the kernel's files: v2 or v1),
``_groups`` (the supervisor's side: ``ResourceGroups``, and ``StoredLimits``, the operator's overrides). Other
packages import this face only.
"""

from ._cgroups import CgroupTree, GroupStats, GroupsUnavailable, detect
from ._groups import LIMITS_FILE, TREE_FILE, ResourceGroups, StoredLimits, apply_stored, remove_left, service_defaults
from ._spec import (
    DEFAULT_MEMORY,
    DEFAULT_PIDS,
    DEFAULT_WEIGHT,
    GroupLimits,
    LimitError,
    LimitOverrides,
    format_size,
    namespace_group,
    parse_proc_cgroup,
    parse_size,
    subtree_name,
)

__all__ = [
    "DEFAULT_MEMORY",
    "DEFAULT_PIDS",
    "DEFAULT_WEIGHT",
    "LIMITS_FILE",
    "TREE_FILE",
    "CgroupTree",
    "GroupLimits",
    "GroupStats",
    "GroupsUnavailable",
    "LimitError",
    "LimitOverrides",
    "ResourceGroups",
    "StoredLimits",
    "apply_stored",
    "detect",
    "format_size",
    "namespace_group",
    "parse_proc_cgroup",
    "parse_size",
    "remove_left",
    "service_defaults",
    "subtree_name",
]
