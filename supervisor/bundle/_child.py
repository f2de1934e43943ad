"""The bundle process (``python -m codesdk.supervisor.bundle._child``, started by ``_build.build_in_child``): lowers
its own CPU and IO priority, reads what to build as JSON on stdin, opens the store read-only beside the supervisor's
writer, and writes the bundle (``_archive.write_bundle``).

A process of its own so that the CPU a bundle costs (redacting every string of a session) competes with neither the
supervisor's event loop (no GIL shared) nor, at ``SCHED_IDLE``, with any process of normal priority.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import psutil
import trio


def lower_priority() -> list[str]:
    """The lowest CPU and IO priority this process can take; what it got (each is best effort: a kernel or a
    container may refuse one)."""
    got: list[str] = []
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        got.append("SCHED_IDLE")
    except (OSError, AttributeError):
        pass
    try:
        os.nice(19 - os.nice(0))
        got.append("nice 19")
    except OSError:
        pass
    try:
        psutil.Process().ionice(psutil.IOPRIO_CLASS_IDLE)
        got.append("io idle")
    except (OSError, AttributeError, psutil.Error):
        pass
    return got


async def _build(spec: dict[str, Any]) -> None:
    from ..store import EventStore, open_postgres
    from ._archive import write_bundle
    from ._collect import BundleSources

    store_spec = spec["store"]
    opened = (open_postgres(store_spec["postgres"], readers=1) if "postgres" in store_spec
              else EventStore.open(store_spec["sqlite"], read_only=True, readers=1))
    async with opened as store:
        sources = BundleSources(store=store, session_id=spec["session_id"], secrets=spec["secrets"],
                                environment=spec["environment"], config=spec["config"], workers=spec["workers"],
                                health=spec["health"], patterns=spec["patterns"])
        await write_bundle(sources, Path(spec["out"]), force=True, through_seq=spec["through_seq"],
                           max_bytes=spec["max_bytes"])


def main() -> int:
    lower_priority()
    spec = json.loads(sys.stdin.buffer.read())
    trio.run(_build, spec)
    return 0


if __name__ == "__main__":
    sys.exit(main())
