"""The stderr tail of a crash report: bounded, and the lines it hands out do not depend on how bytes arrive."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from codesdk.protocol import ExitStatus, StderrTail


def _fed(tail: StderrTail, data: bytes, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [line for start, end in itertools.pairwise(points) for line in tail.feed(data[start:end])]


@given(st.binary(max_size=3000), st.lists(st.integers(0, 3000), max_size=10))
def test_lines_do_not_depend_on_the_chunking(data: bytes, cuts: list[int]) -> None:
    lines = _fed(StderrTail(4096), data, cuts)
    whole = data.split(b"\n")[:-1]  # the last piece has no newline yet: held back
    assert lines == [line.decode("utf-8", "replace") for line in whole]


@given(st.binary(max_size=3000), st.lists(st.integers(0, 3000), max_size=10), st.integers(1, 500))
def test_the_tail_is_the_last_bytes_and_a_partial_line_stays_bounded(data: bytes, cuts: list[int],
                                                                     limit: int) -> None:
    tail = StderrTail(limit)
    _fed(tail, data, cuts)
    assert tail.text() == data[-limit:].decode("utf-8", "replace")
    assert len(tail._partial) <= limit  # one endless line costs no more than the tail


def test_exit_status_describes_codes_and_signals() -> None:
    assert ExitStatus.from_returncode(3).describe() == "exited with code 3"
    killed = ExitStatus.from_returncode(-9)
    assert killed.describe() == "killed by signal SIGKILL"
    assert killed.to_json_obj() == {"exit_code": None, "signal": "SIGKILL"}
