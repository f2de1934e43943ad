"""The command that starts ``codesdk-worker`` with this interpreter: the standard library only, so that the ``codesdk``
command can start a worker before its own heavy imports."""

from __future__ import annotations

import sys
from pathlib import Path


def worker_argv(*extra: str) -> list[str]:
    """How to start ``codesdk-worker`` with the same interpreter and environment (venv) as this process: its console
    script beside the interpreter, else ``python -m codesdk.worker.main``."""
    script = Path(sys.executable).parent / "codesdk-worker"
    base = [str(script)] if script.exists() else [sys.executable, "-m", "codesdk.worker.main"]
    return base + list(extra)
