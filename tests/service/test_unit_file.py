"""The systemd unit shipped in scripts/systemd."""

from __future__ import annotations

import configparser
import shutil
import subprocess
from pathlib import Path

import pytest

UNIT = Path(__file__).resolve().parents[2] / "scripts" / "systemd" / "codesdk-supervisor.service"


def test_unit_declares_what_the_service_relies_on() -> None:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(UNIT)
    service = parser["Service"]
    assert service["Type"] == "notify" and service["KillMode"] == "mixed" and service["OOMPolicy"] == "continue"
    assert service["WatchdogSec"] and service["Restart"] == "on-failure"
    assert "codesdk-supervisor serve" in service["ExecStart"]
    for hardening in ("NoNewPrivileges", "ProtectSystem", "PrivateTmp", "ProtectHome"):
        assert service[hardening] in ("yes", "strict")
    assert parser["Unit"]["StartLimitBurst"]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed here")
def test_systemd_analyze_verify() -> None:
    done = subprocess.run(["systemd-analyze", "verify", str(UNIT)], capture_output=True, text=True, timeout=60,
                          check=False)
    problems = [line for line in done.stderr.splitlines() if "codesdk-supervisor.service" in line
                and "Command /opt/codesdk" not in line and "User" not in line]
    assert not problems, done.stderr
