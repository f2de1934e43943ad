"""Directories a tenant may shape, opened one component at a time without ever following a symlink.

A tenant owns its namespace's tree and works in its workspace, so any component there may be swapped for a
symlink between a check and a use. Opening each component from its parent's descriptor with ``O_NOFOLLOW`` turns
such a swap into a refusal (``ELOOP``) instead of a redirection of what the supervisor does next. Used by the
namespace directories (``supervisor.namespaces``) and the workspace tools (``supervisor.tools._paths``).
"""

from __future__ import annotations

import errno
import os
import stat

#: Open a directory, and only a directory, never through a symlink (and not into a child process).
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def open_dir(name: str | os.PathLike[str], parent: int | None = None) -> int:
    """A descriptor of the directory ``name`` (relative to the directory ``parent``, when given); a symlink there is
    always reported as ``ELOOP``.

    Linux answers ``O_DIRECTORY | O_NOFOLLOW`` on a symlink with ``ENOTDIR``, which would read as "not a directory"
    instead of the refusal it is.
    """
    try:
        return os.open(name, DIR_FLAGS, dir_fd=parent)
    except NotADirectoryError:
        try:
            is_link = stat.S_ISLNK(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode)
        except OSError:
            is_link = False
        if is_link:
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), os.fspath(name)) from None
        raise


def make_dir(name: str | os.PathLike[str], parent: int | None, mode: int) -> bool:
    """``mkdir`` that leaves whatever is there already alone (``open_dir`` checks it); True if it made one."""
    try:
        os.mkdir(name, mode, dir_fd=parent)
    except FileExistsError:
        return False
    return True
