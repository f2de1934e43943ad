"""Namespace variables, limits and quarantines in the PostgreSQL database several supervisors share.

Tables (``store._pg_schema``): ``namespace_variables`` (one row per variable: its key id, nonce and AES-256-GCM
ciphertext, never the value), ``namespace_variable_stamps`` (a counter per namespace, bumped in the same transaction
as every change, so each host's pool sees that a worker is out of date), ``namespace_limits`` (kind, namespace,
JSON value) and ``namespace_quarantines`` (judged by the server's ``now()``).

Every read goes to the database (no cache): a change made on one host holds on every other at its next read. Calls
block (run them in a thread); one connection per object, used under a lock, made again when it was lost.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from ._names import Namespace
from ._pg_errors import NamespaceStateUnavailable
from ._quarantines import QuarantineRecord
from ._secret_key import KeyNotHeld, SecretKey
from ._variables import MAX_VARIABLES, EnvEntry, NamespaceEnvError, check_variable, check_variable_name

if TYPE_CHECKING:
    import psycopg

T = TypeVar("T")


class PgConnection:
    """One autocommit connection to ``url``, used by one thread at a time, reconnected once when found dead."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._lock = threading.Lock()
        self._conn: psycopg.Connection[Any] | None = None

    def run(self, work: Callable[[psycopg.Connection[Any]], T]) -> T:
        """``work`` in one transaction."""
        import psycopg

        from ..store import connect_postgres as connect
        from ..store import redact_store_url as redacted

        with self._lock:
            for attempt in (1, 2):
                try:
                    if self._conn is None or self._conn.closed or self._conn.broken:
                        self._conn = connect(self.url)
                    with self._conn.transaction():
                        return work(self._conn)
                except psycopg.OperationalError as exc:
                    if attempt == 1 and self._conn is not None and self._conn.broken:
                        continue  # the server restarted since the last call: nothing was done
                    raise NamespaceStateUnavailable(
                        f"PostgreSQL at {redacted(self.url)} is unreachable ({str(exc).strip()}); namespace "
                        "settings cannot be read or changed until it is back") from exc
                except psycopg.Error as exc:
                    raise NamespaceStateUnavailable(
                        f"PostgreSQL at {redacted(self.url)} refused a namespace settings statement "
                        f"({str(exc).strip()}); check that the store is migrated (start a supervisor on it once)"
                    ) from exc
            raise AssertionError("unreachable")

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


class PostgresVariables:
    """``NamespaceVariables`` in the database, each value sealed under the deployment key.

    Rows are opened with the primary ``key`` or any of ``old_keys`` (a rotation in progress), always sealed under
    the primary. A write is refused, before anything is stored, while the namespace holds a row under a key not
    held: a namespace's rows never end up under keys no one supervisor has together."""

    def __init__(self, db: PgConnection, key: SecretKey, old_keys: Sequence[SecretKey] = ()) -> None:
        self.db = db
        self.key = key
        self.keys = {k.key_id: k for k in (*old_keys, key)}

    def values(self, namespace: str) -> dict[str, str]:
        name = Namespace.parse(namespace).name
        rows = self.db.run(lambda c: c.execute(
            "SELECT name, key_id, nonce, ciphertext FROM namespace_variables WHERE namespace = %s", (name,)
        ).fetchall())
        return {var: self._open(name, var, key_id, bytes(nonce), bytes(sealed)) for var, key_id, nonce, sealed in rows}

    def entries(self, namespace: str) -> list[EnvEntry]:
        return [EnvEntry(var, self.fingerprint(value)) for var, value in sorted(self.values(namespace).items())]

    def stamp(self, namespace: str) -> str:
        name = Namespace.parse(namespace).name
        found = self.db.run(lambda c: c.execute(
            "SELECT stamp FROM namespace_variable_stamps WHERE namespace = %s", (name,)).fetchone())
        return "" if found is None else f"pg:{found[0]}"

    def fingerprint(self, value: str) -> str:
        return self.key.fingerprint(value)

    def update(self, namespace: str, set_values: Mapping[str, str] | None = None,
               unset: Sequence[str] = ()) -> list[EnvEntry]:
        ns = Namespace.parse(namespace).name
        set_values = dict(set_values or {})
        for var, value in set_values.items():
            check_variable(var, value)
        for var in unset:
            check_variable_name(var)
        sealed = {var: self.key.seal(ns, var, value) for var, value in set_values.items()}

        def write(conn: psycopg.Connection[Any]) -> None:
            bump_stamp(conn, ns)  # first: it locks the namespace's changes until commit
            rows = conn.execute("SELECT name, key_id FROM namespace_variables WHERE namespace = %s",
                                (ns,)).fetchall()
            self._check_held(ns, {key_id for _, key_id in rows})
            names = {row[0] for row in rows}
            after = (names | set(set_values)) - set(unset)  # as with the files: a name both set and unset goes
            if len(after) > MAX_VARIABLES:
                raise NamespaceEnvError(f"namespace {namespace!r} would have {len(after)} variables; at most "
                                        f"{MAX_VARIABLES} are kept")
            for var in unset:
                conn.execute("DELETE FROM namespace_variables WHERE namespace = %s AND name = %s", (ns, var))
            for var, (nonce, ciphertext) in sealed.items():
                if var in unset:
                    continue
                conn.execute(
                    "INSERT INTO namespace_variables(namespace, name, key_id, nonce, ciphertext) "
                    "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (namespace, name) DO UPDATE SET key_id = "
                    "excluded.key_id, nonce = excluded.nonce, ciphertext = excluded.ciphertext, updated_at = now()",
                    (ns, var, self.key.key_id, nonce, ciphertext))

        self.db.run(write)
        return self.entries(namespace)

    def _check_held(self, namespace: str, key_ids: set[str]) -> None:
        missing = sorted(key_ids - set(self.keys))
        if missing:
            raise KeyNotHeld(
                f"variables of namespace {namespace!r} are sealed under key(s) {', '.join(missing)}, which this "
                f"process holds neither as its secret key ({self.key.key_id}) nor as an old one: give every "
                "supervisor the deployment's key with --secret-key-file and, while a rotation is under way, the "
                "previous one with --old-secret-key-file (or $CODESDK_OLD_SECRET_KEYS); see docs/operations.md \"Rotating the secret key\"")

    def _open(self, namespace: str, name: str, key_id: str, nonce: bytes, sealed: bytes) -> str:
        self._check_held(namespace, {key_id})
        return self.keys[key_id].open(namespace, name, nonce, sealed)


#: What ``import_namespace_state`` moved once: (kind, namespace, variable name or "" for a limit).
Imported = tuple[str, str, str]


def imported_before(db: PgConnection) -> set[Imported]:
    return {(kind, ns, name) for kind, ns, name in db.run(lambda c: c.execute(
        "SELECT kind, namespace, name FROM namespace_imports").fetchall())}


def remember_imported(db: PgConnection, items: Sequence[Imported]) -> None:
    def write(conn: psycopg.Connection[Any]) -> None:
        for item in items:
            conn.execute("INSERT INTO namespace_imports(kind, namespace, name) VALUES (%s, %s, %s) "
                         "ON CONFLICT DO NOTHING", item)

    db.run(write)


def bump_stamp(conn: psycopg.Connection[Any], namespace: str) -> None:
    conn.execute("INSERT INTO namespace_variable_stamps(namespace, stamp) VALUES (%s, 1) ON CONFLICT (namespace) "
                 "DO UPDATE SET stamp = namespace_variable_stamps.stamp + 1", (namespace,))


class PostgresLimitTable:
    """``LimitTable`` for one ``kind`` in ``namespace_limits``."""

    def __init__(self, db: PgConnection, kind: str) -> None:
        from ..store import redact_store_url as redacted

        self.db = db
        self.kind = kind
        self.location = f"table namespace_limits ({kind}) at {redacted(db.url)}"

    def load(self) -> dict[str, Any]:
        rows = self.db.run(lambda c: c.execute(
            "SELECT namespace, value::text FROM namespace_limits WHERE kind = %s", (self.kind,)).fetchall())
        return {name: json.loads(text) for name, text in rows}

    def store(self, namespace: str, value: Any | None) -> None:
        if value is None:
            self.db.run(lambda c: c.execute("DELETE FROM namespace_limits WHERE kind = %s AND namespace = %s",
                                            (self.kind, namespace)))
            return
        self.db.run(lambda c: c.execute(
            "INSERT INTO namespace_limits(kind, namespace, value) VALUES (%s, %s, %s::jsonb) ON CONFLICT (kind, "
            "namespace) DO UPDATE SET value = excluded.value, updated_at = now()",
            (self.kind, namespace, json.dumps(value))))


class PostgresQuarantines:
    """``Quarantines`` in ``namespace_quarantines``, in force while ``until > now()`` on the database server."""

    def __init__(self, db: PgConnection) -> None:
        self.db = db

    def current(self, namespace: str) -> QuarantineRecord | None:
        return self.all(Namespace.parse(namespace).name).get(Namespace.parse(namespace).name)

    def begin(self, namespace: str, seconds: float, reason: str) -> QuarantineRecord:
        name = Namespace.parse(namespace).name
        row = self.db.run(lambda c: c.execute(
            "INSERT INTO namespace_quarantines(namespace, since, until, reason) VALUES (%s, now(), now() + "
            "make_interval(secs => %s), %s) ON CONFLICT (namespace) DO UPDATE SET since = excluded.since, until = "
            "excluded.until, reason = excluded.reason "
            "RETURNING extract(epoch FROM since)::float8, extract(epoch FROM until)::float8",
            (name, float(seconds), reason)).fetchone())
        assert row is not None
        return QuarantineRecord(since=row[0], until=row[1], reason=reason)

    def lift(self, namespace: str) -> bool:
        name = Namespace.parse(namespace).name
        row = self.db.run(lambda c: c.execute(
            "DELETE FROM namespace_quarantines WHERE namespace = %s RETURNING until > now()", (name,)).fetchone())
        return bool(row and row[0])

    def all(self, only: str | None = None) -> dict[str, QuarantineRecord]:
        rows = self.db.run(lambda c: c.execute(
            "SELECT namespace, extract(epoch FROM since)::float8, extract(epoch FROM until)::float8, reason "
            "FROM namespace_quarantines WHERE until > now() AND (%s::text IS NULL OR namespace = %s)",
            (only, only)).fetchall())
        return {name: QuarantineRecord(since=since, until=until, reason=reason) for name, since, until, reason in rows}
