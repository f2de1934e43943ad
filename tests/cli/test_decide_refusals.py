"""``codesdk decide`` refuses a decision the API would refuse before asking it: one line naming the flag."""

from __future__ import annotations

import pytest

from codesdk.supervisor.cli import front
from codesdk.supervisor.cli.common import CliError
from codesdk.supervisor.cli.decisions import decision_of


@pytest.mark.parametrize(("flags", "named"), [
    (["--scope", "rule"], "--path/--command/--host: --scope rule needs one of --path, --command, --host"),
    (["--scope", "rule", "--path", "../x"], "--path/--command/--host (path.prefix): "),
    (["--path", "src"], "--path/--command/--host: "),
    (["--input", "[1]"], "--input: "),
])
def test_a_bad_decision_is_one_line_naming_the_flag(flags: list[str], named: str) -> None:
    args = front.build_parser().parse_args(["decide", "allow", "apr_1", *flags])
    with pytest.raises(CliError) as refused:
        decision_of(args, "apr_1")
    said = str(refused.value)
    assert "\n" not in said and "pydantic" not in said and named in said, said
