"""Issue 33 item 8: every command and flag of ``codesdk`` and ``codesdk-supervisor``, given a bad value, is a usage
error: exit 2 and one line on stderr, never a traceback. The cases are generated from the argparse parsers, so a
flag added later is covered without a list to keep."""

from __future__ import annotations

import argparse
import contextlib
import io
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from codesdk.supervisor.cli import admin, common, front

#: Value types for which any word is a value (a name, a path, text): only the empty value is bad for them.
FREE_TEXT = {None, str, Path, common.text, common.path, common.data_dir, common.regex, common.runtime_name,
             common.fetch_host, admin._webhook_host}  # a word is a host name
PARSERS = {"codesdk": front.build_parser, "codesdk-supervisor": admin.build_parser}


def _subcommands(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> Iterator[
        tuple[tuple[str, ...], argparse.ArgumentParser]]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
        return
    for name, child in subs[0].choices.items():
        yield from _subcommands(child, (*path, name))


def _takes_value(action: argparse.Action) -> bool:
    return not isinstance(action, argparse._SubParsersAction | argparse._HelpAction | argparse._VersionAction) \
        and action.nargs != 0


def _good(action: argparse.Action) -> str:
    if action.choices:
        return str(next(iter(action.choices)))
    return {"assignments": "K=V", "names": "K", "quota": "16M"}.get(action.dest, "default")


def _bad_values(action: argparse.Action) -> list[str]:
    """What no flag may take: an empty value always; a word where a number or a choice is due; a data dir
    that cannot be made."""
    bad = [""]
    if action.choices or action.type not in FREE_TEXT:
        bad.append("nope")
    if action.dest == "data_dir":
        bad.append("/proc/nope")
    if action.dest == "port":
        bad.append("99999")
    if action.type in (common.count, common.usd):  # a budget's limit: above what the protocol takes
        bad.append("9" * 30)
    return bad


def _base(parser: argparse.ArgumentParser) -> list[str]:
    """The shortest command line that parses: every required positional and option given a good value."""
    argv: list[str] = []
    for action in parser._actions:
        if not _takes_value(action):
            continue
        if not action.option_strings and action.nargs not in ("?", "*"):
            argv.append(_good(action))
        elif action.option_strings and action.required:
            argv += [action.option_strings[-1], _good(action)]
    return argv


def _cases() -> Iterator[tuple[str, list[str]]]:
    for program, build in PARSERS.items():
        for path, parser in _subcommands(build(), ()):
            base = _base(parser)
            for action in parser._actions:
                if not _takes_value(action):
                    continue
                for bad in _bad_values(action):
                    if action.option_strings:
                        argv = [*path, *base, f"{action.option_strings[-1]}={bad}"]
                    else:
                        i = [a for a in parser._actions if _takes_value(a) and not a.option_strings
                             and a.nargs not in ("?", "*")].index(action) if action.nargs not in ("?", "*") else None
                        args = list(base)
                        if i is None:
                            args.insert(0, bad)
                        else:
                            args[i] = bad
                        argv = [*path, *args]
                    yield program, argv


CASES = list(_cases())


def _parse(program: str, argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            PARSERS[program]().parse_args(argv)
        except SystemExit as exc:
            return int(exc.code or 0), err.getvalue()
    return 0, err.getvalue()


def test_the_cases_cover_both_programs() -> None:
    assert {p for p, _ in CASES} == set(PARSERS) and len(CASES) > 60
    for program, build in PARSERS.items():  # the good command lines parse: a refusal is the bad value's
        for path, parser in _subcommands(build(), ()):
            assert _parse(program, [*path, *_base(parser)]) == (0, ""), (program, path)


@pytest.mark.parametrize(("program", "argv"), CASES, ids=[" ".join([p, *a]) for p, a in CASES])
def test_a_bad_value_is_one_line_and_exit_2(program: str, argv: list[str]) -> None:
    code, err = _parse(program, argv)
    assert code == 2, f"{program} {argv} was accepted"
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err and lines[0].startswith(f"{program}"), err


@pytest.mark.parametrize("argv", [["serve", "--port", "99999"], ["serve", "--data-dir", "/proc/nope"],
                                  ["serve", "--log-level", "loud"]])
def test_serve_refuses_bad_flags_without_a_traceback(argv: list[str], tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "codesdk.supervisor.cli.admin", *argv], capture_output=True,
                          text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_the_command_line_knows_a_runtime_name_as_the_protocol_does() -> None:
    from codesdk.protocol import RUNTIME_NAME_PATTERN

    assert common.RUNTIME_NAME.pattern == RUNTIME_NAME_PATTERN


def test_the_command_line_knows_the_largest_budget_limit_as_the_protocol_does() -> None:
    from codesdk.protocol._budgets import MAX_LIMIT

    assert common.MAX_BUDGET_LIMIT == MAX_LIMIT
