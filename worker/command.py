"""How a worker is started: its command (``worker_argv``), and the variables of its environment that change what it
does — one definition each, read by the worker and set by whoever starts it (the supervisor, a test).

The standard library only: the ``codesdk`` command starts a namespace's worker before its own heavy imports.
"""

from __future__ import annotations

import sys
from pathlib import Path

#: Set (to 1) when the operator enabled the scripted runtime's test instruments (crash, hang, flood, …;
#: ``serve --enable-test-scenarios``; ``codesdk run``, a single user's own supervisor, has them on).
TEST_STEPS_ENV = "CODESDK_SCRIPTED_TEST_STEPS"
#: Where the npm-installed runtimes are (``runtimes/`` of the checkout when unset). Set for the supervisor (the
#: systemd unit, a shell), it is passed on to every namespace's worker.
RUNTIMES_DIR_ENV = "CODESDK_RUNTIMES_DIR"
#: How ``codesdk run`` asks the worker it launches ahead to start a runtime before its task (a JSON object:
#: ``worker._ahead``). Set only there: never from an operator's or a tenant's variables, which could otherwise have a
#: worker start programs nobody asked for. The worker takes it out of its environment before anything reads it.
RUNTIME_AHEAD_ENV = "CODESDK_RUNTIME_AHEAD"
#: Makes a worker record everything its tasks see into this directory, for golden replays (``worker._recording``).
#: A test instrument of the operator's (it needs ``TEST_STEPS_ENV`` too), never a tenant's.
RECORD_STREAMS_ENV = "CODESDK_RECORD_STREAMS"


def worker_argv(*extra: str) -> list[str]:
    """How to start ``codesdk-worker`` with the same interpreter and environment (venv) as this process: its console
    script beside the interpreter, else ``python -m codesdk.worker.main``."""
    script = Path(sys.executable).parent / "codesdk-worker"
    base = [str(script)] if script.exists() else [sys.executable, "-m", "codesdk.worker.main"]
    return base + list(extra)
