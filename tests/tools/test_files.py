"""workspace.read / workspace.write / workspace.list and the registry around them."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest
import trio

from codesdk.protocol import ToolClass, ToolManifest, canonical_hash
from codesdk.supervisor.tools import (
    ExecPolicy,
    ReadInput,
    ToolContext,
    ToolLimits,
    ToolRegistry,
    ToolResult,
    ToolsConfig,
)


def js(value: object) -> Any:
    """A JSON result as ``Any``, for indexing in assertions."""
    return value


async def run(ws: Path, name: str, args: Any, limits: ToolLimits | None = None) -> ToolResult:
    with trio.fail_after(10):
        return await ToolRegistry().execute(name, args, ToolContext(ws, limits or ToolLimits()))


def error_code(result: ToolResult) -> str:
    assert result.is_error, result
    assert isinstance(result.content, dict)
    error = js(result.content)["error"]
    assert isinstance(error, dict)
    return str(error["code"])


def body(result: ToolResult) -> dict[str, Any]:
    assert not result.is_error, result.content
    assert isinstance(result.content, dict)
    return result.content


# --- read -----------------------------------------------------------------------------------------


async def test_read_whole_file(tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_text("one\ntwo\nthree\n")
    result = await run(tmp_path, "workspace.read", {"path": "f.txt"})
    content = body(result)
    assert content["text"] == "one\ntwo\nthree\n"
    assert (content["lines"], content["truncated"], content["has_more"], content["next_offset"]) == (
        3,
        False,
        False,
        None,
    )
    assert result.sandbox.kind == "workspace" and result.sandbox.network is False
    assert result.execution_env == "supervisor:workspace"
    assert len(result.preview) <= 500


async def test_read_offset_and_limit(tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_text("".join(f"line {n}\n" for n in range(10)))
    content = body(await run(tmp_path, "workspace.read", {"path": "f.txt", "offset": 3, "limit": 2}))
    assert content["text"] == "line 3\nline 4\n"
    assert (content["has_more"], content["next_offset"], content["truncated"]) == (True, 5, False)


async def test_read_last_line_without_newline_and_offset_past_end(tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_text("a\nb")
    content = body(await run(tmp_path, "workspace.read", {"path": "f.txt", "offset": 1}))
    assert (content["text"], content["lines"], content["has_more"]) == ("b", 1, False)
    past = body(await run(tmp_path, "workspace.read", {"path": "f.txt", "offset": 5}))
    assert (past["text"], past["lines"], past["past_end"]) == ("", 0, True)


async def test_read_size_cap_adds_a_clear_truncation_marker(tmp_path: Path) -> None:
    (tmp_path / "big.txt").write_text("".join(f"{n:04d}\n" for n in range(1000)))  # 5 bytes a line
    result = await run(tmp_path, "workspace.read", {"path": "big.txt"}, ToolLimits(read_max_bytes=52))
    content = body(result)
    assert content["lines"] == 10 and content["truncated"] and content["next_offset"] == 10
    assert content["text"].startswith("0000\n0001\n")
    assert "[truncated at 52 bytes: showing lines 1-10; continue with offset=10]" in content["text"]
    assert "truncated" in result.preview
    follow = body(await run(tmp_path, "workspace.read", {"path": "big.txt", "offset": 10, "limit": 1}))
    assert follow["text"] == "0010\n"


async def test_read_cuts_a_single_overlong_line(tmp_path: Path) -> None:
    (tmp_path / "long.txt").write_text("x" * 1000 + "\nnext\n")
    content = body(
        await run(tmp_path, "workspace.read", {"path": "long.txt"}, ToolLimits(read_max_bytes=100))
    )
    assert content["text"].startswith("x" * 100 + "\n[truncated at 100 bytes: line 1 is longer")
    assert content["next_offset"] == 1


async def test_read_errors(tmp_path: Path) -> None:
    (tmp_path / "bin").write_bytes(b"\x00\x01\x02")
    (tmp_path / "dir").mkdir()
    os.mkfifo(tmp_path / "fifo")
    assert error_code(await run(tmp_path, "workspace.read", {"path": "missing.txt"})) == "not_found"
    assert error_code(await run(tmp_path, "workspace.read", {"path": "bin"})) == "not_text"
    assert error_code(await run(tmp_path, "workspace.read", {"path": "dir"})) == "not_a_file"
    assert error_code(await run(tmp_path, "workspace.read", {"path": "fifo"})) == "not_a_file"  # and no hang
    assert error_code(await run(tmp_path, "workspace.read", {"path": "."})) == "not_a_file"
    assert error_code(await run(tmp_path, "workspace.read", {"path": "dir/x/y"})) == "not_found"
    (tmp_path / "plain").write_text("p")
    assert error_code(await run(tmp_path, "workspace.read", {"path": "plain/x"})) == "not_a_directory"


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ({}, "path: Field required"),
        ({"path": ""}, "path: String should have at least 1 character"),
        ({"path": "f", "offset": -1}, "offset: Input should be greater than or equal to 0"),
        ({"path": "f", "limit": 0}, "limit: Input should be greater than or equal to 1"),
        ({"path": "f", "lines": 3}, "lines: Extra inputs are not permitted"),
        ("not an object", "Input should be a valid dictionary"),
        (None, "Input should be a valid dictionary"),
    ],
)
async def test_invalid_input_is_an_error_result(tmp_path: Path, args: Any, fragment: str) -> None:
    result = await run(tmp_path, "workspace.read", args)
    assert error_code(result) == "invalid_input"
    assert fragment in js(result.content)["error"]["message"]
    assert js(result.content)["error"]["details"]


# --- write ----------------------------------------------------------------------------------------


async def test_write_creates_file_and_parents(tmp_path: Path) -> None:
    result = await run(tmp_path, "workspace.write", {"path": "new/deep/f.txt", "content": "héllo\n"})
    assert body(result) == {"path": "new/deep/f.txt", "bytes_written": 7, "created": True}
    assert (tmp_path / "new/deep/f.txt").read_text() == "héllo\n"
    assert "created new/deep/f.txt" in result.preview


async def test_write_overwrites_atomically_and_keeps_mode(tmp_path: Path) -> None:
    target = tmp_path / "script.sh"
    target.write_text("old")
    target.chmod(0o755)
    inode_before = target.stat().st_ino
    content = body(await run(tmp_path, "workspace.write", {"path": "script.sh", "content": "new"}))
    assert content["created"] is False
    assert target.read_text() == "new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o755
    assert target.stat().st_ino != inode_before  # replaced by rename, not rewritten in place
    assert sorted(p.name for p in tmp_path.iterdir()) == ["script.sh"]  # no temp files left


async def test_write_errors(tmp_path: Path) -> None:
    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_text("f")
    assert error_code(await run(tmp_path, "workspace.write", {"path": "dir", "content": "x"})) == "not_a_file"
    assert error_code(await run(tmp_path, "workspace.write", {"path": ".", "content": "x"})) == "not_a_file"
    assert error_code(await run(tmp_path, "workspace.write", {"path": "file/sub", "content": "x"})) in {
        "not_a_directory",
        "already_exists",
    }
    too_big = await run(
        tmp_path, "workspace.write", {"path": "big", "content": "x" * 11}, ToolLimits(write_max_bytes=10)
    )
    assert error_code(too_big) == "too_large"
    assert not (tmp_path / "big").exists()
    assert error_code(await run(tmp_path, "workspace.write", {"path": "f"})) == "invalid_input"
    assert error_code(await run(tmp_path, "workspace.write", {"path": "f", "content": 3})) == "invalid_input"


# --- list -----------------------------------------------------------------------------------------


async def test_list_directory(tmp_path: Path) -> None:
    (tmp_path / "b.txt").write_text("12345")
    (tmp_path / "a_dir").mkdir()
    (tmp_path / "link").symlink_to("b.txt")
    (tmp_path / "a_dir" / "inner").write_text("")
    content = body(await run(tmp_path, "workspace.list", {}))
    assert content["entries"] == [
        {"name": "a_dir", "type": "dir", "size": None},
        {"name": "b.txt", "type": "file", "size": 5},
        {"name": "link", "type": "symlink", "size": None},
    ]
    assert (content["total"], content["truncated"]) == (3, False)
    inner = body(await run(tmp_path, "workspace.list", {"path": "a_dir"}))
    assert [e["name"] for e in inner["entries"]] == ["inner"]


async def test_list_cap_and_errors(tmp_path: Path) -> None:
    for n in range(5):
        (tmp_path / f"f{n}").write_text("")
    content = body(await run(tmp_path, "workspace.list", {"path": "."}, ToolLimits(list_max_entries=2)))
    assert ([e["name"] for e in content["entries"]], content["total"], content["truncated"]) == (
        ["f0", "f1"],
        5,
        True,
    )
    assert error_code(await run(tmp_path, "workspace.list", {"path": "f0"})) == "not_a_directory"
    assert error_code(await run(tmp_path, "workspace.list", {"path": "nope"})) == "not_found"


# --- registry -------------------------------------------------------------------------------------


def test_default_manifest_has_the_file_tools_and_no_exec() -> None:
    registry = ToolRegistry()
    manifest = registry.manifest()
    assert isinstance(manifest, ToolManifest)
    assert manifest.names() == ["workspace.read", "workspace.write", "patch.apply", "workspace.list"]
    classes = {tool.name: tool.tool_class for tool in manifest.tools}
    assert classes == {
        "workspace.read": ToolClass.READ_ONLY,
        "workspace.write": ToolClass.WRITE,
        "patch.apply": ToolClass.WRITE,
        "workspace.list": ToolClass.READ_ONLY,
    }
    read = manifest.get("workspace.read")
    assert read is not None
    assert read.input_schema == ReadInput.model_json_schema()
    assert read.input_schema["additionalProperties"] is False
    assert all(tool.description for tool in manifest.tools)


def test_manifest_with_exec_and_disabled_tools() -> None:
    registry = ToolRegistry(
        ToolsConfig(
            exec=ExecPolicy(enabled=True, allowlist=("echo",)), disabled=frozenset({"workspace.list"})
        )
    )
    assert registry.manifest().names() == [
        "workspace.read",
        "workspace.write",
        "patch.apply",
        "workspace.exec",
    ]
    exec_spec = registry.spec("workspace.exec")
    assert exec_spec is not None and exec_spec.tool_class is ToolClass.DANGEROUS
    assert registry.manifest_hash() == canonical_hash(registry.manifest())
    assert registry.manifest_hash() != ToolRegistry().manifest_hash()
    assert ToolRegistry().manifest_hash() == ToolRegistry().manifest_hash()


async def test_unknown_and_disabled_tools_are_error_results(tmp_path: Path) -> None:
    unknown = await run(tmp_path, "no.such.tool", {})
    assert error_code(unknown) == "unknown_tool"
    assert "not enabled" in unknown.preview
    listed = ToolRegistry(ToolsConfig(disabled=frozenset({"workspace.list"})))
    with trio.fail_after(5):
        result = await listed.execute("workspace.list", {}, ToolContext(tmp_path))
    assert error_code(result) == "unknown_tool"


async def test_missing_workspace_is_a_clear_error(tmp_path: Path) -> None:
    result = await run(tmp_path / "gone", "workspace.read", {"path": "f"})
    assert error_code(result) == "not_found"
    assert "workspace" in js(result.content)["error"]["message"]


def test_preview_is_clipped() -> None:
    result = ToolResult(content=None, preview="x" * 2000)
    assert len(result.preview) == 500


@pytest.mark.skipif(os.geteuid() != 0, reason="giving files to another uid needs root")
async def test_what_the_tools_create_belongs_to_the_workspace_owner(tmp_path: Path) -> None:
    """With per-namespace uids a workspace belongs to the namespace: new files and directories take the owner of
    the directory they are made in, and an overwritten or patched file keeps its owner."""
    ws = tmp_path / "ws"
    ws.mkdir()
    os.chown(ws, 4242, 4343)
    (ws / "theirs.txt").write_text("a\n")
    os.chown(ws / "theirs.txt", 5151, 5252)
    assert not (await run(ws, "workspace.write", {"path": "deep/new.txt", "content": "x\n"})).is_error
    assert not (await run(ws, "workspace.write", {"path": "theirs.txt", "content": "b\n"})).is_error
    patch = "--- a/theirs.txt\n+++ b/theirs.txt\n@@ -1 +1 @@\n-b\n+c\n"
    assert not (await run(ws, "patch.apply", {"patch": patch})).is_error
    owners = {p.relative_to(ws).as_posix(): (p.stat().st_uid, p.stat().st_gid)
              for p in (ws / "deep", ws / "deep" / "new.txt", ws / "theirs.txt")}
    assert owners == {"deep": (4242, 4343), "deep/new.txt": (4242, 4343), "theirs.txt": (5151, 5252)}
    assert (ws / "theirs.txt").read_text() == "c\n"
