"""Blocking file operations on confined paths (callers run them via ``trio.to_thread.run_sync``).

Everything opens relative to a directory fd with ``O_NOFOLLOW``; writes go to a temp file in the same
directory and are renamed over the target, so a reader never sees a half-written file.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from ._base import ErrorCode, ToolError
from ._paths import ConfinedPath, dir_fd, open_dir, os_error

_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
DEFAULT_FILE_MODE = 0o644


def require_file_path(cp: ConfinedPath) -> None:
    if not cp.parts:
        raise ToolError(ErrorCode.NOT_A_FILE, f"{cp.given!r} is the workspace directory, not a file")


def open_regular(cp: ConfinedPath) -> tuple[int, os.stat_result]:
    """Open an existing regular file for reading; refuse directories, devices, FIFOs and symlinks."""
    require_file_path(cp)
    try:
        with dir_fd(cp.root, cp.parent_parts) as parent:
            fd = os.open(cp.name, _READ_FLAGS, dir_fd=parent)
    except OSError as exc:
        raise os_error(exc, cp.given, cp.root) from exc
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        kind = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file"
        raise ToolError(ErrorCode.NOT_A_FILE, f"{cp.given!r} is {kind}")
    return fd, info


def read_whole(cp: ConfinedPath, max_bytes: int) -> bytes | None:
    """The file's bytes, ``None`` if it does not exist; ``TOO_LARGE`` beyond ``max_bytes``."""
    try:
        fd, info = open_regular(cp)
    except ToolError as exc:
        if exc.code is ErrorCode.NOT_FOUND:
            return None
        raise
    with os.fdopen(fd, "rb") as handle:
        if info.st_size > max_bytes:
            raise ToolError(ErrorCode.TOO_LARGE, f"{cp.given!r} is {info.st_size} bytes (limit {max_bytes})")
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ToolError(ErrorCode.TOO_LARGE, f"{cp.given!r} is over {max_bytes} bytes")
    return data


def existing_mode(parent: int, name: str, given: str) -> int | None:
    """Permission bits of an existing target (kept on overwrite), ``None`` if absent; refuses non-files."""
    try:
        info = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(info.st_mode):
        raise ToolError(ErrorCode.PATH_REFUSED, f"path {given!r} refused: the target became a symlink")
    if not stat.S_ISREG(info.st_mode):
        raise ToolError(ErrorCode.NOT_A_FILE, f"{given!r} exists and is not a regular file")
    return stat.S_IMODE(info.st_mode)


def write_temp(parent: int, name: str, data: bytes, mode: int) -> str:
    """Write ``data`` to a fresh temp file next to ``name`` (fsynced); returns the temp name."""
    temp = f".{name[:200]}.{secrets.token_hex(6)}.codesdk-tmp"
    fd = os.open(temp, _TEMP_FLAGS, mode, dir_fd=parent)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        owner = owner_for(parent, name)
        if owner is not None:
            try:
                os.fchown(fd, *owner)
            except PermissionError:  # not ours to give away (an unprivileged supervisor): it stays ours
                pass
        os.fchmod(fd, mode)  # umask must not narrow a mode we are preserving (and chown clears set-id bits)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        unlink_quietly(parent, temp)
        raise
    os.close(fd)
    return temp


def owner_for(parent: int, name: str) -> tuple[int, int] | None:
    """Who a file written as ``name`` should belong to, if not to us: the file's owner when it exists, else the
    owner of its directory. A namespace's workspace (with per-namespace uids) thus stays all the namespace's, so
    its runtime can keep working on what the supervisor's tools wrote."""
    try:
        info = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        info = os.fstat(parent)
    owner = (info.st_uid, info.st_gid)
    return None if owner == (os.geteuid(), os.getegid()) else owner


def unlink_quietly(parent: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=parent)
    except OSError:
        pass


def atomic_write(cp: ConfinedPath, data: bytes) -> bool:
    """Create or replace the file atomically, creating parent directories; True if it was created."""
    require_file_path(cp)
    try:
        parent = open_dir(cp.root, cp.parent_parts, create=True)
    except OSError as exc:
        raise os_error(exc, cp.given, cp.root) from exc
    try:
        mode = existing_mode(parent, cp.name, cp.given)
        temp = write_temp(parent, cp.name, data, DEFAULT_FILE_MODE if mode is None else mode)
        try:
            os.replace(temp, cp.name, src_dir_fd=parent, dst_dir_fd=parent)
        except BaseException:
            unlink_quietly(parent, temp)
            raise
    except OSError as exc:
        raise os_error(exc, cp.given, cp.root) from exc
    finally:
        os.close(parent)
    return mode is None


def remove_dirs(created: list[Path]) -> None:
    """Best-effort undo of directories created by ``open_dir(create=True)`` (innermost first; only if empty)."""
    for path in reversed(created):
        try:
            os.rmdir(path)
        except OSError:
            pass
