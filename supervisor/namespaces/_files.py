"""The supervisor's own files on disk: its small private files (tokens, uid assignments, namespace variables),
written atomically as 0600, and the directories a tenant may shape, opened one component at a time without ever
following a symlink.

A tenant owns its namespace's tree and works in its workspace, so any component there may be swapped for a
symlink between a check and a use. Opening each component from its parent's descriptor with ``O_NOFOLLOW`` turns
such a swap into a refusal (``ELOOP``) instead of a redirection of what the supervisor does next. Used by the
namespace directories, the API's token files and the workspace tools (``supervisor.tools._paths``, through this
package's face); whole trees are walked the same way (``walk_tree``: handing a tree to a namespace's uid, lending a
workspace to exec). The supervisor's private files are written the same careful way (``write_private``: never
through a symlink), so both live here: one module for how the supervisor touches files a tenant could reach.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import secrets
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger(__name__)

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


#: Directories entered by ``walk_tree``: as ``DIR_FLAGS``, and never blocking (a swapped-in FIFO stays shut).
WALK_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def walk_tree(root_fd: int) -> Iterator[tuple[int, str, os.stat_result]]:
    """Every entry below the directory ``root_fd`` as (its directory's fd, name, lstat), parents before children.

    Built for trees a hostile command shaped: a symlink is never followed (``O_NOFOLLOW``; a directory is entered
    only if it is still the one that was listed), nothing that is not a directory is ever opened (a FIFO would
    block), and it holds one directory descriptor at a time — back up through ``..``, checked against the
    directory it came from — and no recursion, so a tree thousands of levels deep costs neither descriptors nor
    stack. If the tree is moved under it, the walk stops there."""
    fd = os.dup(root_fd)
    top = os.fstat(fd)
    frames: list[tuple[tuple[int, int], list[str]]] = [((top.st_dev, top.st_ino), _names(fd))]
    try:
        while frames:
            names = frames[-1][1]
            if not names:
                frames.pop()
                if not frames:
                    return
                try:
                    up = os.open("..", WALK_FLAGS, dir_fd=fd)
                except OSError as exc:
                    log.warning("could not walk back up a tree (%s); stopped there", exc)
                    return
                os.close(fd)
                fd = up
                info = os.fstat(fd)
                if (info.st_dev, info.st_ino) != frames[-1][0]:
                    log.warning("a tree changed while it was being walked; stopped there")
                    return
                continue
            name = names.pop()
            try:
                info = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError:
                continue
            yield fd, name, info
            if not stat.S_ISDIR(info.st_mode):
                continue
            sub = _enter(fd, name, info)
            if sub is None:
                continue
            try:
                listing = _names(sub)
            except OSError:
                os.close(sub)
                continue
            os.close(fd)
            fd = sub
            frames.append(((info.st_dev, info.st_ino), listing))
    finally:
        os.close(fd)


def _names(fd: int) -> list[str]:
    with os.scandir(fd) as entries:
        return [entry.name for entry in entries]


def _enter(fd: int, name: str, info: os.stat_result) -> int | None:
    """A descriptor of directory ``name`` if it is still the listed one and can be walked back out of; a
    directory of ours that we may not read or pass through (a non-root supervisor) gets its owner bits first."""
    for attempt in (1, 2):
        try:
            sub = os.open(name, WALK_FLAGS, dir_fd=fd)
        except PermissionError:
            sub = None
        except OSError:  # no longer a directory (swapped for a symlink or a file: ENOTDIR, ELOOP) or gone: skipped
            return None
        if sub is not None:
            got = os.fstat(sub)
            try:
                if (got.st_dev, got.st_ino) != (info.st_dev, info.st_ino):
                    os.close(sub)
                    return None
                os.close(os.open("..", WALK_FLAGS, dir_fd=sub))  # the way back up works
                return sub
            except PermissionError:
                os.close(sub)
        if attempt == 2 or info.st_uid != os.geteuid():
            return None
        chmod_entry(fd, name, lambda mode: mode | stat.S_IRWXU)
    return None


def chmod_entry(dir_fd: int, name: str, change: Callable[[int], int]) -> None:
    """chmod an entry through an ``O_PATH`` descriptor of the entry itself: were it swapped for a symlink
    meanwhile, the symlink's target is never touched (nor opened: a FIFO or device stays closed)."""
    fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        info = os.fstat(fd)
        if not stat.S_ISLNK(info.st_mode):
            os.chmod(f"/proc/self/fd/{fd}", change(stat.S_IMODE(info.st_mode)))
    finally:
        os.close(fd)


@contextmanager
def locked(lock_file: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``lock_file`` (made 0600 if missing, never through a symlink) while the block
    runs: one writer at a time of a settings file, across processes (the service and the operator's commands)."""
    fd = os.open(lock_file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def write_private(path: Path, text: str) -> None:
    """Replace ``path`` atomically with a 0600 file holding ``text``: a fresh temp file (never through a symlink),
    fsynced before the rename and the directory after it, so a crash leaves the old file or the new one whole."""
    temp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
