"""patch.apply: unified diffs, exact context, all-or-nothing across files, create/delete, clear errors."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import trio

from codesdk.supervisor.tools import (
    DiffError,
    HunkMismatch,
    ToolContext,
    ToolRegistry,
    ToolResult,
    apply_hunks,
    parse_unified_diff,
    split_lines,
)

APP = "".join(f"line {n}\n" for n in range(1, 21))


def js(value: object) -> Any:
    """A JSON result as ``Any``, for indexing in assertions."""
    return value


async def patch(ws: Path, diff: str, **extra: Any) -> ToolResult:
    with trio.fail_after(10):
        return await ToolRegistry().execute("patch.apply", {"patch": diff, **extra}, ToolContext(ws))


def error_message(result: ToolResult) -> tuple[str, str]:
    assert result.is_error, result.content
    error = js(result.content)["error"]
    return error["code"], error["message"]


def snapshot(ws: Path) -> dict[str, tuple[bytes, int]]:
    """Every file (content, mtime_ns) and every directory under the workspace."""
    state: dict[str, tuple[bytes, int]] = {}
    for path in sorted(ws.rglob("*")):
        rel = str(path.relative_to(ws))
        state[rel] = (path.read_bytes(), path.stat().st_mtime_ns) if path.is_file() else (b"<dir>", 0)
    return state


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "app.py").write_text(APP)
    (tmp_path / "README").write_text("hello\nworld\n")
    (tmp_path / "old.txt").write_text("bye\nnow\n")
    return tmp_path


MULTI_HUNK = """\
--- a/src/app.py
+++ b/src/app.py
@@ -2,3 +2,3 @@
 line 2
-line 3
+LINE THREE
 line 4
@@ -15,3 +15,5 @@
 line 15
 line 16
+inserted a
+inserted b
 line 17
"""


async def test_multi_hunk_single_file(ws: Path) -> None:
    result = await patch(ws, MULTI_HUNK)
    assert not result.is_error, result.content
    text = (ws / "src" / "app.py").read_text()
    assert "LINE THREE\n" in text and "line 3\n" not in text
    assert "line 16\ninserted a\ninserted b\nline 17\n" in text
    assert result.content == {
        "files": [
            {
                "path": "src/app.py",
                "action": "modified",
                "hunks": 2,
                "added": 3,
                "removed": 1,
                "offsets": [0, 0],
            }
        ]
    }
    assert result.preview == "patched 1 file(s): src/app.py (modified, +3 -1)"


async def test_multi_file_with_create_and_delete(ws: Path) -> None:
    diff = """\
diff --git a/README b/README
index 1111111..2222222 100644
--- a/README
+++ b/README
@@ -1,2 +1,2 @@
-hello
+HELLO
 world
diff --git a/docs/new.md b/docs/new.md
new file mode 100644
--- /dev/null
+++ b/docs/new.md
@@ -0,0 +1,2 @@
+# New
+text
diff --git a/old.txt b/old.txt
deleted file mode 100644
--- a/old.txt
+++ /dev/null
@@ -1,2 +0,0 @@
-bye
-now
"""
    result = await patch(ws, diff)
    assert not result.is_error, result.content
    assert (ws / "README").read_text() == "HELLO\nworld\n"
    assert (ws / "docs" / "new.md").read_text() == "# New\ntext\n"
    assert not (ws / "old.txt").exists()
    actions = {f["path"]: f["action"] for f in js(result.content)["files"]}
    assert actions == {"README": "modified", "docs/new.md": "created", "old.txt": "deleted"}


async def test_failing_hunk_in_a_later_file_leaves_every_file_untouched(ws: Path) -> None:
    before = snapshot(ws)
    diff = """\
--- a/README
+++ b/README
@@ -1,2 +1,2 @@
-hello
+HELLO
 world
--- /dev/null
+++ b/brand/new.txt
@@ -0,0 +1 @@
+new
--- a/src/app.py
+++ b/src/app.py
@@ -2,2 +2,2 @@
 line 2
-line 3
+x
@@ -10,3 +10,3 @@
 line 10
-line eleven
+y
 line 12
"""
    code, message = error_message(await patch(ws, diff))
    assert code == "patch_mismatch"
    assert "hunk 2 of 'src/app.py' (@@ -10,3 +10,3 @@) does not apply" in message
    assert "line 11 should be 'line eleven' but the file has 'line 11'" in message
    assert message.endswith("no file was changed")
    assert snapshot(ws) == before  # README untouched, brand/ not created, app.py untouched


async def test_offset_is_tolerated_but_context_must_match_exactly(ws: Path) -> None:
    shifted = "--- a/src/app.py\n+++ b/src/app.py\n@@ -1,3 +1,3 @@\n line 7\n-line 8\n+EIGHT\n line 9\n"
    result = await patch(ws, shifted)
    assert not result.is_error, result.content
    assert js(result.content)["files"][0]["offsets"] == [6]
    assert "line 7\nEIGHT\nline 9\n" in (ws / "src" / "app.py").read_text()
    fuzzy = "--- a/src/app.py\n+++ b/src/app.py\n@@ -1,3 +1,3 @@\n line 1 \n-line 2\n+TWO\n line 3\n"
    code, message = error_message(await patch(ws, fuzzy))
    assert code == "patch_mismatch"
    assert "line 1 should be 'line 1 ' but the file has 'line 1'" in message


async def test_no_newline_at_end_of_file(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("a\nb")
    diff = "--- f\n+++ f\n@@ -1,2 +1,2 @@\n a\n-b\n\\ No newline at end of file\n+c\n"
    result = await patch(tmp_path, diff)
    assert not result.is_error, result.content
    assert (tmp_path / "f").read_text() == "a\nc\n"
    missing_marker = "--- f\n+++ f\n@@ -1,2 +1,2 @@\n a\n-c\n+d\n\\ No newline at end of file\n"
    assert not (await patch(tmp_path, missing_marker)).is_error
    assert (tmp_path / "f").read_text() == "a\nd"
    _, message = error_message(await patch(tmp_path, "--- f\n+++ f\n@@ -2 +2 @@\n-d\n+e\n"))
    assert "differ only in line ending / final newline" in message


async def test_crlf_files_match_exactly(tmp_path: Path) -> None:
    (tmp_path / "w.txt").write_bytes(b"one\r\ntwo\r\n")
    code, message = error_message(
        await patch(tmp_path, "--- w.txt\n+++ w.txt\n@@ -1,2 +1,2 @@\n one\n-two\n+2\n")
    )
    assert code == "patch_mismatch" and "line ending" in message
    ok = await patch(tmp_path, "--- w.txt\n+++ w.txt\n@@ -1,2 +1,2 @@\n one\r\n-two\r\n+2\r\n")
    assert not ok.is_error, ok.content
    assert (tmp_path / "w.txt").read_bytes() == b"one\r\n2\r\n"


async def test_same_file_twice_applies_in_order(ws: Path) -> None:
    diff = (
        "--- README\n+++ README\n@@ -1 +1 @@\n-hello\n+hi\n--- README\n+++ README\n@@ -1 +1 @@\n-hi\n+hey\n"
    )
    result = await patch(ws, diff)
    assert not result.is_error, result.content
    assert (ws / "README").read_text() == "hey\nworld\n"


@pytest.mark.parametrize(
    ("diff", "code", "fragment"),
    [
        ("just some text\n", "patch_invalid", "no file sections found"),
        ("@@ -1 +1 @@\n-a\n+b\n", "patch_invalid", "has no ---/+++ file header"),
        ("--- README\n+++ README\n@@ -1,2 +1,2 @@\n-hello\n", "patch_invalid", "ends early"),
        (
            "--- README\n+++ README\n@@ -1 +1 @@\n-hello\n-world\n+x\n",
            "patch_invalid",
            "more lines than its header",
        ),
        ("--- README\n+++ README\n@@ bogus @@\n", "patch_invalid", "malformed hunk header"),
        ("--- README\n+++ README\n", "patch_invalid", "has no hunks"),
        ("--- a/README\n+++ b/RENAMED\n@@ -1 +1 @@\n-hello\n+x\n", "patch_invalid", "renaming"),
        ("--- README\n+++ README\n@@ -1 +1 @@\n*hello\n", "patch_invalid", "unexpected diff line"),
        ("--- /dev/null\n+++ README\n@@ -0,0 +1 @@\n+x\n", "already_exists", "cannot create 'README'"),
        ("--- nope\n+++ nope\n@@ -1 +1 @@\n-a\n+b\n", "not_found", "cannot patch 'nope'"),
        ("--- README\n+++ /dev/null\n@@ -1 +0,0 @@\n-hello\n", "patch_mismatch", "leave 1 line(s)"),
        ("--- ../x\n+++ ../x\n@@ -1 +1 @@\n-a\n+b\n", "path_refused", "'..' would leave"),
        ("--- /etc/passwd\n+++ /etc/passwd\n@@ -1 +1 @@\n-a\n+b\n", "path_refused", "absolute"),
    ],
)
async def test_errors_are_clear_and_change_nothing(ws: Path, diff: str, code: str, fragment: str) -> None:
    before = snapshot(ws)
    got_code, message = error_message(await patch(ws, diff))
    assert (got_code, fragment in message) == (code, True), message
    assert message.endswith("no file was changed")
    assert snapshot(ws) == before


async def test_patch_through_symlink_escape_is_refused(
    ws: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    outside = tmp_path_factory.mktemp("outside")
    (outside / "t.txt").write_text("a\n")
    (ws / "link").symlink_to(outside)
    code, _ = error_message(await patch(ws, "--- link/t.txt\n+++ link/t.txt\n@@ -1 +1 @@\n-a\n+b\n"))
    assert code == "path_refused"
    code, _ = error_message(await patch(ws, "--- /dev/null\n+++ link/new.txt\n@@ -0,0 +1 @@\n+b\n"))
    assert code == "path_refused"
    assert sorted(p.name for p in outside.iterdir()) == ["t.txt"]
    assert (outside / "t.txt").read_text() == "a\n"


async def test_explicit_strip(ws: Path) -> None:
    diff = "--- x/y/README\n+++ x/y/README\n@@ -1 +1 @@\n-hello\n+bye\n"
    assert not (await patch(ws, diff, strip=2)).is_error
    assert (ws / "README").read_text() == "bye\nworld\n"


async def test_commit_failure_rolls_back_what_was_already_written(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (ws / "README").chmod(0o751)
    before = snapshot(ws)
    real_replace = os.replace
    calls = {"n": 0}

    def flaky_replace(*args: Any, **kwargs: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(28, "No space left on device")
        real_replace(*args, **kwargs)

    monkeypatch.setattr(os, "replace", flaky_replace)
    diff = (
        "--- README\n+++ README\n@@ -1 +1 @@\n-hello\n+HELLO\n"
        "--- /dev/null\n+++ made/new.txt\n@@ -0,0 +1 @@\n+new\n"
    )
    code, message = error_message(await patch(ws, diff))
    assert code == "disk_full" and "rolled back" in message and "No space left" in message
    after = snapshot(ws)
    assert {k: v[0] for k, v in after.items()} == {k: v[0] for k, v in before.items()}
    assert (ws / "README").stat().st_mode & 0o777 == 0o751


# --- the pure parser/applier ----------------------------------------------------------------------


def test_split_lines_keeps_terminators() -> None:
    assert split_lines("a\nb\n") == ["a\n", "b\n"]
    assert split_lines("a\r\nb") == ["a\r\n", "b"]
    assert split_lines("") == []
    assert split_lines("\n") == ["\n"]


def test_parse_git_prefixes_quotes_and_timestamps() -> None:
    diff = (
        '--- "a/sp ace/caf\\303\\251.txt"\t2024-01-01 00:00:00\n'
        '+++ "b/sp ace/caf\\303\\251.txt"\t2024-01-02 00:00:00\n'
        "@@ -1 +1,2 @@\n x\n+y\n"
    )
    (section,) = parse_unified_diff(diff)
    assert section.path == "sp ace/café.txt"
    assert section.hunks[0].old_lines == ("x\n",) and section.hunks[0].new_lines == ("x\n", "y\n")


def test_parse_blank_context_line_without_leading_space() -> None:
    (section,) = parse_unified_diff("--- f\n+++ f\n@@ -1,3 +1,3 @@\n a\n\n-b\n+c\n")
    assert section.hunks[0].old_lines == ("a\n", "\n", "b\n")


def test_parse_rejects_both_dev_null() -> None:
    with pytest.raises(DiffError, match="both sides"):
        parse_unified_diff("--- /dev/null\n+++ /dev/null\n@@ -0,0 +1 @@\n+x\n")


def test_apply_hunks_nearest_offset_and_overlap() -> None:
    lines = split_lines("x\ny\nx\ny\nx\ny\n")
    (section,) = parse_unified_diff("--- f\n+++ f\n@@ -4,2 +4,2 @@\n x\n-y\n+Y\n")
    applied = apply_hunks("f", lines, section.hunks)
    # the anchor (line 4, 'y') does not match; lines 3 and 5 are equally near: the earlier wins
    assert "".join(applied.lines) == "x\ny\nx\nY\nx\ny\n"
    assert applied.offsets == (-1,)
    (overlap,) = parse_unified_diff("--- f\n+++ f\n@@ -1,2 +1,2 @@\n x\n-y\n+Y\n@@ -1,1 +1,1 @@\n-x\n+X\n")
    with pytest.raises(HunkMismatch) as info:
        apply_hunks("f", split_lines("x\ny\n"), overlap.hunks)
    assert info.value.number == 2 and "overlaps the previous hunk" in str(info.value)


def test_apply_hunk_past_end_of_file() -> None:
    (section,) = parse_unified_diff("--- f\n+++ f\n@@ -1,3 +1,3 @@\n a\n b\n-c\n+C\n")
    with pytest.raises(HunkMismatch) as info:
        apply_hunks("f", split_lines("a\nb\n"), section.hunks)
    assert "the file ends after line 2, but the hunk expects line 3 to be 'c'" in str(info.value)
