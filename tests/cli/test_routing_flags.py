"""``codesdk-supervisor serve``'s approval routing flags: what they configure, the default, and a bad value refused
as a usage error."""

from __future__ import annotations

import pytest

from codesdk.supervisor.cli import admin
from codesdk.supervisor.engine import SERVICE_UNATTENDED, SERVICE_UNATTENDED_WAIT_S, RoutingPolicy, Unattended


def test_the_flags_make_the_routing_policy() -> None:
    args = admin.build_parser().parse_args(["serve", "--unattended", "deny", "--unattended-wait", "30",
                                            "--escalate-after", "60"])
    assert admin._serve_options(args).routing == RoutingPolicy(Unattended.DENY, 30.0, 60.0)


def test_serve_waits_a_short_while_by_default_and_never_escalates() -> None:
    routing = admin._serve_options(admin.build_parser().parse_args(["serve"])).routing
    assert routing == RoutingPolicy(SERVICE_UNATTENDED, SERVICE_UNATTENDED_WAIT_S, None)
    assert routing.unattended is Unattended.WAIT


@pytest.mark.parametrize("flags", [["--unattended", "ignore"], ["--unattended-wait", "0"],
                                   ["--escalate-after", "-5"], ["--escalate-after", "soon"]])
def test_a_bad_value_is_a_usage_error(flags: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        admin.build_parser().parse_args(["serve", *flags])
    assert exited.value.code == 2
    assert flags[0] in capsys.readouterr().err
