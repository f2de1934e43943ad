"""A session's life past its creation, as far as it is not the store's: where a fork may be cut, and which
workspaces the service made and so may remove."""

from __future__ import annotations

import logging
import shutil
import sys
from pathlib import Path
from typing import Any

from codesdk.protocol import TERMINAL_EVENT_TYPES, EventType, NormalizedEvent

from ..ids import is_id
from ..namespaces import VOLUMES_DIR
from ..store import StoreReader
from ._errors import ForkInsideTask, ForkPastEnd

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
