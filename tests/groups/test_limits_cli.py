"""``codesdk-supervisor namespace limits set|show``: stored in the data dir, shown back, written at once on the
running namespace's group, and on its next start."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from codesdk.supervisor.cli.admin import main
from codesdk.supervisor.groups import GroupLimits, ResourceGroups, StoredLimits, namespace_group

from tests.groups.conftest import MakeGroups


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _group_file(groups: ResourceGroups, namespace: str, controller: str, name: str) -> str:
    assert groups.tree is not None
    hierarchy = next(h for h in groups.tree.hierarchies if controller in h.controllers)
    return (hierarchy.base / namespace_group(namespace) / name).read_text().strip()


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """Stands in for a namespace's worker: a process placed in its group."""
    process = subprocess.Popen(["sleep", "600"])
    try:
        yield process
    finally:
        process.kill()
        process.wait()


def test_limits_set_show_up_in_the_running_group_s_files_and_on_its_next_start(
        make_groups: MakeGroups, sleeper: subprocess.Popen[bytes], capsys: pytest.CaptureFixture[str]) -> None:
    groups = make_groups(GroupLimits(pids=64, memory=256 * 1024**2))
    data_dir = str(groups.data_dir)
    groups.place_worker("user:alice", sleeper.pid)
    pids_file = "pids.max"
    memory_file = "memory.max" if groups.tree is not None and groups.tree.version == 2 else "memory.limit_in_bytes"
    assert _group_file(groups, "user:alice", "pids", pids_file) == "64"

    code, out, err = _cli(capsys, "namespace", "limits", "set", "user:alice", "--pids", "77", "--memory", "96M",
                          "--data-dir", data_dir)
    assert code == 0, err
    assert "applied to its running group" in err
    assert _group_file(groups, "user:alice", "pids", pids_file) == "77"
    assert _group_file(groups, "user:alice", "memory", memory_file) == str(96 * 1024**2)
    assert "pids\t77\tset" in out and "memory\t96M\tset" in out and "cpu_weight\t100\tdefault" in out

    groups.worker_ended("user:alice")  # the group goes with its worker; the next start has the stored limits
    groups.place_worker("user:alice", sleeper.pid)
    assert _group_file(groups, "user:alice", "pids", pids_file) == "77"
    groups.worker_ended("user:alice")


def test_limits_set_refuses_bad_values_in_one_line_and_stores_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _cli(capsys, "namespace", "limits", "set", "user:bob", "--cpu-weight", "20000",
                        "--data-dir", str(tmp_path))
    assert code == 2 and err.count("\n") == 1 and "CPU weight 20000: use 1 to 10000" in err
    code, _, err = _cli(capsys, "namespace", "limits", "set", "user:bob", "--data-dir", str(tmp_path))
    assert code == 2 and "nothing to set" in err
    assert StoredLimits(tmp_path).all() == {}
    code, out, _ = _cli(capsys, "namespace", "limits", "show", "user:bob", "--data-dir", str(tmp_path))
    assert code == 0 and "pids\t512\tdefault" in out


def test_a_worker_ending_leaves_a_running_exec_call_of_its_namespace_alone(
        make_groups: MakeGroups, sleeper: subprocess.Popen[bytes]) -> None:
    groups = make_groups(GroupLimits())
    worker = subprocess.Popen(["sleep", "600"])
    try:
        groups.place_worker("user:erin", worker.pid)
        leaf, files = groups.open_exec("user:erin")
        for path in files:
            path.write_text(str(sleeper.pid))  # as the call's joiner does for itself
        groups.worker_ended("user:erin")
        assert worker.wait(timeout=60) == -9  # a hang guard, not a timing
        assert sleeper.poll() is None, "the exec call was killed with the worker"
        groups.close_exec("user:erin", leaf)
        assert sleeper.wait(timeout=60) == -9
        assert groups.tree is not None and groups.tree.children() == []
    finally:
        worker.kill()
        worker.wait()


def test_limits_set_on_a_data_dir_no_service_has_used_yet(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An operator may set a namespace's limits before the service ever ran there: stored, not an ENOENT."""
    fresh = tmp_path / "not-yet"
    code, _, err = _cli(capsys, "namespace", "limits", "set", "user:x", "--memory", "64M", "--data-dir", str(fresh))
    assert code == 0, err
    assert StoredLimits(fresh).get("user:x").memory == 64 << 20
