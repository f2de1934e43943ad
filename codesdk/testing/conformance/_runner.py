"""Runs the checks against a worker command and reports them: a table for people, a report for code."""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import trio

from codesdk.protocol import DEFAULT_MAX_FRAME_BYTES

from ._checks import CHECKS, Check, Target, Verdict, run_check


@dataclass(frozen=True)
class CheckResult:
    """How the worker did on one check: ``failure`` is None when it passed, else what it did wrong."""

    check: Check
    failure: str | None
    seconds: float
    verdict: Verdict = Verdict.PASS

    @property
    def passed(self) -> bool:
        return self.verdict is Verdict.PASS


@dataclass(frozen=True)
class ConformanceReport:
    command: tuple[str, ...]
    results: tuple[CheckResult, ...]

    @property
    def passed(self) -> bool:
        return all(result.passed for result in self.results)

    def failed(self) -> list[str]:
        """Names of the checks the worker did not pass (failed, could not be judged, or not run)."""
        return [result.check.name for result in self.results if not result.passed]

    def verdicts(self) -> dict[str, Verdict]:
        return {result.check.name: result.verdict for result in self.results}

    def table(self) -> str:
        """One line per check — name, sections of docs/protocol.md, PASS/FAIL/ERROR/SKIP, behaviour — then what
        each failure saw, and a summary."""
        name_width = max([len("check"), *(len(r.check.name) for r in self.results)])
        section_width = max([len("spec"), *(len(r.check.sections) for r in self.results)])
        lines = [f"Worker protocol conformance of: {' '.join(self.command)}", "",
                 f"  {'check':<{name_width}}  {'spec':<{section_width}}  result  behaviour"]
        for result in self.results:
            mark = result.verdict.value
            lines.append(f"  {result.check.name:<{name_width}}  {result.check.sections:<{section_width}}  {mark:<6}  "
                         f"{result.check.behaviour}")
        shown = [r for r in self.results if r.verdict in (Verdict.FAIL, Verdict.ERROR)]
        if shown:
            lines.append("")
            for result in shown:
                detail = (result.failure or "").replace("\n", "\n      ")
                lines.append(f"  {result.verdict.value} {result.check.name} ({result.check.sections}):\n      {detail}")
        counts = {verdict: sum(r.verdict is verdict for r in self.results) for verdict in Verdict}
        checks = f"{len(self.results)} check" + ("" if len(self.results) == 1 else "s")
        summary = f"{checks}: {counts[Verdict.PASS]} passed, {counts[Verdict.FAIL]} failed"
        if counts[Verdict.ERROR]:
            summary += f", {counts[Verdict.ERROR]} could not be judged (the worker did not get that far)"
        if counts[Verdict.SKIP]:
            summary += f", {counts[Verdict.SKIP]} not run (no handshake: every check begins with one)"
        lines += ["", summary + " (sections: docs/protocol.md)"]
        return "\n".join(lines)


async def run_conformance(command: Sequence[str], *, runtime: str = "scripted", timeout_s: float = 30.0,
                          only: Sequence[str] = (), max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
                          on_result: Callable[[CheckResult], None] | None = None) -> ConformanceReport:
    """Run every check (or those named in ``only``) against ``command``, one fresh worker each, one after the
    other; ``on_result`` hears each result as soon as it is known."""
    unknown = sorted(set(only) - {check.name for check in CHECKS})
    if unknown:
        raise ValueError(f"no such check: {', '.join(unknown)} (checks: {', '.join(c.name for c in CHECKS)})")
    scratch = Path(tempfile.mkdtemp(prefix="codesdk-conformance-"))
    results: list[CheckResult] = []
    try:  # the worker runs in the caller's directory: a relative command or argument means what it says there
        target = Target(tuple(command), runtime=runtime, timeout_s=timeout_s, scratch=scratch,
                        max_frame_bytes=max_frame_bytes, cwd=Path.cwd())
        no_handshake = False  # once the handshake check failed, the others cannot even begin
        for check in CHECKS:
            if only and check.name not in only:
                continue
            started = time.monotonic()
            failure: str | None
            if no_handshake:
                verdict, failure = Verdict.SKIP, "not run: the worker did not complete its handshake"
            else:
                verdict, failure = await run_check(check, target)
                no_handshake = check.name == "handshake" and verdict is not Verdict.PASS
            result = CheckResult(check, failure, time.monotonic() - started, verdict)
            results.append(result)
            if on_result is not None:
                on_result(result)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return ConformanceReport(tuple(command), tuple(results))


def main(argv: Sequence[str] | None = None, prog: str = "python -m codesdk.testing.conformance") -> int:
    """The command line: options, ``--``, then the worker command. Exit 0 all passed, 1 a check failed, 2 usage."""
    args = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if "--" in args:
        at = args.index("--")
        args, command = args[:at], args[at + 1:]
    parser = argparse.ArgumentParser(
        prog=prog, usage="%(prog)s [options] -- CMD ARGS…", description="Run the worker protocol's required behaviours (docs/protocol.md §12) against a "
                               "worker command, each against a fresh process, and print a pass/fail table.",
        epilog="example: codesdk-worker conformance -- codesdk-worker")
    parser.add_argument("--runtime", default="scripted",
                        help="the runtime that plays the conformance scenarios (default: scripted)")
    parser.add_argument("--timeout", type=float, default=30.0, metavar="S",
                        help="seconds each wait gives the worker (default: 30)")
    parser.add_argument("--only", nargs="+", default=[], metavar="CHECK",
                        help=f"run only these checks ({', '.join(c.name for c in CHECKS)})")
    parser.add_argument("--verbose", action="store_true",
                        help="also log each protocol violation the driver sees as it happens")
    parser.add_argument("--max-frame-bytes", type=int, default=DEFAULT_MAX_FRAME_BYTES, metavar="N",
                        help="the worker's input frame limit, for the oversized-line check (default: 8 MiB)")
    options, stray = parser.parse_known_args(args)
    if stray:
        parser.error(f"unrecognized arguments: {' '.join(stray)} (the worker command goes after --)")
    if not command:
        parser.error("give the worker command after --, e.g. `-- codesdk-worker`")
    if shutil.which(command[0]) is None:
        parser.error(f"{command[0]!r} is not an executable (not found on PATH, or not executable)")
    if options.timeout <= 0:
        parser.error("--timeout must be positive")

    if not options.verbose:  # the table says what went wrong; the driver's own warnings would repeat it
        logging.getLogger("codesdk").addHandler(logging.NullHandler())
        logging.getLogger("codesdk").propagate = False

    def progress(result: CheckResult) -> None:
        print(f"{result.verdict.value:<5} {result.check.name}  ({result.seconds:.1f} s)",
              file=sys.stderr, flush=True)

    try:
        report = trio.run(lambda: run_conformance(command, runtime=options.runtime, timeout_s=options.timeout,
                                                  only=options.only, max_frame_bytes=options.max_frame_bytes,
                                                  on_result=progress))
    except ValueError as exc:
        parser.error(str(exc))
    print(report.table())
    return 0 if report.passed else 1
