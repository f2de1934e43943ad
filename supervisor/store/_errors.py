"""The store's own error types, and the one place where SQLite errors become them (PostgreSQL's: ``_pg``).

Callers (engine, HTTP API, CLI) handle ``StoreError`` subclasses and never import apsw. Every apsw call
in the package runs through ``translate``, so a message like "database is locked" always arrives with
the data dir it concerns and a hint about what to do.
"""

from __future__ import annotations

import apsw

from codesdk.protocol import ApprovalState


class StoreError(Exception):
    """Base of every error the event/blob store raises."""


class StoreClosed(StoreError):
    """The store was closed (or is closing); the operation was not performed."""

    def __init__(self, what: str = "operation") -> None:
        super().__init__(f"event store is closed; {what} was not performed")


class StoreReadOnly(StoreError):
    """The store was opened read-only (beside the data dir's writer); writes go through that writer."""

    def __init__(self, data_dir: object, what: str) -> None:
        super().__init__(f"the event store in {data_dir} is open read-only here; {what} was not performed")


class UnknownSession(StoreError, LookupError):
    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        super().__init__(f"no session {session_id!r} here: list the sessions there are with `codesdk sessions` "
                         "(GET /v1/sessions), or start a new one")


class SessionExists(StoreError):
    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        super().__init__(f"session {session_id!r} already exists; pick another id or omit it to get a fresh one")


class UnknownTask(StoreError, LookupError):
    def __init__(self, task_id: str) -> None:
        self.task_id = task_id
        super().__init__(f"no task {task_id!r} here: a session's tasks are listed by `codesdk events SESSION_ID` "
                         "(GET /v1/sessions/{id}/events)")


class TaskExists(StoreError):
    def __init__(self, task_id: str) -> None:
        self.task_id = task_id
        super().__init__(f"task {task_id!r} already exists; pick another id or omit it to get a fresh one")


class SessionBusy(StoreError):
    """A session may have only one pending/running task at a time."""

    def __init__(self, session_id: str, active_task_id: str, state: str) -> None:
        self.session_id = session_id
        self.active_task_id = active_task_id
        super().__init__(
            f"session {session_id!r} already has an active task {active_task_id!r} ({state}); "
            "wait for it to end or stop it before starting another"
        )


class UnknownApproval(StoreError, LookupError):
    def __init__(self, approval_id: str) -> None:
        self.approval_id = approval_id
        super().__init__(f"unknown approval {approval_id!r}")


class ApprovalDecided(StoreError):
    """An approval can be decided once; this one already was (or expired)."""

    def __init__(self, approval_id: str, state: ApprovalState) -> None:
        self.approval_id = approval_id
        self.state = state
        super().__init__(f"approval {approval_id!r} is already {state}; a decision is final")


class InvalidTransition(StoreError):
    def __init__(self, task_id: str, current: str, requested: str) -> None:
        self.task_id = task_id
        self.current = current
        self.requested = requested
        super().__init__(f"task {task_id!r} cannot go from {current} to {requested}")


class InvalidEvent(StoreError, ValueError):
    """An event draft failed validation; nothing of its batch was written."""


class SchemaTooNew(StoreError):
    def __init__(self, path: str, found: int, known: int) -> None:
        self.found = found
        self.known = known
        super().__init__(
            f"database {path} has schema version {found}, but this codesdk only knows up to {known}; "
            "upgrade codesdk, or point it at another data dir"
        )


class MigrationFailed(StoreError):
    """A schema migration step failed; the database was left at its previous version."""


class DatabaseError(StoreError):
    """The database reported a problem (locked, disk full, corrupt, I/O, unreachable ...); see the message for the
    fix. ``storage_fault``: the storage failed, not the request (what readiness reports until a write succeeds)."""

    def __init__(self, message: str, *, storage_fault: bool = False) -> None:
        super().__init__(message)
        self.storage_fault = storage_fault


class InvalidBlobRef(StoreError, ValueError):
    def __init__(self, ref: object) -> None:
        super().__init__(f"{ref!r} is not a blob reference; expected 'sha256:' followed by 64 lowercase hex digits")


class BlobNotFound(StoreError, LookupError):
    def __init__(self, ref: str) -> None:
        self.ref = ref
        super().__init__(f"blob {ref} is not in the blob store")


class BlobCorrupt(StoreError):
    def __init__(self, ref: str, path: str, actual: str) -> None:
        self.ref = ref
        super().__init__(
            f"blob {ref} is corrupt: file {path} hashes to {actual}; restore it from a backup or delete it "
            "so it can be written again"
        )


_HINTS: tuple[tuple[type[apsw.Error], str], ...] = (
    (apsw.BusyError, "the database is locked by another process; is a second supervisor using this data dir?"),
    (apsw.LockedError, "the database is locked by another connection"),
    (apsw.FullError, "the disk is full; free space under the data dir and retry"),
    (apsw.ReadOnlyError, "the database is read-only; check permissions of the data dir and its files"),
    (apsw.PermissionsError, "permission denied; check ownership and mode of the data dir"),
    (apsw.CantOpenError, "cannot open the database file; check the data dir exists and is writable"),
    (apsw.NotADBError, "the file is not a SQLite database; move it away or use another data dir"),
    (apsw.CorruptError, "the database file is corrupt; restore from a backup"),
    (apsw.IOError, "an I/O error occurred; check the disk and the data dir"),
    (apsw.ConstraintError, "an integrity constraint failed (this is a bug in the caller or the store)"),
    (apsw.ConnectionClosedError, "the connection is closed (the store was closed)"),
)


#: SQLite errors that mean the disk, not the request, failed.
_STORAGE_FAULTS = (apsw.FullError, apsw.IOError, apsw.ReadOnlyError, apsw.CorruptError)


def translate(exc: BaseException, where: str) -> BaseException:
    """Map an exception raised under the store to what callers see.

    ``StoreError`` passes through; apsw errors become ``DatabaseError`` (or ``StoreClosed``) with a hint;
    OS errors (blob files, data dir) become ``StoreError``; anything else passes through unchanged.
    """
    if isinstance(exc, OSError):
        error: StoreError = StoreError(f"{where}: {exc.strerror or exc} ({exc.filename or 'no file'})")
        error.__cause__ = exc
        return error
    if isinstance(exc, StoreError) or not isinstance(exc, apsw.Error):
        return exc
    if isinstance(exc, apsw.ConnectionClosedError):
        return StoreClosed(where)
    hint = next((text for kind, text in _HINTS if isinstance(exc, kind)), "unexpected SQLite error")
    error = DatabaseError(f"{where}: {hint} (sqlite: {exc})", storage_fault=isinstance(exc, _STORAGE_FAULTS))
    error.__cause__ = exc
    return error
