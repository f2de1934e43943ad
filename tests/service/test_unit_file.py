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


def test_unit_isolates_tenants_by_default_and_reloads_on_sighup() -> None:
    """Each namespace's worker runs as its own uid (--worker-uids) with the capabilities that needs, held by a
    non-root service user; `systemctl reload` sends SIGHUP (the service reloads, never ends)."""
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(UNIT)
    service = parser["Service"]
    assert "--worker-uids" in service["ExecStart"] and "--listen /run/codesdk/api.sock" in service["ExecStart"]
    assert service["User"] != "root"
    needed = {"CAP_SETUID", "CAP_SETGID", "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER"}
    assert set(service["AmbientCapabilities"].split()) == needed
    assert set(service["CapabilityBoundingSet"].split()) == needed
    assert "-HUP $MAINPID" in service["ExecReload"]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed here")
def test_systemd_analyze_verify() -> None:
    done = subprocess.run(["systemd-analyze", "verify", str(UNIT)], capture_output=True, text=True, timeout=60,
                          check=False)
    problems = [line for line in done.stderr.splitlines() if "codesdk-supervisor.service" in line
                and "Command /opt/codesdk" not in line and "User" not in line]
    assert not problems, done.stderr
