"""The resource groups' sans-IO pieces: sizes, limits, ``/proc/self/cgroup``, names, v1 weights (property tests)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from codesdk.supervisor.groups import (
    GroupLimits,
    LimitError,
    LimitOverrides,
    format_size,
    namespace_group,
    parse_proc_cgroup,
    parse_size,
    subtree_name,
)
from codesdk.supervisor.groups._spec import v1_blkio_weight, v1_cpu_shares

sizes = st.integers(min_value=1, max_value=2**50)


@given(sizes)
def test_a_formatted_size_reads_back(value: int) -> None:
    assert parse_size(format_size(value)) == value


@given(st.integers(min_value=1, max_value=2**20), st.sampled_from(["K", "M", "G", "k", "m", "g"]),
       st.sampled_from(["", "i", "iB", "B"]))
def test_binary_units_in_any_spelling(number: int, unit: str, tail: str) -> None:
    factor = {"k": 1024, "m": 1024**2, "g": 1024**3}[unit.lower()]
    assert parse_size(f"{number}{unit}{tail}") == number * factor


@given(st.text(max_size=12))
def test_any_text_is_a_size_or_one_clear_error(text: str) -> None:
    try:
        assert parse_size(text) > 0
    except LimitError as exc:
        assert "invalid size" in str(exc) and "\n" not in str(exc)


def test_limits_out_of_range_are_refused_saying_what_is_allowed() -> None:
    for bad, words in (({"pids": 0}, "use 1 to"), ({"memory": 1024}, "at least 4M"),
                       ({"cpu_weight": 10_001}, "use 1 to 10000"), ({"io_weight": 0}, "use 1 to 10000")):
        with pytest.raises(LimitError, match=words):
            GroupLimits(**bad)


overrides = st.builds(LimitOverrides, pids=st.none() | st.integers(1, 4096),
                      memory=st.none() | st.integers(4 * 1024**2, 2**40),
                      cpu_weight=st.none() | st.integers(1, 10_000), io_weight=st.none() | st.integers(1, 10_000))


@given(overrides, overrides)
def test_newer_overrides_win_and_unset_ones_keep_the_older(older: LimitOverrides, newer: LimitOverrides) -> None:
    merged = older.merged(newer)
    for name in ("pids", "memory", "cpu_weight", "io_weight"):
        expected = getattr(newer, name) if getattr(newer, name) is not None else getattr(older, name)
        assert getattr(merged, name) == expected
    assert LimitOverrides.from_json_obj(merged.to_json_obj()) == merged


def test_stored_overrides_that_are_not_limits_are_refused() -> None:
    bad: list[object] = [[], {"pids": "5"}, {"pids": True}, {"swap": 1}, {"pids": 0}]
    for obj in bad:
        with pytest.raises(LimitError):
            LimitOverrides.from_json_obj(obj)


controllers = st.sampled_from(["pids", "memory", "cpu,cpuacct", "blkio", "name=systemd", ""])
paths = st.lists(st.text("abcdef0123456789_.-", min_size=1, max_size=8), max_size=4).map(lambda p: "/" + "/".join(p))


@given(st.lists(st.tuples(controllers, paths), max_size=8), st.lists(st.text(max_size=20), max_size=3))
def test_proc_cgroup_lines_map_each_controller_to_its_path(lines: list[tuple[str, str]], junk: list[str]) -> None:
    text = "\n".join([f"{n}:{c}:{p}" for n, (c, p) in enumerate(lines)] + [j.replace(":", "") for j in junk])
    parsed = parse_proc_cgroup(text)
    expected: dict[str, str] = {}
    for controllers_of, path in lines:
        for controller in controllers_of.split(",") if controllers_of else [""]:
            expected.setdefault(controller, path)
    assert parsed == expected


def test_this_host_s_kind_of_file() -> None:
    text = "9:name=systemd:/\n4:memory:/process_api/ad7f\n2:cpu,cpuacct:/\n0::/\n"
    assert parse_proc_cgroup(text) == {"name=systemd": "/", "memory": "/process_api/ad7f", "cpu": "/",
                                       "cpuacct": "/", "": "/"}


@given(st.text(min_size=1, max_size=70))
def test_group_names_are_one_path_component(name: str) -> None:
    group = namespace_group(name)
    assert re.fullmatch(r"ns-[A-Za-z0-9_.@-]+", group) and "/" not in group
    assert re.fullmatch(r"codesdk-[0-9a-f]{12}", subtree_name(name))


def test_namespace_groups_follow_the_directory_names() -> None:
    assert namespace_group("user:alice") == "ns-user.alice" and namespace_group("default") == "ns-default"


@given(st.integers(1, 10_000))
def test_v1_weights_stay_in_their_ranges_and_keep_the_order(weight: int) -> None:
    assert 2 <= v1_cpu_shares(weight) <= 262_144 and 10 <= v1_blkio_weight(weight) <= 1000
    assert v1_cpu_shares(weight) <= v1_cpu_shares(min(weight + 1, 10_000))
    assert v1_cpu_shares(100) == 1024
