"""Issue 33 item 7: what the command itself must change is a usage error (exit 2), refused before anything is
stored; one line on stderr, a sentence (never a dict's repr)."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import pytest
import trio

from codesdk.supervisor.cli import local
from codesdk.supervisor.engine import InvalidTaskInput
from codesdk.supervisor.cli.common import EXIT_USAGE

from tests.e2e.test_cli import _run


def _sessions(tmp_path: Path) -> list[dict[str, object]]:
    done = _run(tmp_path, "sessions", "--json")
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_an_unknown_runtime_is_refused_before_a_session_is_stored(tmp_path: Path) -> None:
    done = _run(tmp_path, "run", "hello", "--runtime", "nope")
    assert done.returncode == EXIT_USAGE, (done.returncode, done.stderr)
    assert "no runtime 'nope' in namespace 'default'; it can run: " in done.stderr and "scripted" in done.stderr
    assert _sessions(tmp_path) == []


def test_auth_of_an_unknown_runtime_is_a_sentence(tmp_path: Path) -> None:
    done = _run(tmp_path, "auth", "--runtime", "nope")
    assert done.returncode == EXIT_USAGE
    assert "{" not in done.stderr and "'known'" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("args", [
    ("sessions", "--namespace", "bad"), ("run", ""), ("run", "x", "--runtime", ""), ("run", "x", "--config", "=1"),
    ("run", "x", "--env", "HOME=/tmp"), ("run", "x", "--env", "PATH=/tmp"), ("run", "x", "--env", "TMPDIR=/tmp"),
    ("run", "x", "--env", "XDG_CONFIG_HOME=/tmp"), ("run", "x", "--namespace", "nope"),
])
def test_bad_input_is_refused_before_anything_is_stored(tmp_path: Path, args: tuple[str, ...]) -> None:
    done = _run(tmp_path, *args)
    assert done.returncode == EXIT_USAGE, (done.returncode, done.stdout, done.stderr)
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "no sessions yet" not in done.stderr
    assert _sessions(tmp_path) == []


def test_namespaces_through_url_reads_the_service(tmp_path: Path) -> None:
    from tests.e2e.test_cli_lifecycle import _cli, _service

    data = tmp_path / "data"
    with _service(data):
        assert _cli(data, "run", "hello", "--namespace", "user:ann", "--json").returncode == 0
        token = (data / "admin.token").read_text().strip()
        done = _cli(data, "--url", f"unix:{data / 'api.sock'}", "--token", token, "namespaces", "--json")
    assert done.returncode == 0, done.stderr
    rows = {row["namespace"]: row["sessions"] for row in map(json.loads, done.stdout.splitlines())}
    assert rows.get("user:ann") == 1, done.stdout


def test_a_runtime_offered_but_unavailable_exits_69_before_a_session_is_stored(tmp_path: Path) -> None:
    from codesdk.supervisor.cli.common import EXIT_UNAVAILABLE

    empty = tmp_path / "no-runtimes"
    empty.mkdir()
    done = _run(tmp_path, "run", "hello", "--runtime", "codex", "--env", f"CODESDK_RUNTIMES_DIR={empty}")
    assert done.returncode == EXIT_UNAVAILABLE, (done.returncode, done.stderr)
    assert "runtime 'codex' is not available in namespace 'default'" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert _sessions(tmp_path) == []


@pytest.mark.parametrize("args, said", [
    (("--scenario", "nope"), "runtime_config.scenario 'nope' is not one scripted has (it has: "),
    (("--config", "bogus=1"), "runtime_config has a key scripted does not take: 'bogus' (it takes: scenario, "),
    (("--runtime", "codex", "--config", "max_turns=3"), "runtime_config has a key codex does not take: 'max_turns'"),
])
def test_a_runtime_config_the_runtime_does_not_take_is_refused_before_a_session_is_stored(
        tmp_path: Path, args: tuple[str, ...], said: str) -> None:
    done = _run(tmp_path, "run", "hello", *args)
    assert done.returncode == EXIT_USAGE, (done.returncode, done.stderr)
    assert said in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert _sessions(tmp_path) == []


def test_through_url_a_runtime_config_not_taken_is_refused_before_a_session_is_stored(tmp_path: Path) -> None:
    from tests.e2e.test_cli_lifecycle import _cli, _service

    data = tmp_path / "data"
    with _service(data):
        token = (data / "admin.token").read_text().strip()
        remote = ("--url", f"unix:{data / 'api.sock'}", "--token", token)
        refused = [_cli(data, *remote, "run", "hello", "--scenario", name) for name in ("nope", "hang")]
        listed = _cli(data, *remote, "sessions", "--json")
    said = {"nope": "runtime_config.scenario 'nope' is not one scripted has",  # hang: an instrument, off on a service
            "hang": "runtime_config.scenario 'hang' is a test instrument, off on this supervisor; an operator enables "
                    "them with `codesdk-supervisor serve --enable-test-scenarios`"}
    for name, done in zip(("nope", "hang"), refused, strict=True):
        assert done.returncode == EXIT_USAGE, (done.returncode, done.stderr)
        assert said[name] in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert listed.returncode == 0 and listed.stdout.strip() == "", listed.stdout


def _refused_beside(error: BaseException) -> BaseExceptionGroup[BaseException]:
    return BaseExceptionGroup("tasks", [error, InvalidTaskInput("no runtime 'nope' in namespace 'default'")])


@pytest.mark.parametrize("beside", [trio.Cancelled._create(), trio.BrokenResourceError("worker pipe closed"),
                                    RuntimeError("a real fault")])
def test_a_refusal_in_a_group_of_several_is_one_line_and_the_rest_is_kept_for_debugging(
        beside: BaseException, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    """Under load a refusal can reach the top beside exceptions of the tasks it tore down: the user reads the
    refusal (exit 2, one line, no traceback); what came beside it is logged whole at debug level (``-vv``)."""
    async def refused(args: argparse.Namespace) -> int:
        raise _refused_beside(beside)

    monkeypatch.setattr(local, "cmd_sessions", refused)
    with caplog.at_level(logging.DEBUG, logger="codesdk.cli"):
        code = local.run_command(argparse.Namespace(command="sessions", verbose=0))
    err = capsys.readouterr().err
    assert code == EXIT_USAGE, err
    assert err == "codesdk: no runtime 'nope' in namespace 'default'\n"
    kept = [record for record in caplog.records if record.name == "codesdk.cli"]
    assert kept and kept[0].exc_info is not None and type(beside).__name__ in caplog.text


def test_a_group_without_a_refusal_is_not_taken_for_one(monkeypatch: pytest.MonkeyPatch) -> None:
    async def broken(args: argparse.Namespace) -> int:
        raise ExceptionGroup("tasks", [RuntimeError("a real fault"), ValueError("another")])

    monkeypatch.setattr(local, "cmd_sessions", broken)
    with pytest.raises(ExceptionGroup):
        local.run_command(argparse.Namespace(command="sessions", verbose=0))
