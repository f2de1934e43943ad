"""Which hierarchy the supervisor uses, read from ``/proc/self/cgroup`` and ``/proc/self/mountinfo``: v2 where its
group's controllers are enabled (or a group delegated to it holds only itself), else the v1 controllers; and why
not, in one line, where neither. Against a stand-in directory tree (no kernel needed)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from codesdk.supervisor.groups import GroupsUnavailable, detect, subtree_name


def _mountinfo(*mounts: tuple[Path, str, str]) -> str:
    return "\n".join(f"{30 + n} 25 0:{26 + n} / {point} rw,nosuid - {fstype} {fstype} rw,{options}"
                     for n, (point, fstype, options) in enumerate(mounts)) + "\n"


def _v2_group(root: Path, own: str, *, offered: str, enabled: str, procs: str) -> Path:
    group = root / own.lstrip("/")
    group.mkdir(parents=True, exist_ok=True)
    (group / "cgroup.controllers").write_text(offered + "\n")
    (group / "cgroup.subtree_control").write_text(enabled + "\n")
    (group / "cgroup.procs").write_text(procs)
    return group


def test_v2_at_the_root_of_a_cgroup_namespace_uses_the_enabled_controllers(tmp_path: Path) -> None:
    group = _v2_group(tmp_path, "/", offered="cpuset cpu io memory pids", enabled="cpu memory pids", procs="1\n")
    tree = detect("/data", proc_cgroup="0::/\n", mountinfo=_mountinfo((tmp_path, "cgroup2", "nsdelegate")))
    assert tree.version == 2 and tree.delegated is None
    assert [h.base for h in tree.hierarchies] == [group / subtree_name("/data")]
    assert tree.controllers == {"cpu", "memory", "pids"}


def test_v2_in_a_delegated_group_moves_itself_into_a_leaf_and_enables_the_controllers(tmp_path: Path) -> None:
    own = "/system.slice/codesdk-supervisor.service"
    group = _v2_group(tmp_path, own, offered="cpu io memory pids", enabled="", procs=f"{os.getpid()}\n")
    tree = detect("/data", proc_cgroup=f"0::{own}\n", mountinfo=_mountinfo((tmp_path, "cgroup2", "nsdelegate")))
    assert tree.delegated == group and tree.controllers == {"cpu", "io", "memory", "pids"}
    tree.prepare()
    assert (group / "codesdk-supervisor" / "cgroup.procs").read_text() == str(os.getpid())
    assert (group / "cgroup.subtree_control").read_text() == "+cpu +io +memory +pids"
    base = tree.hierarchies[0].base
    assert base.parent == group and (base / "cgroup.subtree_control").read_text() == "+cpu +io +memory +pids"


def test_v2_never_shapes_a_group_someone_else_is_in(tmp_path: Path) -> None:
    own = "/system.slice/other.service"
    _v2_group(tmp_path, own, offered="memory pids", enabled="", procs=f"{os.getpid()}\n999999\n")
    with pytest.raises(GroupsUnavailable, match=r"pids, memory not enabled in this supervisor's group .*Delegate"):
        detect("/data", proc_cgroup=f"0::{own}\n", mountinfo=_mountinfo((tmp_path, "cgroup2", "nsdelegate")))


def test_v1_controllers_below_the_supervisor_s_own_groups(tmp_path: Path) -> None:
    mounts = [(tmp_path / name, "cgroup", name) for name in ("pids", "memory", "cpu,cpuacct", "freezer")]
    mounts.append((tmp_path / "unified", "cgroup2", "nsdelegate"))
    _v2_group(tmp_path / "unified", "/", offered="", enabled="", procs="")
    proc = "8:pids:/\n4:memory:/process_api/ab12\n1:cpu,cpuacct:/\n0::/\n"
    tree = detect("/data", proc_cgroup=proc, mountinfo=_mountinfo(*mounts))
    name = subtree_name("/data")
    assert tree.version == 1
    assert {h.base: h.controllers for h in tree.hierarchies} == {
        tmp_path / "pids" / name: {"pids"}, tmp_path / "memory" / "process_api" / "ab12" / name: {"memory"},
        tmp_path / "cpu,cpuacct" / name: {"cpu", "cpuacct"}}


def test_without_pids_and_memory_it_says_why_in_one_line(tmp_path: Path) -> None:
    mounts = [(tmp_path / "cpu", "cgroup", "cpu"), (tmp_path / "unified", "cgroup2", "nsdelegate")]
    _v2_group(tmp_path / "unified", "/", offered="", enabled="", procs="")
    with pytest.raises(GroupsUnavailable) as refused:
        detect("/data", proc_cgroup="1:cpu:/\n0::/\n", mountinfo=_mountinfo(*mounts))
    why = str(refused.value)
    assert "\n" not in why and "pids and memory controllers are not both mounted" in why
    assert "pids, memory not offered" in why
