"""Session workspaces: refused where they would expose the supervisor's files, handed to the namespace's uid."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from ._disk import VOLUMES_DIR
from ._names import Namespace
from ._uids import Identity, UidRange, hand_over, namespace_identity

log = logging.getLogger("codesdk.supervisor.namespaces")


class WorkspaceRefused(ValueError):
    """A workspace that would expose the supervisor's own files (or the whole host) to a tenant's tools."""


def check_workspace(workspace: Path, data_dir: Path) -> Path:
    """The workspace's real path, unless it is ``/`` or overlaps the data dir (the store, the tokens, every
    namespace's HOME) — is it, contains it, or lies inside it other than under ``workspaces/``."""
    real = workspace.resolve()
    data = data_dir.resolve()
    own = data / "workspaces"  # where the supervisor makes default workspaces: safe, one per session
    if real.parent.parent.parent == data / VOLUMES_DIR and real.parent.name == "workspaces":
        return real  # volumes/<safe>/workspaces/<session>: on a namespace's own disk (``_disk``), root-owned above
    if real == Path(real.anchor):
        raise WorkspaceRefused(f"workspace {workspace} is the root of the file system; tools would reach everything")
    if real == data or data.is_relative_to(real):
        raise WorkspaceRefused(f"workspace {workspace} contains the supervisor's data dir {data} (its store, tokens "
                               "and every namespace's HOME); use a directory outside it")
    if real.is_relative_to(data) and not (real != own and real.is_relative_to(own)):
        raise WorkspaceRefused(f"workspace {workspace} lies inside the supervisor's data dir {data}; use a "
                               "directory outside it")
    return real


def make_workspace(workspace: Path, namespace: str, data_dir: Path, uids: UidRange | None) -> Path:
    """A session's workspace, checked (``check_workspace``), made if missing (0700) and given to the namespace
    (``give_workspace``): its real path. ``WorkspaceRefused`` says why it cannot be; OSError. Blocking."""
    workspace = check_workspace(workspace, data_dir)
    volume = workspace.parent.parent
    if volume.parent == data_dir.resolve() / VOLUMES_DIR and volume.name != Namespace.parse(namespace).safe_name:
        raise WorkspaceRefused(f"workspace {workspace} is on another namespace's disk; namespace {namespace!r} "
                               "needs a workspace of its own")
    workspace.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:  # with per-namespace uids the workspace becomes the namespace's own; else a no-op
        give_workspace(workspace, namespace, data_dir, uids)
    except (ValueError, RuntimeError) as exc:
        raise WorkspaceRefused(f"cannot give workspace {workspace} to namespace {namespace!r}: {exc}") from exc
    return workspace


def give_workspace(workspace: Path, namespace: str, data_dir: Path, uids: UidRange | None) -> Identity | None:
    """Make a session's workspace the namespace's own, so its worker's runtime can work in it.

    A no-op (``None``) without a uid range. Otherwise the workspace tree is handed to the namespace's uid
    (already-owned trees are left alone), and a workspace under the data dir gets 0711 on the directories
    leading to it. Refused when the workspace belongs to another namespace's uid: two tenants sharing a
    workspace would share files. The supervisor keeps access through its capabilities.
    """
    if uids is None:
        return None
    identity = namespace_identity(data_dir, uids, Namespace.parse(namespace))
    workspace = check_workspace(workspace, data_dir)
    data_dir = data_dir.resolve()
    if not workspace.is_dir():
        raise ValueError(f"workspace {workspace} is not a directory that can be given to a namespace")
    owner = workspace.stat().st_uid
    if owner != identity.uid:
        if owner in uids:
            raise ValueError(
                f"workspace {workspace} belongs to another namespace (uid {owner}); namespace {namespace!r} "
                f"(uid {identity.uid}) needs a workspace of its own")
        hand_over(workspace, identity)
    if workspace.is_relative_to(data_dir):
        for folder in workspace.relative_to(data_dir).parents:  # includes "." (the data dir itself)
            os.chmod(data_dir / folder, 0o711)
    else:
        closed = [str(p) for p in workspace.parents if not p.stat().st_mode & stat.S_IXOTH]
        if closed:
            log.warning("workspace %s: %s not searchable by others, so namespace %s's worker cannot reach it",
                        workspace, ", ".join(closed), namespace)
    return identity
