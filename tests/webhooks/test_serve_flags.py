"""``serve``'s webhook flags: what they give the service, and bad values refused in their own names (exit 2)."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from codesdk.supervisor.cli.admin import _serve_options, build_parser
from codesdk.supervisor.egress import HostPattern


def test_the_flags_make_the_webhook_options(tmp_path: Path) -> None:
    args = build_parser().parse_args(["serve", "--data-dir", str(tmp_path), "--webhook-allow", "hooks.example.com",
                                      "--webhook-allow", "*.ci.example.org:8443", "--webhook-allow-address",
                                      "10.0.0.0/8", "--webhook-max-attempts", "3", "--webhook-retry-base", "0.5",
                                      "--webhook-timeout", "2"])
    options = _serve_options(args).webhooks
    assert options.egress.hosts == (HostPattern.parse("hooks.example.com"), HostPattern.parse("*.ci.example.org:8443"))
    assert options.egress.addresses == (ipaddress.ip_network("10.0.0.0/8"),)
    assert (options.max_attempts, options.retry_base_s, options.timeout_s) == (3, 0.5, 2)


def test_nothing_is_allowed_by_default(tmp_path: Path) -> None:
    options = _serve_options(build_parser().parse_args(["serve", "--data-dir", str(tmp_path)])).webhooks
    assert options.egress.hosts == () and options.egress.addresses == ()


@pytest.mark.parametrize(("flag", "value", "said"), [
    ("--webhook-allow", "not a host!", "--webhook-allow"),
    ("--webhook-allow-address", "ten/8", "--webhook-allow-address 'ten/8'"),
    ("--webhook-max-attempts", "0", "--webhook-max-attempts"),
    ("--webhook-timeout", "-1", "--webhook-timeout"),
])
def test_bad_values_are_refused_in_their_flag_s_name(tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str,
                                                     value: str, said: str) -> None:
    with pytest.raises(SystemExit) as refused:
        build_parser().parse_args(["serve", "--data-dir", str(tmp_path), flag, value])
    assert refused.value.code == 2
    err = capsys.readouterr().err
    assert said in err and "--allow-fetch" not in err, err
