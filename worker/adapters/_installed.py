"""Where the npm-installed runtimes live (``runtimes/package.json`` pins them; ``scripts/install-runtimes`` installs
them with ``--ignore-scripts``), for every adapter whose program comes from there. The standard library only: the
launch modules that use it run before the worker's heavy imports."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from ..command import RUNTIMES_DIR_ENV


def runtimes_dir(environ: Mapping[str, str] = os.environ) -> Path:
    explicit = environ.get(RUNTIMES_DIR_ENV)
    return Path(explicit) if explicit else Path(__file__).resolve().parents[2] / "runtimes"


def node_modules(environ: Mapping[str, str] = os.environ) -> Path:
    return runtimes_dir(environ) / "node_modules"


def install_hint(environ: Mapping[str, str] = os.environ) -> str:
    """What to do when a pinned runtime is not in ``runtimes_dir``: the same advice for every such runtime."""
    return (f"in a checkout, run ./scripts/install-runtimes (needs node and npm); installed from a wheel, install the "
            f"pinned packages (runtimes/package.json of CodeSDK's source) with `npm install --ignore-scripts` into a "
            f"directory and point {RUNTIMES_DIR_ENV} at it (docs/runtimes/README.md)")
