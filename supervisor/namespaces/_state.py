"""Where a supervisor keeps its namespaces' variables, limits and quarantines: chosen once, shared by every user.

Without ``--store postgresql://…``: files in the data dir (and quarantines in memory), as on one host. With it: the
database every supervisor shares (``_pg_state``), variables encrypted under the deployment key, so a change made
through any supervisor holds on all of them. ``open_namespace_state`` makes the one ``NamespaceState`` the pool,
the launches, the engine, the API and bundles use. ``import_namespace_state`` moves a data dir's files into the
database; ``rotate_secret_key`` re-encrypts every variable under a new key.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._budgets import NamespaceBudgets
from ._disk import DISK_QUOTAS_FILE
from ._egress import NamespaceEgress
from ._limits import BUDGET, DISK, EGRESS, JsonLimitFile, LimitTable
from ._names import Namespace
from ._quarantines import Quarantines
from ._secret_key import SecretKey, SecretKeyError, require_secret_key
from ._variables import ENV_DIR, NamespaceEnv, NamespaceVariables


@dataclass
class NamespaceState:
    variables: NamespaceVariables
    budgets: NamespaceBudgets
    egress: NamespaceEgress
    disk_overrides: LimitTable
    #: Shared quarantines (the database); None: each pool keeps its own in memory.
    quarantines: Quarantines | None = None
    closer: Any = None

    def close(self) -> None:
        if self.closer is not None:
            self.closer.close()

    def __enter__(self) -> NamespaceState:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_namespace_state(data_dir: Path, store_url: str | None = None, key: SecretKey | None = None,
                         old_keys: Sequence[SecretKey] = ()) -> NamespaceState:
    """The data dir's files (``store_url`` None or SQLite), else the database at ``store_url``, which needs the
    deployment ``key`` (``SecretKeyError`` saying how to make one); ``old_keys`` open rows a rotation has not
    reached yet."""
    from ..store import is_postgres_url

    data_dir = Path(data_dir)
    if store_url is None or not is_postgres_url(store_url):
        return NamespaceState(NamespaceEnv(data_dir), NamespaceBudgets(data_dir), NamespaceEgress(data_dir),
                              JsonLimitFile(data_dir / DISK_QUOTAS_FILE))
    key = require_secret_key(key, "keeping namespace variables in PostgreSQL (--store postgresql://…)")
    from ._pg_state import PgConnection, PostgresLimitTable, PostgresQuarantines, PostgresVariables

    db = PgConnection(store_url)
    return NamespaceState(PostgresVariables(db, key, old_keys), NamespaceBudgets(data_dir, PostgresLimitTable(db, BUDGET)),
                          NamespaceEgress(data_dir, PostgresLimitTable(db, EGRESS)), PostgresLimitTable(db, DISK),
                          PostgresQuarantines(db), closer=db)


def check_keys_held(store_url: str, key: SecretKey, old_keys: Sequence[SecretKey] = ()) -> None:
    """Refuse (``SecretKeyError``, for the operator: it names the key ids) a database holding variables sealed
    under a key neither ``key`` nor one of ``old_keys``: a supervisor started so would take namespaces it cannot
    serve. A database not migrated yet holds none."""
    from ._pg_state import PgConnection

    held = {k.key_id for k in (key, *old_keys)}
    db = PgConnection(store_url)

    def key_ids(conn: Any) -> set[str]:
        if conn.execute("SELECT to_regclass('namespace_variables')").fetchone()[0] is None:
            return set()
        return {row[0] for row in conn.execute("SELECT DISTINCT key_id FROM namespace_variables")}

    try:
        found: set[str] = db.run(key_ids)
    finally:
        db.close()
    missing = sorted(found - held)
    if missing:
        raise SecretKeyError(
            f"the database holds namespace variables sealed under key(s) {', '.join(missing)}, and this supervisor "
            f"holds key {key.key_id}" + (f" and old key(s) {', '.join(sorted(held - {key.key_id}))}" if old_keys
                                         else "") +
            ": give it the deployment's key with --secret-key-file (every supervisor the same), and during a "
            "rotation the previous one with --old-secret-key-file (docs/operations.md, \"Rotating the secret key\")")


def migrate_store(store_url: str) -> None:
    """Bring the database's schema up to date (as a supervisor opening it does)."""
    from ..store import migrate_postgres

    migrate_postgres(store_url)


@dataclass(frozen=True)
class ImportReport:
    """What ``import_namespace_state`` did: counts and names only, never a value."""

    namespaces: int = 0
    variables_set: int = 0
    variables_unchanged: int = 0
    limits_set: int = 0
    limits_unchanged: int = 0
    #: What an earlier run imported ("user:alice variable API_KEY", "user:alice budget"), left as the database has it.
    skipped: tuple[str, ...] = ()

    def describe(self) -> str:
        said = (f"{self.variables_set} variable(s) of {self.namespaces} namespace(s) imported, "
                f"{self.variables_unchanged} already there; {self.limits_set} limit(s) imported, "
                f"{self.limits_unchanged} already there")
        if self.skipped:
            said += (f"; {len(self.skipped)} skipped, imported by an earlier run (the database's value, changed or "
                     f"removed since, is kept): {', '.join(self.skipped)}")
        return said


def import_namespace_state(data_dir: Path, store_url: str, key: SecretKey) -> ImportReport:
    """Copy the data dir's namespace variables and limits (budgets, egress lists, disk-quota overrides) into the
    database at ``store_url`` (migrated first), variables encrypted under ``key``. The first run moves everything
    (a value the database has differently is overwritten: the data dir is the source); the database remembers
    what was moved (``namespace_imports``), and a later run never overwrites or re-adds any of it, so changes made
    in the database since (through the API or the CLI) are kept. Quarantines are not moved: they live in one
    process's memory and end by themselves."""
    from ._pg_state import PgConnection, imported_before, remember_imported

    data_dir = Path(data_dir)
    migrate_store(store_url)
    files = open_namespace_state(data_dir)
    shared = open_namespace_state(data_dir, store_url, key)
    db: PgConnection = shared.closer
    try:
        before = imported_before(db)
        skipped: list[str] = []
        namespaces = variables_set = variables_same = limits_set = limits_same = 0
        env_dir = data_dir / ENV_DIR
        for path in sorted(env_dir.glob("*.json")) if env_dir.is_dir() else []:
            namespace = _namespace_of(path)
            values = files.variables.values(namespace)
            fresh = {name: value for name, value in values.items() if ("variable", namespace, name) not in before}
            skipped += [f"{namespace} variable {name}" for name in sorted(set(values) - set(fresh))]
            if not fresh:
                continue
            namespaces += 1
            there = shared.variables.values(namespace)
            changed = {name: value for name, value in fresh.items() if there.get(name) != value}
            variables_same += len(fresh) - len(changed)
            if changed:
                shared.variables.update(namespace, changed)
                variables_set += len(changed)
            remember_imported(db, [("variable", namespace, name) for name in fresh])
        for kind, source, target in ((BUDGET, files.budgets.table, shared.budgets.table),
                                     (EGRESS, files.egress.table, shared.egress.table),
                                     (DISK, files.disk_overrides, shared.disk_overrides)):
            there_all = target.load()
            for namespace, value in source.load().items():
                Namespace.parse(namespace)
                if (kind, namespace, "") in before:
                    skipped.append(f"{namespace} {kind}")
                    continue
                if there_all.get(namespace) == value:
                    limits_same += 1
                else:
                    target.store(namespace, value)
                    limits_set += 1
                remember_imported(db, [(kind, namespace, "")])
        return ImportReport(namespaces, variables_set, variables_same, limits_set, limits_same, tuple(skipped))
    finally:
        shared.close()


def _namespace_of(path: Path) -> str:
    """The namespace a variables file belongs to, from the file name (its ``safe_name``)."""
    return Namespace.parse(path.stem.replace(".", ":", 1)).name  # the inverse of ``safe_name``


@dataclass(frozen=True)
class RotationReport:
    rotated: int
    already: int

    def describe(self) -> str:
        return f"{self.rotated} variable(s) re-encrypted under the new key, {self.already} already under it"


def rotate_secret_key(store_url: str, new: SecretKey, old: Sequence[SecretKey]) -> RotationReport:
    """Re-encrypt every variable sealed under one of ``old`` under ``new``, in one transaction. Idempotent; refused
    (nothing changed) when a row's key is neither ``new`` nor one of ``old``."""
    from ._pg_state import PgConnection

    migrate_store(store_url)
    by_id = {key.key_id: key for key in old}
    db = PgConnection(store_url)

    def rotate(conn: Any) -> RotationReport:
        rows = conn.execute("SELECT namespace, name, key_id, nonce, ciphertext FROM namespace_variables "
                            "ORDER BY namespace, name FOR UPDATE").fetchall()
        missing = sorted({key_id for *_, key_id, _n, _c in rows if key_id != new.key_id and key_id not in by_id})
        if missing:
            raise SecretKeyError(
                f"variables sealed under key(s) {', '.join(missing)} cannot be opened with the keys given (new "
                f"{new.key_id}, old {', '.join(sorted(by_id)) or 'none'}); add that key with --old-secret-key-file")
        rotated = 0
        for namespace, name, key_id, nonce, sealed in rows:
            if key_id == new.key_id:
                continue
            value = by_id[key_id].open(namespace, name, bytes(nonce), bytes(sealed))
            nonce2, sealed2 = new.seal(namespace, name, value)
            conn.execute("UPDATE namespace_variables SET key_id = %s, nonce = %s, ciphertext = %s, updated_at = "
                         "now() WHERE namespace = %s AND name = %s", (new.key_id, nonce2, sealed2, namespace, name))
            rotated += 1
        return RotationReport(rotated, len(rows) - rotated)

    try:
        report: RotationReport = db.run(rotate)
        return report
    finally:
        db.close()
