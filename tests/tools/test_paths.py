"""Path confinement: absolute paths, '..', and symlink escapes are refused; real files and symlinks."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from codesdk.supervisor import namespaces
from codesdk.supervisor.tools import ErrorCode, ToolContext, ToolError, ToolRegistry, confine
from codesdk.supervisor.tools._paths import open_dir


def js(value: object) -> Any:
    """A JSON result as ``Any``, for indexing in assertions."""
    return value


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, Path]:
    """A workspace with a real dir, an outside dir, and symlinks of every kind."""
    ws = tmp_path / "ws"
    outside = tmp_path / "outside"
    (ws / "a").mkdir(parents=True)
    outside.mkdir()
    (ws / "a" / "f.txt").write_text("inside\n")
    (outside / "secret.txt").write_text("secret\n")
    (ws / "out_dir").symlink_to(outside)  # symlinked dir pointing outside
    (ws / "out_file").symlink_to(outside / "secret.txt")  # symlinked file pointing outside
    (ws / "dangling_out").symlink_to(outside / "not-yet.txt")  # dangling, outside
    (ws / "in_dir").symlink_to(ws / "a")  # symlink that stays inside
    (ws / "in_file").symlink_to("a/f.txt")  # relative, stays inside
    (ws / "loop1").symlink_to("loop2")
    (ws / "loop2").symlink_to("loop1")
    return ws, outside


def _refused(ws: Path, path: str) -> str:
    with pytest.raises(ToolError) as info:
        confine(ws, path)
    assert info.value.code is ErrorCode.PATH_REFUSED
    return info.value.message


def test_plain_paths_resolve_inside(layout: tuple[Path, Path]) -> None:
    ws, _ = layout
    assert confine(ws, "a/f.txt").parts == ("a", "f.txt")
    assert confine(ws, "./a/./f.txt").rel == "a/f.txt"
    assert confine(ws, "a/../a/f.txt").rel == "a/f.txt"
    assert confine(ws, "new/dir/file").rel == "new/dir/file"
    assert confine(ws, ".").parts == ()
    assert confine(ws, "").parts == ()


def test_symlinks_inside_resolve_to_their_target(layout: tuple[Path, Path]) -> None:
    ws, _ = layout
    assert confine(ws, "in_dir/f.txt").rel == "a/f.txt"
    assert confine(ws, "in_file").rel == "a/f.txt"
    assert confine(ws, "in_dir/new.txt").rel == "a/new.txt"


@pytest.mark.parametrize("path", ["/etc/passwd", "/", "//x"])
def test_absolute_paths_refused(layout: tuple[Path, Path], path: str) -> None:
    assert "absolute" in _refused(layout[0], path)


@pytest.mark.parametrize("path", ["..", "../x", "a/../../x", "a/b/../../../outside/secret.txt", "./.."])
def test_dotdot_escapes_refused(layout: tuple[Path, Path], path: str) -> None:
    assert "'..'" in _refused(layout[0], path)


@pytest.mark.parametrize(
    "path",
    [
        "out_dir",
        "out_dir/secret.txt",
        "out_dir/new-file.txt",  # not-yet-existing file under a symlinked dir
        "out_dir/deeper/new.txt",
        "out_file",
        "dangling_out",
        "in_dir/../out_dir/secret.txt",
        "out_dir/..",  # the kernel applies '..' after the symlink: the outside dir's parent
    ],
)
def test_symlink_escapes_refused(layout: tuple[Path, Path], path: str) -> None:
    assert "symlink" in _refused(layout[0], path)


def test_nul_byte_refused(layout: tuple[Path, Path]) -> None:
    assert "NUL" in _refused(layout[0], "a\x00b")


def test_walk_refuses_a_symlink_component_even_if_it_appears_after_the_check(
    layout: tuple[Path, Path],
) -> None:
    """The O_NOFOLLOW walk is the second line of defence against a swapped-in symlink."""
    ws, _ = layout
    with pytest.raises(OSError) as info:
        open_dir(ws.resolve(), ("out_dir",))
    assert info.value.errno in (40, 20)  # ELOOP (or ENOTDIR on some kernels)


@pytest.mark.parametrize(("name", "errno_"), [("in_dir", errno.ELOOP), ("out_file", errno.ELOOP),
                                              ("loop1", errno.ELOOP), ("a/f.txt", errno.ENOTDIR)])
def test_the_shared_opener_refuses_every_symlink_as_eloop(layout: tuple[Path, Path], name: str, errno_: int) -> None:
    """Symlinks to a directory (even inside), to a file, or in a loop: ELOOP, the refusal; a plain file: ENOTDIR."""
    ws, _ = layout
    root = os.open(ws, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(OSError) as info:
            namespaces.open_dir(name, root)
        assert info.value.errno == errno_
        fd = namespaces.open_dir("a", root)
        os.close(fd)
        assert not namespaces.make_dir("a", root, 0o700) and namespaces.make_dir("new", root, 0o700)
    finally:
        os.close(root)


async def _call(ws: Path, name: str, args: dict[str, object]) -> tuple[bool, str, object]:
    with trio.fail_after(10):
        result = await ToolRegistry().execute(name, args, ToolContext(ws))
    code = js(result.content)["error"]["code"] if result.is_error else ""
    return result.is_error, str(code), result.content


@pytest.mark.parametrize("path", ["out_file", "out_dir/secret.txt", "/etc/hostname", "../outside/secret.txt"])
async def test_read_through_escape_is_refused(layout: tuple[Path, Path], path: str) -> None:
    is_error, code, _ = await _call(layout[0], "workspace.read", {"path": path})
    assert (is_error, code) == (True, "path_refused")


@pytest.mark.parametrize("path", ["out_dir/new.txt", "out_dir/sub/new.txt", "dangling_out", "out_file"])
async def test_write_through_escape_is_refused_and_nothing_is_written(
    layout: tuple[Path, Path], path: str
) -> None:
    ws, outside = layout
    before = sorted(p.name for p in outside.rglob("*"))
    is_error, code, _ = await _call(ws, "workspace.write", {"path": path, "content": "pwned"})
    assert (is_error, code) == (True, "path_refused")
    assert sorted(p.name for p in outside.rglob("*")) == before
    assert (outside / "secret.txt").read_text() == "secret\n"


async def test_list_through_escape_is_refused(layout: tuple[Path, Path]) -> None:
    is_error, code, _ = await _call(layout[0], "workspace.list", {"path": "out_dir"})
    assert (is_error, code) == (True, "path_refused")


async def test_symlink_loop_gives_a_clear_error(layout: tuple[Path, Path]) -> None:
    is_error, code, content = await _call(layout[0], "workspace.read", {"path": "loop1"})
    assert is_error
    assert code in {"path_refused", "not_found"}
    assert "loop1" in str(content)


async def test_write_through_inside_symlink_writes_the_target(layout: tuple[Path, Path]) -> None:
    ws, _ = layout
    is_error, _, content = await _call(ws, "workspace.write", {"path": "in_dir/g.txt", "content": "g"})
    assert not is_error
    assert js(content)["path"] == "a/g.txt"
    assert (ws / "a" / "g.txt").read_text() == "g"


# --- property: never resolves outside -------------------------------------------------------------

_SEGMENTS = st.sampled_from(["a", "..", ".", "", "out_dir", "in_dir", "missing", "f.txt"])


@pytest.fixture(scope="module")
def prop_workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("prop")
    ws = base / "ws"
    (ws / "a").mkdir(parents=True)
    (ws / "a" / "f.txt").write_text("x")
    (base / "outside").mkdir()
    (ws / "out_dir").symlink_to(base / "outside")
    (ws / "in_dir").symlink_to(ws / "a")
    return ws


@settings(max_examples=400, deadline=None, database=None)
@given(segments=st.lists(_SEGMENTS, min_size=1, max_size=8))
def test_random_paths_resolve_inside_or_are_refused(prop_workspace: Path, segments: list[str]) -> None:
    raw = "/".join(segments)
    root = Path(os.path.realpath(prop_workspace))
    try:
        confined = confine(prop_workspace, raw)
    except ToolError as exc:
        assert exc.code is ErrorCode.PATH_REFUSED
        return
    resolved = Path(os.path.realpath(confined.path))
    assert resolved.is_relative_to(root), (raw, resolved)
    assert confined.path == root.joinpath(*confined.parts)
    assert ".." not in confined.parts
