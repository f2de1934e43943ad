"""HOMEs of a session's own: made for one ephemeral session, removed with it; and the operator's own (shared).

An ephemeral session's HOME/XDG/TMPDIR live in ``<base>/ephemeral/<session-id>/`` (home/, config/, state/,
cache/, data/, tmp/), where base is the data dir — or the namespace's own volume when it has a disk quota
(``<data-dir>/volumes/<safe>/``, beside its workspaces), so that they count against it. They are owned like the
namespace's (by the namespace's uid with a uid range: its worker runs as that uid, and works in the namespace's
workspaces). ``ephemeral/`` itself is the supervisor's (0700, 0711 with a uid range), so no tenant can swap it for a
symlink; a session's tree is made and removed through descriptors. Nothing is copied in: the runtime there starts
logged out and gets credentials only from the namespace's stored variables.

The shared level's directories are the service user's own HOME and XDG directories, as its environment names
them (the XDG defaults under HOME when it names none).
"""

from __future__ import annotations

import logging
import os
import pwd
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path

from ._dirs import SUBDIRS, NamespaceDirs, _open_dir, _own
from ._uids import Identity

log = logging.getLogger("codesdk.supervisor.namespaces")

#: Where ephemeral sessions' HOMEs live, below the data dir.
EPHEMERAL_DIR = "ephemeral"


def ephemeral_root(base: Path, session_id: str) -> Path:
    return base / EPHEMERAL_DIR / session_id


def prepare_session_dirs(base: Path, session_id: str, identity: Identity | None = None) -> NamespaceDirs:
    """Make (or tighten) the session's own directories below ``base`` (the data dir, or the namespace's volume),
    0700 and owned by ``identity`` when given."""
    root = ephemeral_root(base, session_id)
    with _open_dir(base, None, create=False) as fd:
        with _open_dir(Path(EPHEMERAL_DIR), fd, create=True, shown_as=root.parent) as parent_fd:
            os.fchmod(parent_fd, 0o711 if identity is not None else 0o700)  # a passage, never listable
            with _open_dir(Path(session_id), parent_fd, create=True, shown_as=root) as root_fd:
                _own(root_fd, identity)
                for name in SUBDIRS:
                    with _open_dir(Path(name), root_fd, create=True, shown_as=root / name) as sub_fd:
                        _own(sub_fd, identity)
    return NamespaceDirs(root=root, **{name: root / name for name in SUBDIRS})


def remove_session_dirs(base: Path, session_id: str) -> bool:
    """Remove the session's directories and all in it (through descriptors: a symlink its runtime planted is
    removed, never followed). True when nothing of them is left (none made counts); False (logged) otherwise."""
    failures: list[str] = []

    def failed(function: object, name: str, info: object) -> None:
        failures.append(f"{name}: {info}")

    try:
        with _open_dir(base / EPHEMERAL_DIR, None, create=False) as parent_fd:
            try:
                os.stat(session_id, dir_fd=parent_fd, follow_symlinks=False)
            except FileNotFoundError:
                return True
            if sys.version_info >= (3, 12):
                shutil.rmtree(session_id, dir_fd=parent_fd, onexc=failed)
            else:
                shutil.rmtree(session_id, dir_fd=parent_fd, onerror=failed)
    except FileNotFoundError:
        return True
    except OSError as exc:
        failures.append(str(exc))
    if failures:
        log.warning("the ephemeral HOME of session %s was not removed whole (%d failure(s), first: %s)", session_id,
                    len(failures), failures[0])
    return not failures


def ephemeral_sessions(base: Path) -> list[str]:
    """The session ids that have an ephemeral HOME below ``base`` (for the sweep of those whose session is gone)."""
    try:
        return sorted(entry.name for entry in os.scandir(base / EPHEMERAL_DIR))
    except FileNotFoundError:
        return []


def operator_dirs(environ: Mapping[str, str] = os.environ) -> NamespaceDirs:
    """The service user's own HOME and XDG directories (and TMPDIR), as its environment names them."""
    home = Path(environ.get("HOME") or pwd.getpwuid(os.geteuid()).pw_dir)

    def xdg(name: str, default: str) -> Path:
        value = environ.get(name, "")
        return Path(value) if os.path.isabs(value) else home / default

    return NamespaceDirs(root=home, home=home, config=xdg("XDG_CONFIG_HOME", ".config"),
                         state=xdg("XDG_STATE_HOME", ".local/state"), cache=xdg("XDG_CACHE_HOME", ".cache"),
                         data=xdg("XDG_DATA_HOME", ".local/share"),
                         tmp=Path(environ.get("TMPDIR") or "/tmp"))
