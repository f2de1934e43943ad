"""Unified diff parsing and exact (fuzz-free) hunk application. Pure: no IO, strings in, strings out.

Lines keep their terminators (``"x\\n"``; the last line of a file may lack one, which a diff marks with
``\\ No newline at end of file``), so a match is byte-for-byte exact, CRLF and final newline included.
A hunk is tried at the line its header names; when the context there differs it may still match at
another position (an *offset*, as ``patch``/``git apply`` allow), the nearest one winning (the earlier on
a tie). The content itself must match exactly: there is no fuzz.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

_HUNK_HEADER = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_SHOW_MAX = 120


class DiffError(ValueError):
    """The diff text itself is malformed or unsupported."""


class HunkMismatch(ValueError):
    """A well-formed hunk does not match the file it targets."""

    def __init__(self, path: str, number: int, header: str, detail: str) -> None:
        self.path = path
        self.number = number
        self.header = header
        self.detail = detail
        super().__init__(f"hunk {number} of {path!r} ({header}) does not apply: {detail}")


class FileAction(StrEnum):
    CREATE = "created"
    MODIFY = "modified"
    DELETE = "deleted"


@dataclass(frozen=True)
class Hunk:
    number: int
    header: str
    old_start: int
    old_count: int
    new_start: int
    new_count: int
    old_lines: tuple[str, ...]
    new_lines: tuple[str, ...]
    added: int
    removed: int

    @property
    def anchor(self) -> int:
        """0-based index in the old file where ``old_lines`` should start (``-l,0`` inserts after line l)."""
        return self.old_start - 1 if self.old_count else self.old_start


@dataclass(frozen=True)
class FilePatch:
    old_path: str | None  # None: /dev/null (the file is created)
    new_path: str | None  # None: /dev/null (the file is deleted)
    hunks: tuple[Hunk, ...]

    @property
    def path(self) -> str:
        path = self.new_path if self.new_path is not None else self.old_path
        assert path is not None
        return path

    @property
    def action(self) -> FileAction:
        if self.old_path is None:
            return FileAction.CREATE
        return FileAction.DELETE if self.new_path is None else FileAction.MODIFY


def split_lines(text: str) -> list[str]:
    """Split on ``\\n`` only, keeping terminators; a missing final newline leaves the last line bare."""
    lines = [line + "\n" for line in text.split("\n")]
    lines[-1] = lines[-1][:-1]
    if not lines[-1]:
        lines.pop()
    return lines


def _unquote(name: str) -> str:
    """Undo git's C-style quoting of unusual file names (``"a/sp\\303\\251c"``)."""
    try:
        raw = name[1:-1].encode("latin-1", "backslashreplace").decode("unicode_escape")
        return raw.encode("latin-1").decode("utf-8")
    except (UnicodeError, ValueError) as exc:
        raise DiffError(f"cannot decode quoted file name {name}") from exc


def _header_path(field: str) -> str | None:
    name = field.rstrip("\r").split("\t", 1)[0]
    if len(name) >= 2 and name.startswith('"') and name.endswith('"'):
        name = _unquote(name)
    if not name:
        raise DiffError("a ---/+++ header has no file name")
    return None if name == "/dev/null" else name


def _strip(path: str | None, count: int) -> str | None:
    if path is None or count == 0:
        return path
    parts = path.split("/")
    if len(parts) <= count:
        raise DiffError(f"cannot strip {count} leading component(s) from {path!r}")
    return "/".join(parts[count:])


def _strip_count(old: str | None, new: str | None, strip: int | None) -> int:
    """Explicit ``strip`` wins; otherwise drop git's ``a/``/``b/`` prefixes when both sides carry them."""
    if strip is not None:
        return strip
    git_old = old is None or old.startswith("a/")
    git_new = new is None or new.startswith("b/")
    return 1 if git_old and git_new else 0


def _parse_hunk(lines: list[str], start: int, path: str, number: int) -> tuple[Hunk, int]:
    header = lines[start].rstrip("\r")
    match = _HUNK_HEADER.match(header)
    if match is None:
        raise DiffError(f"malformed hunk header at diff line {start + 1} for {path!r}: {header!r}")
    old_start, new_start = int(match[1]), int(match[3])
    old_count = 1 if match[2] is None else int(match[2])
    new_count = 1 if match[4] is None else int(match[4])
    header = match[0]
    old: list[str] = []
    new: list[str] = []
    index = start + 1
    while len(old) < old_count or len(new) < new_count:
        if index >= len(lines) or lines[index].startswith("@@"):
            raise DiffError(
                f"hunk {number} of {path!r} ({header}) ends early: the header promises {old_count} old and "
                f"{new_count} new lines, the body has {len(old)} and {len(new)}"
            )
        raw = lines[index]
        tag, body = (raw[:1], raw[1:]) if raw else (" ", "")  # a blank line is blank context
        if tag == "\\":
            index += 1
            continue
        ending = "" if index + 1 < len(lines) and lines[index + 1].startswith("\\") else "\n"
        if tag not in " -+":
            raise DiffError(
                f"hunk {number} of {path!r} ({header}): unexpected diff line {index + 1}: {raw!r}"
            )
        if (tag in " -" and len(old) >= old_count) or (tag in " +" and len(new) >= new_count):
            raise DiffError(
                f"hunk {number} of {path!r} ({header}) has more lines than its header counts "
                f"(at diff line {index + 1})"
            )
        if tag in " -":
            old.append(body + ending)
        if tag in " +":
            new.append(body + ending)
        index += 1
    while index < len(lines) and lines[index].startswith("\\"):
        index += 1
    removed = sum(1 for line in lines[start + 1 : index] if line.startswith("-"))
    added = sum(1 for line in lines[start + 1 : index] if line.startswith("+"))
    hunk = Hunk(
        number, header, old_start, old_count, new_start, new_count, tuple(old), tuple(new), added, removed
    )
    return hunk, index


def parse_unified_diff(text: str, strip: int | None = None) -> tuple[FilePatch, ...]:
    """Parse every ``---``/``+++`` file section and its hunks; text between sections is ignored."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    files: list[FilePatch] = []
    index = 0
    while index < len(lines):
        line = lines[index]
        if line.startswith("@@"):
            raise DiffError(f"hunk at diff line {index + 1} has no ---/+++ file header before it")
        if not (line.startswith("--- ") and index + 1 < len(lines) and lines[index + 1].startswith("+++ ")):
            index += 1
            continue
        old, new = _header_path(line[4:]), _header_path(lines[index + 1][4:])
        count = _strip_count(old, new, strip)
        old, new = _strip(old, count), _strip(new, count)
        if old is None and new is None:
            raise DiffError(f"diff line {index + 1}: both sides are /dev/null")
        if old is not None and new is not None and old != new:
            raise DiffError(f"renaming {old!r} to {new!r} is not supported; patch files in place")
        path = new if new is not None else old
        assert path is not None
        index += 2
        hunks: list[Hunk] = []
        while index < len(lines) and lines[index].startswith("@@"):
            hunk, index = _parse_hunk(lines, index, path, len(hunks) + 1)
            hunks.append(hunk)
        if not hunks:
            raise DiffError(f"file section for {path!r} has no hunks")
        files.append(FilePatch(old, new, tuple(hunks)))
    if not files:
        raise DiffError("no file sections found: expected a unified diff with ---/+++ headers and @@ hunks")
    return tuple(files)


def _show(line: str) -> str:
    shown = repr(line.removesuffix("\n"))
    if len(shown) > _SHOW_MAX:
        shown = shown[: _SHOW_MAX - 4] + "...'"
    return shown if line.endswith("\n") else shown + " (no newline at end of file)"


def _matches(lines: list[str], expected: tuple[str, ...], at: int) -> bool:
    return (
        0 <= at
        and at + len(expected) <= len(lines)
        and all(lines[at + offset] == want for offset, want in enumerate(expected))
    )


def _first_mismatch(lines: list[str], hunk: Hunk, at: int) -> str:
    """Describe where the hunk's old side first differs from the file when tried at ``at``."""
    for offset, want in enumerate(hunk.old_lines):
        where = at + offset
        if where >= len(lines):
            return f"the file ends after line {len(lines)}, but the hunk expects line {where + 1} to be {_show(want)}"
        if lines[where] != want:
            found = lines[where]
            same_text = found.rstrip("\r\n") == want.rstrip("\r\n")
            hint = " (they differ only in line ending / final newline)" if same_text else ""
            return f"line {where + 1} should be {_show(want)} but the file has {_show(found)}{hint}"
    return f"the hunk cannot be placed at line {at + 1} (file has {len(lines)} lines)"


def _locate(lines: list[str], hunk: Hunk, floor: int) -> int | None:
    """Where the hunk's old side matches exactly: its anchor, else the nearest position at/after ``floor``."""
    anchor = hunk.anchor
    if not hunk.old_lines:
        return anchor if floor <= anchor <= len(lines) else None
    if anchor >= floor and _matches(lines, hunk.old_lines, anchor):
        return anchor
    last = len(lines) - len(hunk.old_lines)
    for distance in range(1, max(abs(anchor - floor), abs(last - anchor)) + 1):
        for at in (anchor - distance, anchor + distance):
            if floor <= at <= last and _matches(lines, hunk.old_lines, at):
                return at
    return None


@dataclass(frozen=True)
class Applied:
    lines: list[str]
    offsets: tuple[int, ...]  # per hunk: where it applied minus where its header said
    added: int
    removed: int


def apply_hunks(path: str, lines: list[str], hunks: tuple[Hunk, ...]) -> Applied:
    """Apply hunks in order to ``lines`` (the old file); raise ``HunkMismatch`` on the first that fails."""
    out: list[str] = []
    cursor = 0
    offsets: list[int] = []
    added = removed = 0
    for hunk in hunks:
        at = _locate(lines, hunk, cursor)
        if at is None:
            detail = _first_mismatch(lines, hunk, max(hunk.anchor, cursor))
            if hunk.anchor < cursor:
                detail = f"it overlaps the previous hunk, which ended at line {cursor}; {detail}"
            raise HunkMismatch(path, hunk.number, hunk.header, detail)
        out.extend(lines[cursor:at])
        out.extend(hunk.new_lines)
        cursor = at + len(hunk.old_lines)
        offsets.append(at - hunk.anchor)
        added += hunk.added
        removed += hunk.removed
    out.extend(lines[cursor:])
    return Applied(out, tuple(offsets), added, removed)
