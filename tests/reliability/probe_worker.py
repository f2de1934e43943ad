"""Started by the worker pool in place of ``codesdk-worker``: records what a worker process can see, then
becomes the real worker (``execv``: same pid, environment, fds and cwd), so tasks run normally afterwards.

Usage: ``python probe_worker.py OUT_DIR WORKER_ARGV...``. Findings go to ``OUT_DIR/<namespace dir>.json``.
Only facts are recorded (names, modes, booleans), never the content of a file it managed to read.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any


def _can_read(path: Path) -> bool:
    try:
        with open(path, "rb") as handle:
            handle.read(1)
    except OSError:
        return False
    return True


def _can_list(path: Path) -> bool:
    try:
        os.listdir(path)
    except OSError:
        return False
    return True


def _open_fds() -> dict[str, str]:
    """fd -> what it refers to; the fd used to list the directory is closed by the time it is resolved."""
    found = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            found[name] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
    return found


def probe() -> dict[str, Any]:
    home = Path(os.environ["HOME"])
    own_root = home.parent
    namespaces = own_root.parent
    others: dict[str, Any] = {}
    for other in sorted(namespaces.iterdir()):
        if other == own_root:
            continue
        files = [p for p in (other / "home").glob("*") if p.is_file()] if _can_list(other / "home") else []
        others[other.name] = {
            "home_listable": _can_list(other / "home"),
            "home_files_readable": [p.name for p in files if _can_read(p)],
        }
    data_dir = namespaces.parent
    return {
        "uid": os.getuid(),
        "gid": os.getgid(),
        "pid": os.getpid(),
        "cwd": os.getcwd(),
        "env": dict(os.environ),
        "fds": _open_fds(),
        "own_home_writable": os.access(home, os.W_OK),
        "others": others,
        "data_dir_files_readable": sorted(p.name for p in data_dir.glob("*") if p.is_file() and _can_read(p)),
        "supervisor_environ_readable": _can_read(Path(f"/proc/{os.getppid()}/environ")),
    }


def main() -> None:
    out_dir, worker = Path(sys.argv[1]), sys.argv[2:]
    findings = probe()
    target = out_dir / f"{Path(os.environ['HOME']).parent.name}.json"
    temp = target.with_suffix(".tmp")
    temp.write_text(json.dumps(findings))
    os.replace(temp, target)
    os.execv(worker[0], worker)


if __name__ == "__main__":
    main()
