"""Walking a tree a tenant can change while it is walked: a directory swapped for a symlink between being listed
and being entered is never followed, so nothing done per entry (a chown as root) reaches outside the tree."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from codesdk.supervisor.namespaces import Identity, hand_over, open_dir, walk_tree


def _tree(tmp_path: Path) -> tuple[Path, Path]:
    root, outside = tmp_path / "tree", tmp_path / "outside"
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / "sub" / "file").write_text("x")
    (root / "top").write_text("y")
    (outside / "secret-dir").mkdir(parents=True)
    (outside / "secret").write_text("z")
    return root, outside


def test_a_directory_swapped_for_a_symlink_mid_walk_is_not_followed(tmp_path: Path) -> None:
    root, outside = _tree(tmp_path)
    seen: list[str] = []
    fd = open_dir(root)
    try:
        for dir_fd, name, info in walk_tree(fd):
            seen.append(name)
            if name == "sub":  # listed as a directory; swapped before the walk enters it
                os.rename(root / "sub", tmp_path / "moved")
                os.symlink(outside, root / "sub")
    finally:
        os.close(fd)
    assert "sub" in seen and "top" in seen
    assert not {"secret", "secret-dir", "file", "deeper"} & set(seen), seen


def test_a_symlink_in_the_tree_is_walked_as_itself(tmp_path: Path) -> None:
    root, outside = _tree(tmp_path)
    os.symlink(outside, root / "link")
    fd = open_dir(root)
    try:
        names = {name for _, name, _ in walk_tree(fd)}
    finally:
        os.close(fd)
    assert names == {"sub", "deeper", "file", "top", "link"}


@pytest.mark.skipif(os.geteuid() != 0, reason="handing a tree to another uid needs root (as CI runs)")
def test_hand_over_changes_the_tree_and_nothing_its_symlinks_point_to(tmp_path: Path) -> None:
    root, outside = _tree(tmp_path)
    os.symlink(outside, root / "link")
    os.symlink(outside / "secret", root / "sub" / "file-link")
    before = {p: (p.lstat().st_uid, p.lstat().st_gid) for p in [outside, *outside.rglob("*")]}
    hand_over(root, Identity(3_930_001, 3_930_001))
    assert {p.lstat().st_uid for p in [root, *root.rglob("*")]} == {3_930_001}
    assert {p: (p.lstat().st_uid, p.lstat().st_gid) for p in [outside, *outside.rglob("*")]} == before
    with pytest.raises(OSError):
        hand_over(root / "link", Identity(3_930_001, 3_930_001))  # a symlink as the root itself is refused
