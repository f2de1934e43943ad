"""``patch.apply``: apply a unified diff to files in the workspace, all or nothing.

Every file section is confined, read and patched in memory first; only when every hunk of every file
applied does anything touch the disk. The commit writes each new content to a temp file, then renames
them into place and unlinks deleted files; if that phase fails part-way, what was already committed is
restored from the in-memory originals (best effort: the disk failing twice can still leave a mix).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import trio
from pydantic import Field, JsonValue

from codesdk.protocol import ToolClass

from ._base import ErrorCode, Tool, ToolContext, ToolError, ToolInput, ToolResult, workspace_sandbox
from ._diff import DiffError, FileAction, HunkMismatch, apply_hunks, parse_unified_diff, split_lines
from ._fsops import DEFAULT_FILE_MODE, existing_mode, read_whole, remove_dirs, unlink_quietly, write_temp
from ._paths import ConfinedPath, confine, open_dir, os_error

_UNCHANGED = "no file was changed"


class PatchInput(ToolInput):
    patch: str = Field(
        min_length=1,
        description=(
            "A unified diff (---/+++ headers, @@ hunks) against files in the workspace. Context must match "
            "exactly. Create a file with '--- /dev/null', delete one with '+++ /dev/null'. git's a/ b/ "
            "prefixes are stripped automatically."
        ),
    )
    strip: int | None = Field(
        default=None, ge=0, description="Leading path components to strip (like patch -p); default: auto."
    )


@dataclass
class _Staged:
    cp: ConfinedPath
    original: bytes | None  # on disk before the patch (None: absent)
    current: str | None  # after the sections seen so far (None: absent)
    hunks: int = 0
    added: int = 0
    removed: int = 0
    offsets: list[int] = field(default_factory=list)

    @property
    def action(self) -> FileAction:
        if self.original is None:
            return FileAction.CREATE
        return FileAction.DELETE if self.current is None else FileAction.MODIFY


def _decode(data: bytes, given: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ToolError(ErrorCode.NOT_TEXT, f"{given!r} is not UTF-8 text; cannot patch it") from exc


def _stage(root: Path, patch: str, strip: int | None, max_bytes: int) -> list[_Staged]:
    try:
        sections = parse_unified_diff(patch, strip)
    except DiffError as exc:
        raise ToolError(ErrorCode.PATCH_INVALID, str(exc)) from exc
    staged: dict[tuple[str, ...], _Staged] = {}
    for section in sections:
        cp = confine(root, section.path)
        if not cp.parts:
            raise ToolError(ErrorCode.NOT_A_FILE, f"{section.path!r} is the workspace directory")
        entry = staged.get(cp.parts)
        if entry is None:
            original = read_whole(cp, max_bytes)
            entry = _Staged(cp, original, None if original is None else _decode(original, cp.given))
            staged[cp.parts] = entry
        if section.action is FileAction.CREATE and entry.current is not None:
            raise ToolError(ErrorCode.ALREADY_EXISTS, f"cannot create {cp.given!r}: it already exists")
        if section.action is not FileAction.CREATE and entry.current is None:
            raise ToolError(ErrorCode.NOT_FOUND, f"cannot patch {cp.given!r}: it does not exist")
        try:
            applied = apply_hunks(cp.given, split_lines(entry.current or ""), section.hunks)
        except HunkMismatch as exc:
            raise ToolError(ErrorCode.PATCH_MISMATCH, str(exc)) from exc
        if section.action is FileAction.DELETE and applied.lines:
            raise ToolError(
                ErrorCode.PATCH_MISMATCH,
                f"deleting {cp.given!r}: the hunks leave {len(applied.lines)} line(s) in it",
            )
        new_text = None if section.action is FileAction.DELETE else "".join(applied.lines)
        if new_text is not None and len(new_text.encode("utf-8")) > max_bytes:
            raise ToolError(ErrorCode.TOO_LARGE, f"patched {cp.given!r} would exceed {max_bytes} bytes")
        entry.current = new_text
        entry.hunks += len(section.hunks)
        entry.added += applied.added
        entry.removed += applied.removed
        entry.offsets.extend(applied.offsets)
    return [entry for entry in staged.values() if entry.original != _encoded(entry.current)]


def _encoded(text: str | None) -> bytes | None:
    return None if text is None else text.encode("utf-8")


def _restore(parent: int, entry: _Staged, mode: int | None) -> None:
    """Undo one committed change from the in-memory original (best effort)."""
    if entry.original is None:
        unlink_quietly(parent, entry.cp.name)
        return
    temp = write_temp(parent, entry.cp.name, entry.original, DEFAULT_FILE_MODE if mode is None else mode)
    os.replace(temp, entry.cp.name, src_dir_fd=parent, dst_dir_fd=parent)


def _commit(root: Path, entries: list[_Staged]) -> None:
    created_dirs: list[Path] = []
    parents: dict[int, int] = {}
    modes: dict[int, int | None] = {}
    temps: dict[int, str] = {}
    done: list[int] = []
    failing: _Staged | None = None  # the entry being worked on, to name it in an error
    try:
        for index, entry in enumerate(entries):  # phase 1: everything that can fail slowly
            failing = entry
            create = entry.current is not None
            parents[index] = open_dir(root, entry.cp.parent_parts, create=create, created=created_dirs)
            mode = modes[index] = existing_mode(parents[index], entry.cp.name, entry.cp.given)
            if entry.current is not None:
                data = entry.current.encode("utf-8")
                new_mode = DEFAULT_FILE_MODE if mode is None else mode
                temps[index] = write_temp(parents[index], entry.cp.name, data, new_mode)
        for index, entry in enumerate(entries):  # phase 2: renames and unlinks, quick and rarely failing
            failing = entry
            parent = parents[index]
            if entry.current is None:
                os.unlink(entry.cp.name, dir_fd=parent)
            else:
                os.replace(temps[index], entry.cp.name, src_dir_fd=parent, dst_dir_fd=parent)
                del temps[index]
            done.append(index)
    except BaseException as exc:
        for index, temp in temps.items():
            unlink_quietly(parents[index], temp)
        for index in reversed(done):
            try:
                _restore(parents[index], entries[index], modes[index])
            except OSError:
                pass
        remove_dirs(created_dirs)
        if isinstance(exc, OSError) and failing is not None:
            # A path that changed under us after the check (a symlink or directory swapped in: ELOOP, ENOTDIR,
            # ENOENT) is told as such, like every tool tells it; anything else is an I/O error below.
            named = os_error(exc, failing.cp.given, failing.cp.root)
            if named.code != ErrorCode.IO_ERROR:
                undone = "changes were rolled back" if done else _UNCHANGED
                raise ToolError(named.code, f"{named.message}; {undone}") from exc
        if isinstance(exc, OSError):
            reason = exc.strerror or str(exc)
            message = f"writing the patch failed ({reason}); changes were rolled back"
            raise ToolError(ErrorCode.IO_ERROR, message) from exc
        if isinstance(exc, ToolError):  # only phase 1 raises these: nothing was renamed yet
            raise ToolError(exc.code, f"{exc.message}; {_UNCHANGED}") from exc
        raise
    finally:
        for fd in parents.values():
            os.close(fd)


def _apply_sync(root: Path, patch: str, strip: int | None, max_bytes: int) -> list[_Staged]:
    try:
        entries = _stage(root, patch, strip, max_bytes)
    except ToolError as exc:
        raise ToolError(exc.code, f"{exc.message}; {_UNCHANGED}") from exc
    _commit(root, entries)
    return entries


async def _apply(args: PatchInput, ctx: ToolContext) -> ToolResult:
    entries = await trio.to_thread.run_sync(
        _apply_sync, ctx.workspace, args.patch, args.strip, ctx.limits.patch_max_bytes
    )
    files: list[JsonValue] = [
        {
            "path": entry.cp.rel,
            "action": entry.action.value,
            "hunks": entry.hunks,
            "added": entry.added,
            "removed": entry.removed,
            "offsets": list(entry.offsets),
        }
        for entry in entries
    ]
    summary = ", ".join(f"{e.cp.rel} ({e.action.value}, +{e.added} -{e.removed})" for e in entries)
    return ToolResult(
        content={"files": files},
        preview=f"patched {len(entries)} file(s): {summary}" if entries else "patch applied; no file changed",
        sandbox=workspace_sandbox(ctx),
    )


PATCH_TOOL = Tool(
    name="patch.apply",
    description=(
        "Apply a unified diff to one or more files in the workspace. All or nothing: if any hunk does not "
        "match exactly, no file is changed and the error names the file, the hunk and the first differing line."
    ),
    input_model=PatchInput,
    tool_class=ToolClass.WRITE,
    run=_apply,
)
