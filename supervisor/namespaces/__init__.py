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

Each namespace's own variables (API keys, base URLs) are kept beside the event store, never shown again
(``NamespaceVariables``: ``NamespaceEnv``'s files in the data dir, or with a PostgreSQL store the database, encrypted
under the deployment's secret key); so are its limits and quarantines (``open_namespace_state`` picks where).

One job per module: ``_names`` (the grammar), ``_files`` (the supervisor's private files, and directories a tenant
may shape, opened without following symlinks: also for the workspace tools), ``_dirs`` (the namespace's
directories), ``_env`` (the worker's environment), ``_variables`` (the stored variables), ``_uids`` (the range,
each namespace's identity, handing files to it), ``_uid_checks`` (start-up checks for a range), ``_data_dir`` (the
data dir's own modes), ``_sessions`` (an ephemeral session's own HOME, the operator's for the shared level), ``_disk`` (each namespace's disk quota: an ext4 image of its own), ``_workspaces`` (which workspaces are allowed, handing one to a namespace), ``_egress`` (its narrowing of
``http.fetch``'s hosts), ``_limits`` (where limits are kept), ``_quarantines``, ``_secret_key`` (the deployment key,
AES-GCM), ``_pg_state`` (all of these in the shared PostgreSQL database), ``_state`` (choosing, importing, rotating). Other packages
import this face only.
"""

from ._data_dir import UnsafeDataDir, secure_data_dir, tighten_data_dir
from ._disk import (
    DISK_QUOTAS_FILE,
    VOLUMES_DIR,
    DiskQuota,
    DiskQuotaError,
    DiskUsage,
    NamespaceDisks,
    disk_unsupported,
    is_disk_full,
)
from ._budgets import (
    BUDGETS_FILE,
    NamespaceBudgetError,
    NamespaceBudgets,
    check_monthly_usd,
    month_of,
    next_month_start,
)
from ._egress import EGRESS_FILE, MAX_NAMESPACE_PATTERNS, NamespaceEgress, NamespaceEgressError
from ._dirs import SUBDIRS, NamespaceDirs, prepare_dirs, prepare_namespace
from ._sessions import (
    EPHEMERAL_DIR,
    ephemeral_root,
    ephemeral_sessions,
    operator_dirs,
    prepare_session_dirs,
    remove_session_dirs,
)
from ._env import DEFAULT_PATH, RECORD_STREAMS_ENV, RUNTIME_AHEAD_ENV, build_env
from ._files import DIR_FLAGS, WALK_FLAGS, chmod_entry, locked, make_dir, open_dir, walk_tree, write_private
from ._names import InvalidNamespace, Namespace
from ._uid_checks import check_can_switch_uids, check_reachable_by_workers
from ._uids import UIDS_FILE, Identity, UidRange, UidRangeError, hand_over, namespace_identity
from ._variables import (
    ENV_DIR,
    MAX_VALUE_BYTES,
    MAX_VARIABLES,
    EnvEntry,
    NamespaceEnv,
    NamespaceEnvError,
    NamespaceVariables,
)
from ._limits import BUDGET, DISK, EGRESS, JsonLimitFile, LimitTable, LimitTableUnreadable
from ._pg_errors import NamespaceStateUnavailable
from ._quarantines import MemoryQuarantines, QuarantineRecord, Quarantines
from ._secret_key import (
    KEY_ENV,
    OLD_KEYS_ENV,
    KeyNotHeld,
    SecretKey,
    SecretKeyError,
    UndecryptableVariable,
    load_old_keys,
    load_secret_key,
    read_key_file,
    require_secret_key,
)
from ._state import (
    ImportReport,
    NamespaceState,
    check_keys_held,
    RotationReport,
    import_namespace_state,
    open_namespace_state,
    rotate_secret_key,
)
from ._workspaces import WorkspaceRefused, check_workspace, give_workspace, make_workspace

__all__ = [
    "BUDGET",
    "DISK",
    "EGRESS",
    "ImportReport",
    "JsonLimitFile",
    "KEY_ENV",
    "KeyNotHeld",
    "OLD_KEYS_ENV",
    "LimitTable",
    "LimitTableUnreadable",
    "MemoryQuarantines",
    "NamespaceState",
    "NamespaceStateUnavailable",
    "NamespaceVariables",
    "QuarantineRecord",
    "Quarantines",
    "RotationReport",
    "SecretKey",
    "SecretKeyError",
    "UndecryptableVariable",
    "import_namespace_state",
    "check_keys_held",
    "load_old_keys",
    "load_secret_key",
    "open_namespace_state",
    "read_key_file",
    "require_secret_key",
    "rotate_secret_key",
    "BUDGETS_FILE",
    "NamespaceBudgetError",
    "NamespaceBudgets",
    "check_monthly_usd",
    "month_of",
    "next_month_start",
    "EGRESS_FILE",
    "MAX_NAMESPACE_PATTERNS",
    "NamespaceEgress",
    "NamespaceEgressError",
    "DISK_QUOTAS_FILE",
    "VOLUMES_DIR",
    "DiskQuota",
    "DiskQuotaError",
    "DiskUsage",
    "NamespaceDisks",
    "disk_unsupported",
    "is_disk_full",
    "DEFAULT_PATH",
    "EPHEMERAL_DIR",
    "ephemeral_root",
    "ephemeral_sessions",
    "operator_dirs",
    "prepare_session_dirs",
    "remove_session_dirs",
    "DIR_FLAGS",
    "ENV_DIR",
    "MAX_VALUE_BYTES",
    "MAX_VARIABLES",
    "RECORD_STREAMS_ENV",
    "RUNTIME_AHEAD_ENV",
    "SUBDIRS",
    "UIDS_FILE",
    "WALK_FLAGS",
    "EnvEntry",
    "Identity",
    "InvalidNamespace",
    "Namespace",
    "NamespaceDirs",
    "NamespaceEnv",
    "NamespaceEnvError",
    "UidRange",
    "UidRangeError",
    "UnsafeDataDir",
    "WorkspaceRefused",
    "build_env",
    "check_can_switch_uids",
    "check_reachable_by_workers",
    "check_workspace",
    "chmod_entry",
    "give_workspace",
    "hand_over",
    "make_dir",
    "make_workspace",
    "namespace_identity",
    "open_dir",
    "prepare_dirs",
    "prepare_namespace",
    "secure_data_dir",
    "tighten_data_dir",
    "walk_tree",
    "locked",
    "write_private",
]
