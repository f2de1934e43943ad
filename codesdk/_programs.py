"""Entry point of the ``codesdk-worker`` console script, where one program name serves two packages:
``codesdk-worker conformance -- COMMAND`` is the test kit's conformance suite (``codesdk.testing.conformance``),
every other ``codesdk-worker`` command the worker's own (``codesdk.worker.main``). Dispatching here keeps the worker
from importing the test kit, which is built on it."""

from __future__ import annotations

import sys


def codesdk_worker() -> int:
    argv = sys.argv[1:]
    if argv[:1] == ["conformance"]:
        from codesdk.testing.conformance import main as conformance

        return conformance(argv[1:], prog="codesdk-worker conformance")
    from codesdk.worker.main import main

    return main(argv)
