"""Credential namespaces: validated names, their private directories, and worker environments.

A namespace (``default``, ``user:<id>``, ``ci:<job>``) owns ``<data-dir>/namespaces/<safe-name>/`` (mode 0700)
with home/, config/, state/, cache/, data/, tmp/. A worker's environment is built from scratch from
those paths plus what the operator configured — never the supervisor's whole environment — so one
tenant's OAuth caches and tokens can't leak into another's runtime.

By default every worker runs as the supervisor's own uid: one trust domain, where 0700 keeps other local users
out but does not separate the tenants from each other. With a worker uid range (``UidRange``,
``--worker-uids START:COUNT``) each namespace is given its own uid+gid from the range (``namespace_identity``,
persisted in ``<data-dir>/worker-uids.json`` and never reused), its directories are owned by that uid, and
``<data-dir>`` and ``namespaces/`` become 0711 so a worker can reach its own home by name and nothing else.

One job per module: ``_names`` (the grammar), ``_dirs`` (the namespace's directories, opened through
``supervisor._safe_dirs``), ``_env`` (the worker's environment), ``_uids`` (the range, each namespace's identity,
handing files to it), ``_uid_checks`` (start-up checks for a range), ``_data_dir`` (the data dir's own modes),
``_workspaces`` (which workspaces are allowed, handing one to a namespace).
"""

from ._data_dir import UnsafeDataDir, secure_data_dir, tighten_data_dir
from ._dirs import SUBDIRS, NamespaceDirs, prepare_dirs, prepare_namespace
from ._env import DEFAULT_PATH, RECORD_STREAMS_ENV, RUNTIME_AHEAD_ENV, build_env
from ._names import InvalidNamespace, Namespace
from ._uid_checks import check_can_switch_uids, check_reachable_by_workers
from ._uids import UIDS_FILE, Identity, UidRange, UidRangeError, namespace_identity
from ._workspaces import WorkspaceRefused, check_workspace, give_workspace, make_workspace

__all__ = [
    "DEFAULT_PATH",
    "RECORD_STREAMS_ENV",
    "RUNTIME_AHEAD_ENV",
    "SUBDIRS",
    "UIDS_FILE",
    "Identity",
    "InvalidNamespace",
    "Namespace",
    "NamespaceDirs",
    "UidRange",
    "UidRangeError",
    "UnsafeDataDir",
    "WorkspaceRefused",
    "build_env",
    "check_can_switch_uids",
    "check_reachable_by_workers",
    "check_workspace",
    "give_workspace",
    "make_workspace",
    "namespace_identity",
    "prepare_dirs",
    "prepare_namespace",
    "secure_data_dir",
    "tighten_data_dir",
]
