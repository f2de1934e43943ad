"""``codesdk-supervisor``: the long-running service (built in the supervisor issue)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    print("codesdk-supervisor: the service entry point is not built yet; use `codesdk run`.", file=sys.stderr)
    return 2
