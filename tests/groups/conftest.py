"""What the resource-group tests share: a supervisor subtree with small limits, skipped (saying why) where this
host offers no group to this process."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from codesdk.supervisor.groups import GroupLimits, ResourceGroups

#: Small on purpose: this machine is shared (a fork bomb capped at 64, a filler of a few hundred MiB at most).
PIDS_CAP = 64
MEMORY_CAP = 64 * 1024**2

MakeGroups = Callable[[GroupLimits], ResourceGroups]


@pytest.fixture
def make_groups(tmp_path: Path) -> Iterator[MakeGroups]:
    """Open the supervisor's subtree (for a data dir of the test's own) with these default limits; closed, and
    checked gone, after the test."""
    if os.geteuid() != 0:
        pytest.skip("resource groups need root (as CI runs)")
    opened: list[ResourceGroups] = []

    def make(limits: GroupLimits) -> ResourceGroups:
        data_dir = tmp_path / f"data{len(opened)}"
        data_dir.mkdir()
        groups = ResourceGroups.open(data_dir, limits)
        if not groups.available:
            pytest.skip(f"no resource group can be created here: {groups.reason}")
        opened.append(groups)
        return groups

    try:
        yield make
    finally:
        for groups in opened:
            groups.close()
            assert groups.tree is not None
            left = [str(h.base) for h in groups.tree.hierarchies if h.base.exists()]
            assert not left, f"the test's groups were not removed: {left}"


@pytest.fixture
def groups(make_groups: MakeGroups) -> ResourceGroups:
    return make_groups(GroupLimits(pids=PIDS_CAP, memory=MEMORY_CAP))
