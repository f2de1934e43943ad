"""An ephemeral session's own directories: made 0700 (its namespace's uid's, with a uid range) below a passage no
tenant owns, never through a symlink, and removed whole without following one its runtime planted."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from codesdk.supervisor.ids import new_id
from codesdk.supervisor.namespaces import (
    SUBDIRS,
    Identity,
    InvalidNamespace,
    ephemeral_sessions,
    operator_dirs,
    prepare_session_dirs,
    remove_session_dirs,
)

TENANT = Identity(3_930_002, 3_930_002)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_a_sessions_dirs_are_its_own_and_go_whole(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir(mode=0o700)
    session_id = new_id("ses")
    dirs = prepare_session_dirs(data_dir, session_id)
    assert dirs.root == data_dir / "ephemeral" / session_id and dirs.home == dirs.root / "home"
    assert all(_mode(dirs.root / name) == 0o700 for name in SUBDIRS) and _mode(data_dir / "ephemeral") == 0o700
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("not the session's")
    (dirs.home / "escape").symlink_to(outside)  # what a hostile runtime may leave in its HOME
    (dirs.cache / "deep" / "er").mkdir(parents=True)
    assert ephemeral_sessions(data_dir) == [session_id]
    assert remove_session_dirs(data_dir, session_id)
    assert not dirs.root.exists() and (outside / "precious").exists()
    assert remove_session_dirs(data_dir, session_id)  # gone already: nothing left, as asked
    assert ephemeral_sessions(data_dir) == []


def test_a_symlink_in_place_of_a_sessions_dir_is_refused(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    (data_dir / "ephemeral").mkdir(parents=True)
    session_id = new_id("ses")
    (data_dir / "ephemeral" / session_id).symlink_to(tmp_path)
    with pytest.raises(InvalidNamespace, match="symlink"):
        prepare_session_dirs(data_dir, session_id)


@pytest.mark.skipif(os.geteuid() != 0, reason="handing directories to another uid needs root (as CI runs)")
def test_with_a_uid_range_they_are_the_namespaces_uids_behind_a_passage(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir(mode=0o700)
    dirs = prepare_session_dirs(data_dir, new_id("ses"), TENANT)
    passage = (data_dir / "ephemeral").stat()
    assert (passage.st_uid, _mode(data_dir / "ephemeral")) == (os.geteuid(), 0o711)
    for path in (dirs.root, *(dirs.root / name for name in SUBDIRS)):
        info = path.stat()
        assert (info.st_uid, info.st_gid, _mode(path)) == (TENANT.uid, TENANT.gid, 0o700)


def test_the_shared_level_uses_the_service_users_own_dirs() -> None:
    dirs = operator_dirs({"HOME": "/home/op", "XDG_CACHE_HOME": "/var/cache/op", "XDG_CONFIG_HOME": "relative"})
    assert dirs.home == Path("/home/op") and dirs.cache == Path("/var/cache/op")
    assert dirs.config == Path("/home/op/.config")  # a relative XDG path is ignored, as the spec says
    assert dirs.data == Path("/home/op/.local/share") and dirs.tmp == Path("/tmp")
