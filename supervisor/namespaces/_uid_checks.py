"""Start-up checks for a worker uid range: may this process switch uids, and can those uids run the worker?"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ._uids import UidRangeError

#: Capabilities the supervisor needs to run workers as other uids and still manage their files.
_NEEDED_CAPS = {0: "CAP_CHOWN", 1: "CAP_DAC_OVERRIDE", 3: "CAP_FOWNER", 6: "CAP_SETGID", 7: "CAP_SETUID"}


def check_can_switch_uids() -> None:
    """``UidRangeError`` unless this process may start workers as other uids (root, or the capabilities)."""
    try:
        with open("/proc/self/status") as status:
            effective = next(int(line.split()[1], 16) for line in status if line.startswith("CapEff:"))
    except (OSError, StopIteration, ValueError):
        effective = ~0 if os.geteuid() == 0 else 0
    missing = [name for bit, name in sorted(_NEEDED_CAPS.items()) if not effective >> bit & 1]
    if missing:
        raise UidRangeError(
            "a worker uid range needs the supervisor to run as root or with "
            f"{', '.join(_NEEDED_CAPS.values())} (missing: {', '.join(missing)}); run it as root "
            "(e.g. the systemd unit's User=root), grant AmbientCapabilities=, or drop --worker-uids")


def check_reachable_by_workers(program: str) -> None:
    """``UidRangeError`` if a worker uid could not run ``program`` (or the interpreter its ``#!`` line names):
    every directory on its real path must be searchable by others and the file executable by them — a venv
    whose interpreter lives under a 0700 ``/root`` is the usual trap."""
    real = Path(os.path.realpath(program))
    for folder in (*reversed(real.parents), real):
        try:
            mode = folder.stat().st_mode
        except OSError as exc:
            raise UidRangeError(f"worker program {program!r}: cannot inspect {folder} ({exc.strerror})") from exc
        if not mode & stat.S_IXOTH:
            raise UidRangeError(
                f"the worker program {program!r} (really {real}) cannot be run by the worker uids: {folder} is "
                f"mode {stat.S_IMODE(mode):o}, not searchable/executable by others; install the interpreter and "
                "the venv under a world-readable prefix (e.g. /opt or /usr/local), or pass a worker argv whose program "
                "and every directory above it the worker uids can reach")
    if real.is_file():
        try:
            with open(real, "rb") as script:
                first = script.readline(4096)
        except OSError:
            return
        interpreter = first[2:].split()[0].decode(errors="replace") if first.startswith(b"#!") and first[2:].split() else ""
        if interpreter.startswith("/") and os.path.realpath(interpreter) != str(real):
            check_reachable_by_workers(interpreter)
