"""The worker protocol's conformance suite: run the required behaviours against any worker command.

``run_conformance(command)`` starts the command afresh for each check (docs/protocol.md §12) and returns a
``ConformanceReport``; ``codesdk-worker conformance -- CMD ARGS…`` (or ``python -m codesdk.testing.conformance``)
prints it as a table and exits 0 only when every check passed.
"""

from __future__ import annotations

from ._checks import CHECKS, Check, CheckFailed, Target, Verdict
from ._runner import CheckResult, ConformanceReport, main, run_conformance

__all__ = ["CHECKS", "Check", "CheckFailed", "CheckResult", "ConformanceReport", "Target", "Verdict", "main",
           "run_conformance"]
