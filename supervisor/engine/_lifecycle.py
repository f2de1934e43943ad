"""A session's life past its creation, as far as it is not the store's: where a fork may be cut, which
workspaces the service made and so may remove, where its worker runs (its isolation level) and the ephemeral
HOMEs left by sessions that are gone."""

from __future__ import annotations

import logging
import shutil
import sys
from pathlib import Path
from typing import Any

import trio

from codesdk.protocol import TERMINAL_EVENT_TYPES, EventType, IsolationLevel, NormalizedEvent

from ..ids import is_id
from ..namespaces import VOLUMES_DIR, DiskQuotaError, Namespace, UidRange, ephemeral_sessions, remove_session_dirs
from ..store import SessionRecord, StoreReader, UnknownSession
from ..workers.launch import Placement, PoolConfig
from ._errors import ForkInsideTask, ForkPastEnd, IsolationRefused

log = logging.getLogger("codesdk.supervisor.engine")

#: Events a fork reads from its session at a time.
_PAGE = 1000


async def events_to_fork(store: StoreReader, session_id: str, at_seq: int | None) -> tuple[list[NormalizedEvent], int]:
    """The session's events a fork at ``at_seq`` copies (its ``session.created`` excepted: the fork has its own),
    and the seq it is cut at. ``at_seq`` None: after the newest event outside a task (so a busy session forks
    before its running task). ``ForkInsideTask``, ``ForkPastEnd``."""
    kept: list[NormalizedEvent] = []
    open_tasks: dict[str, int] = {}  # task id -> the seq of its task.started
    cut = 0  # the newest seq no task is open at
    seq = 0
    while True:
        page = await store.read(session_id, after_seq=seq, limit=_PAGE)
        for event in page:
            if at_seq is not None and event.seq > at_seq:
                break
            seq = event.seq
            task_id = event.trace.task_id
            if event.type == EventType.TASK_STARTED and task_id is not None:
                open_tasks[task_id] = event.seq
            elif event.type in TERMINAL_EVENT_TYPES and task_id is not None:
                open_tasks.pop(task_id, None)
            if event.type != EventType.SESSION_CREATED:
                kept.append(event)
            if not open_tasks:
                cut = event.seq
        else:
            if len(page) == _PAGE:
                continue
        break
    if at_seq is not None and seq < at_seq:
        raise ForkPastEnd(f"seq {at_seq} is past the newest event of session {session_id} ({seq}): fork at {seq} "
                          "or before")
    if at_seq is not None and open_tasks:
        task_id, started = min(open_tasks.items(), key=lambda item: item[1])
        ended = await store.read_types(session_id, sorted(TERMINAL_EVENT_TYPES), after_seq=at_seq, limit=1,
                                       task_id=task_id)
        raise ForkInsideTask(session_id, at_seq, task_id, started, ended[0].seq if ended else None)
    return [event for event in kept if event.seq <= cut], cut


def made_workspace(workspace: str | None, roots: list[Path], data_dir: Path) -> Path | None:
    """The workspace as a path if the service made it as a session's default (``<root>/<session id>``, where root is
    the operator's workspaces dir, the data dir's, or a namespace volume's); None for one the operator chose."""
    if workspace is None:
        return None
    path = Path(workspace)
    if not is_id(path.name, "ses"):
        return None
    volumes = data_dir.resolve() / VOLUMES_DIR
    if path.parent in {root.resolve() for root in roots} or (
            path.parent.name == "workspaces" and path.parent.parent.parent == volumes):
        return path
    return None


def remove_workspace(path: Path) -> bool:
    """Remove a session's default workspace and all in it (symlinks are removed, never followed: the fd-based
    ``rmtree``). Blocking; False (logged) when some of it could not be removed."""
    failures: list[str] = []

    def failed(function: Any, name: str, info: Any) -> None:
        failures.append(f"{name}: {info[1] if isinstance(info, tuple) else info}")

    if path.exists() or path.is_symlink():
        if sys.version_info >= (3, 12):
            shutil.rmtree(path, onexc=failed)
        else:
            shutil.rmtree(path, onerror=failed)
    if failures:
        log.warning("workspace %s was not removed whole (%d failure(s), first: %s)", path, len(failures), failures[0])
    return not failures and not path.exists()


def placement_of(session: SessionRecord) -> Placement:
    """Which worker runs the session's tasks: its namespace's, its own (ephemeral) or the shared one."""
    own = session.isolation == IsolationLevel.EPHEMERAL
    return Placement(session.namespace, session.isolation.value, session.session_id if own else None)


#: The one namespace a ``shared`` session may be in: the operator's own.
SHARED_NAMESPACE = "default"


def check_isolation(isolation: IsolationLevel, namespace: str, worker_uids: UidRange | None) -> None:
    """``IsolationRefused`` for a level this service may not give: ``shared`` (the service user's own HOME, its
    logins and files) only in the ``default`` namespace of a service that runs no worker as a tenant's uid."""
    if isolation != IsolationLevel.SHARED:
        return
    if namespace != SHARED_NAMESPACE:
        raise IsolationRefused(
            f"isolation 'shared' runs in the service user's own HOME, which belongs to no tenant: it is only for "
            f"namespace {SHARED_NAMESPACE!r}, not {namespace!r}; use 'namespaced' (the namespace's own HOME) or "
            "'ephemeral' (a HOME made for the session)")
    if worker_uids is not None:
        raise IsolationRefused(
            f"isolation 'shared' runs as the service's own user, and this service runs workers as tenants' uids "
            f"(--worker-uids {worker_uids}): it is multi-user; use 'namespaced' or 'ephemeral'")


def ephemeral_bases(pool: PoolConfig, namespace: str) -> list[Path]:
    """Where the namespace's ephemeral HOMEs may be: the data dir, and its volume if it has one (mounted now, as
    its worker's start does). Blocking."""
    bases = [pool.data_dir]
    disks = pool.disks
    parsed = Namespace.parse(namespace)
    if disks is not None and disks.image(parsed).exists():
        try:
            volume = disks.ensure(parsed, move_files_in=False)
        except (DiskQuotaError, OSError) as exc:
            log.error("namespace %s: its volume cannot be mounted to remove an ephemeral HOME there: %s", namespace,
                      exc)
        else:
            bases += [volume] if volume is not None else []
    return bases


async def remove_ephemeral_home(store: StoreReader, pool: PoolConfig, namespace: str, session_id: str) -> bool:
    """Remove a deleted session's ephemeral HOME wherever it is; on the namespace's volume, those of its sessions
    deleted while the service was down go too (the start-up sweep sees only the data dir's). True when none of it
    is left."""
    bases = await trio.to_thread.run_sync(ephemeral_bases, pool, namespace)
    removed = [await trio.to_thread.run_sync(remove_session_dirs, base, session_id) for base in bases]
    for volume in bases[1:]:
        await sweep_ephemeral_homes(store, volume)
    return all(removed)


async def sweep_ephemeral_homes(store: StoreReader, base: Path) -> int:
    """Remove the ephemeral HOMEs below ``base`` whose session no longer exists (deleted while the supervisor was
    down, or whose removal failed); how many were removed. Blocking parts run in a thread."""
    removed = 0
    for session_id in await trio.to_thread.run_sync(ephemeral_sessions, base):
        if not is_id(session_id, "ses"):
            continue  # not made by us: left alone
        try:
            await store.get_session(session_id)
            continue
        except UnknownSession:
            pass
        if await trio.to_thread.run_sync(remove_session_dirs, base, session_id):
            removed += 1
    if removed:
        log.info("removed %d ephemeral HOME(s) of sessions that no longer exist", removed)
    return removed
