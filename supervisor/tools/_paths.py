"""Path confinement: every tool path is relative to the session workspace and must stay inside it.

Two layers, because either alone has a gap:

1. ``confine`` resolves the path (``os.path.realpath``: symlinks followed, ``..`` applied the way the kernel
   would) and refuses absolute paths, lexical ``..`` escapes and anything whose resolution leaves the
   workspace, including through a dangling symlink or a symlinked parent of a file not yet created.
2. The fd helpers then walk the resolved components from the workspace fd with ``O_NOFOLLOW`` at every step
   (``supervisor.namespaces.open_dir``), so a symlink swapped in between the check and the use is refused (ELOOP)
   instead of followed.
"""

from __future__ import annotations

import errno
import os
import posixpath
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..namespaces import DIR_FLAGS, VOLUMES_DIR, DiskUsage, is_disk_full, make_dir
from ..namespaces import open_dir as open_component  # one component, from its parent's fd
from ._base import ErrorCode, ToolError


@dataclass(frozen=True)
class ConfinedPath:
    """A workspace path after confinement: ``parts`` are symlink-free components under ``root``."""

    root: Path
    parts: tuple[str, ...]
    given: str

    @property
    def rel(self) -> str:
        """The resolved path relative to the workspace, ``.`` for the workspace itself."""
        return "/".join(self.parts) or "."

    @property
    def path(self) -> Path:
        return self.root.joinpath(*self.parts)

    @property
    def name(self) -> str:
        return self.parts[-1] if self.parts else "."

    @property
    def parent_parts(self) -> tuple[str, ...]:
        return self.parts[:-1]


def _refuse(given: str, why: str) -> ToolError:
    return ToolError(ErrorCode.PATH_REFUSED, f"path {given!r} refused: {why}")


def workspace_root(workspace: Path) -> Path:
    """The workspace with its own symlinks resolved; it must be an existing directory."""
    root = Path(os.path.realpath(workspace))
    if not root.is_dir():
        raise ToolError(ErrorCode.NOT_FOUND, f"workspace {str(workspace)!r} is not an existing directory")
    return root


def lexical_refusal(given: str) -> str | None:
    """Why ``given`` is refused from its text alone, whatever the workspace holds (None: not for that); an edited
    input is checked by it before its call is allowed."""
    if "\x00" in given:
        return "it contains a NUL byte"
    if posixpath.isabs(given) or os.path.isabs(given):
        return "absolute paths are not allowed; give a path relative to the workspace"
    lexical = posixpath.normpath(given) if given else "."
    if lexical == ".." or lexical.startswith("../"):
        return "'..' would leave the workspace"
    return None


def confine(workspace: Path, given: str) -> ConfinedPath:
    """Resolve ``given`` inside ``workspace`` or raise ``ToolError(PATH_REFUSED)`` saying why not.

    ``""`` and ``"."`` name the workspace itself (useful for listing; file tools refuse it).
    """
    if (why := lexical_refusal(given)) is not None:
        raise _refuse(given, why)
    root = workspace_root(workspace)
    try:
        resolved = Path(os.path.realpath(root / given))
    except OSError as exc:  # e.g. EINVAL: a symlink turned into a directory between realpath's lstat and readlink
        raise _refuse(given, f"it changed while it was being resolved ({exc.strerror or exc}); "
                             "something is renaming or swapping symlinks in the workspace") from exc
    if not resolved.is_relative_to(root):
        raise _refuse(given, "it resolves outside the workspace through a symlink")
    return ConfinedPath(root=root, parts=resolved.relative_to(root).parts, given=given)


def os_error(exc: OSError, given: str, root: Path | None = None) -> ToolError:
    """Translate an OSError from a confined operation into a clear ``ToolError`` (``root``: the workspace, to
    say how full its disk is when it is)."""
    if is_disk_full(exc):
        return ToolError(ErrorCode.DISK_FULL, f"No space left for {given!r}: {disk_full_message(root)}")
    if exc.errno == errno.ENOENT:
        return ToolError(ErrorCode.NOT_FOUND, f"{given!r} does not exist")
    if exc.errno == errno.ELOOP:
        return _refuse(given, "a symlink appeared in the path while it was being opened")
    if exc.errno == errno.ENOTDIR:
        return ToolError(ErrorCode.NOT_A_DIRECTORY, f"a component of {given!r} is not a directory")
    if exc.errno == errno.EISDIR:
        return ToolError(ErrorCode.NOT_A_FILE, f"{given!r} is a directory")
    if exc.errno == errno.EEXIST:
        return ToolError(ErrorCode.ALREADY_EXISTS, f"{given!r} already exists")
    return ToolError(ErrorCode.IO_ERROR, f"{given!r}: {exc.strerror or exc}")


def disk_full_message(root: Path | None) -> str:
    """Why a write found no space, for the model to act on: the namespace's disk quota (its own volume) or the
    workspace's file system, and how full it is."""
    quota = root is not None and root.parent.parent.parent.name == VOLUMES_DIR
    try:
        fill = f" ({DiskUsage.of(root).describe()})" if root is not None else ""
    except OSError:
        fill = ""
    if quota:
        return (f"the namespace's disk quota is full{fill}; delete files you no longer need (in the workspace or "
                "HOME), or ask the operator to raise the quota (`codesdk-supervisor namespace disk set`)")
    return f"the workspace's file system is full{fill}; delete files you no longer need, or ask the operator"


def _inherit_owner(parent: int, name: str) -> None:
    """A directory the tools create belongs to whoever owns the one it is in (see ``_fsops.owner_for``)."""
    info = os.fstat(parent)
    if (info.st_uid, info.st_gid) != (os.geteuid(), os.getegid()):
        try:
            os.chown(name, info.st_uid, info.st_gid, dir_fd=parent, follow_symlinks=False)
        except PermissionError:  # not ours to give away (an unprivileged supervisor): it stays ours
            pass


def open_dir(
    root: Path, parts: tuple[str, ...], *, create: bool = False, created: list[Path] | None = None
) -> int:
    """Open the directory ``root/parts`` without following any symlink; optionally create missing ones.

    Directories this call creates are appended to ``created`` (outermost first) so a caller can undo them.
    """
    fd = os.open(root, DIR_FLAGS)
    try:
        for index, name in enumerate(parts):
            if create and make_dir(name, fd, 0o777):
                _inherit_owner(fd, name)
                if created is not None:
                    created.append(root.joinpath(*parts[: index + 1]))
            next_fd = open_component(name, fd)
            os.close(fd)
            fd = next_fd
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextmanager
def dir_fd(root: Path, parts: tuple[str, ...], *, create: bool = False) -> Iterator[int]:
    """``open_dir`` as a context manager that closes the fd."""
    fd = open_dir(root, parts, create=create)
    try:
        yield fd
    finally:
        os.close(fd)
