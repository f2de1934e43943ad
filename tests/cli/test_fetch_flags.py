"""The flags that enable http.fetch, on ``codesdk run`` and ``codesdk-supervisor serve``: what they configure, and
each bad one refused as a usage error (exit 2, one line that says what to write instead)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from codesdk.supervisor.cli import admin, front
from codesdk.supervisor.cli.common import EXIT_USAGE, fetch_flags_refusal, fetch_options
from codesdk.supervisor.egress import HostPattern, parse_network

from tests.e2e.test_cli import _run
from tests.worker.harness import REPO


def test_the_flags_make_the_egress_policy() -> None:
    args = front.build_parser().parse_args([
        "run", "x", "--allow-fetch", "*.Example.com", "--allow-fetch", "[::1]:8080",
        "--allow-fetch-address", "10.0.0.0/8", "--allow-fetch-post"])
    policy = fetch_options(args)
    assert policy.hosts == (HostPattern("example.com", suffix=True), HostPattern("::1", port=8080))
    assert policy.addresses == (parse_network("10.0.0.0/8"),) and policy.allow_post
    assert fetch_flags_refusal(args) is None
    served = admin.build_parser().parse_args(["serve", "--allow-fetch", "api.example.com"])
    assert fetch_options(served).hosts == (HostPattern("api.example.com"),) and not fetch_options(served).allow_post
    assert not fetch_options(front.build_parser().parse_args(["run", "x"])).hosts  # off by default
    assert not args.allow_fetch_unattended
    unattended = admin.build_parser().parse_args(["serve", "--allow-fetch", "a.example.com",
                                                  "--allow-fetch-unattended"])
    assert admin._serve_options(unattended).fetch_unattended and not admin._serve_options(served).fetch_unattended


@pytest.mark.parametrize(("flags", "said"), [
    (["--allow-fetch", "*.com"], "would match a whole top-level domain"),
    (["--allow-fetch", "a*.example.com"], "'*' is allowed only as the first label"),
    (["--allow-fetch", "example.com:99999"], "the port must be a number from 1 to 65535"),
    (["--allow-fetch", "::1"], "write an IPv6 address in brackets"),
    (["--allow-fetch-address", "intranet"], "give an IP address or a CIDR"),
    (["--allow-fetch-post"], "--allow-fetch-post has no effect without --allow-fetch HOST_PATTERN"),
    (["--allow-fetch-address", "10.0.0.0/8"], "--allow-fetch-address has no effect without --allow-fetch"),
    (["--allow-fetch-unattended"], "--allow-fetch-unattended has no effect without --allow-fetch HOST_PATTERN"),
    (["--url", "unix:/nonexistent/api.sock", "--allow-fetch", "a.example.com", "--allow-fetch-unattended"],
     "cannot be honoured through the API"),
])
def test_bad_fetch_flags_of_run_are_usage_errors(tmp_path: Path, flags: list[str], said: str) -> None:
    done = _run(tmp_path, "run", "hello", *flags)
    assert done.returncode == EXIT_USAGE, done.stderr
    assert said in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.mark.parametrize(("flags", "said"), [
    (["--allow-fetch", "*.10.0.0.1"], "'*.' goes before a domain name"),
    (["--allow-fetch-post"], "--allow-fetch-post has no effect without --allow-fetch"),
    (["--allow-fetch-unattended"], "--allow-fetch-unattended has no effect without --allow-fetch"),
])
def test_bad_fetch_flags_of_serve_are_usage_errors(tmp_path: Path, flags: list[str], said: str) -> None:
    done = subprocess.run([sys.executable, "-m", "codesdk.supervisor.cli.admin", "serve", "--data-dir",
                           str(tmp_path / "d"), *flags], capture_output=True, text=True, timeout=60, cwd=REPO, check=False)
    assert done.returncode == EXIT_USAGE, done.stderr
    assert said in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_run_with_allow_fetch_offers_the_tool_which_then_needs_approval(tmp_path: Path) -> None:
    """Enabled, http.fetch is offered; a non-interactive run cannot approve it, so it is denied without a fetch."""
    scenario = {"name": "f", "steps": [
        {"tool_calls": [{"id": "f", "name": "http.fetch", "input": {"url": "http://api.example.com/"}}],
         "on_denied": [{"text": "denied: {{denied:f}}"}, {"complete": {}}]}, {"complete": {}}]}
    done = _run(tmp_path, "run", "fetch", "--allow-fetch", "api.example.com", "--mode", "yolo", "--non-interactive",
                "--json", "--config", f"scenario_inline={json.dumps(scenario)}")
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    [denied] = [e["payload"] for e in events if e["type"] == "tool.call.denied"]
    assert "needs approval for network tool 'http.fetch'" in denied["reason"]


def test_run_with_allow_fetch_unattended_lets_a_yolo_task_fetch_unasked(tmp_path: Path) -> None:
    """Unattended, the call is approved by the policy and goes to the tool, whose egress policy still refuses a
    loopback address (so nothing here leaves the machine)."""
    scenario = {"name": "f", "steps": [
        {"tool_calls": [{"id": "f", "name": "http.fetch", "input": {"url": "http://127.0.0.1:9/"}}]},
        {"complete": {}}]}
    done = _run(tmp_path, "run", "fetch", "--allow-fetch", "127.0.0.1:9", "--allow-fetch-unattended", "--mode", "yolo",
                "--non-interactive", "--json", "--config", f"scenario_inline={json.dumps(scenario)}")
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    [approved] = [e["payload"] for e in events if e["type"] == "tool.call.approved"]
    assert approved["policy_snapshot"]["rule"] == "mode.yolo.network.unattended"
    [completed] = [e["payload"] for e in events if e["type"] == "tool.call.completed"]
    assert completed["is_error"] is True and "egress_refused" in completed["result_preview"], completed


def _supervisor(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "codesdk.supervisor.cli.admin", *args], capture_output=True,
                          text=True, timeout=60, cwd=REPO, check=False)


def test_namespace_egress_commands_keep_a_namespaces_own_list(tmp_path: Path) -> None:
    data = str(tmp_path / "data")
    shown = _supervisor("namespace", "egress", "show", "user:alice", "--data-dir", data)
    assert shown.returncode == 0 and "serve --allow-fetch (no list of its own)" in shown.stdout
    done = _supervisor("namespace", "egress", "set", "user:alice", "docs.example.com", "*.cdn.example.com:8443",
                       "--data-dir", data)
    assert done.returncode == 0, done.stderr
    assert "docs.example.com *.cdn.example.com:8443" in done.stdout and "also allows" in done.stdout
    from codesdk.supervisor.namespaces import NamespaceEgress
    assert NamespaceEgress(Path(data)).get("user:alice") == (HostPattern.parse("docs.example.com"),
                                                             HostPattern.parse("*.cdn.example.com:8443"))
    assert "hosts\tnone" in _supervisor("namespace", "egress", "deny-all", "user:alice", "--data-dir", data).stdout
    assert NamespaceEgress(Path(data)).get("user:alice") == ()
    cleared = _supervisor("namespace", "egress", "clear", "user:alice", "--data-dir", data)
    assert cleared.returncode == 0 and NamespaceEgress(Path(data)).get("user:alice") is None
    bad = _supervisor("namespace", "egress", "set", "user:alice", "*.com", "--data-dir", data)
    assert bad.returncode == EXIT_USAGE and "would match a whole top-level domain" in bad.stderr
