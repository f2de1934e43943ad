"""Started by the worker pool in place of ``codesdk-worker``: records what a worker process can see, then
becomes the real worker (``execv``: same pid, environment, fds and cwd), so tasks run normally afterwards.

Usage: ``python probe_worker.py OUT_DIR PEEK_JSON WORKER_ARGV...``; PEEK_JSON names what to try even where
nothing can be listed: ``{"namespaces": [namespace dir names], "home_files": [paths under a home],
"data_files": [names in the data dir]}``. Findings go to ``OUT_DIR/<namespace dir>.json``. Only facts are
recorded (names, modes, booleans, errno names), never the content of a file it managed to read.
"""

from __future__ import annotations

import errno
import json
import os
import sys
from pathlib import Path
from typing import Any


def _try_read(path: Path) -> str:
    """``"ok"`` if a byte could be read, else the errno's name (``EACCES``, ``ENOENT`` ...)."""
    try:
        with open(path, "rb") as handle:
            handle.read(1)
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, str(exc))
    return "ok"


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


def probe(peek: dict[str, list[str]]) -> dict[str, Any]:
    home = Path(os.environ["HOME"])
    own_root = home.parent
    namespaces = own_root.parent
    listable = _can_list(namespaces)
    names = {p.name for p in namespaces.iterdir()} if listable else set()
    others: dict[str, Any] = {}
    for name in sorted(names | set(peek["namespaces"])):
        other = namespaces / name
        if other == own_root:
            continue
        files = [p for p in (other / "home").glob("*") if p.is_file()] if _can_list(other / "home") else []
        others[other.name] = {
            "home_listable": _can_list(other / "home"),
            "home_files_readable": [p.name for p in files if _can_read(p)],
            "reads": {rel: _try_read(other / "home" / rel) for rel in peek["home_files"]},
        }
    data_dir = namespaces.parent
    return {
        "namespaces_listable": listable,
        "data_dir_listable": _can_list(data_dir),
        "data_dir_reads": {name: _try_read(data_dir / name) for name in peek["data_files"]},
        "supervisor_environ": _try_read(Path(f"/proc/{os.getppid()}/environ")),
        "uid": os.getuid(),
        "gid": os.getgid(),
        "groups": os.getgroups(),
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
    out_dir, peek, worker = Path(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3:]
    findings = probe(peek)
    target = out_dir / f"{Path(os.environ['HOME']).parent.name}.json"
    temp = target.with_suffix(".tmp")
    temp.write_text(json.dumps(findings))
    os.replace(temp, target)
    os.execv(worker[0], worker)


def interpreter_for_any_uid() -> list[str] | None:
    """A Python command that worker uids can run, with this venv's packages: ours when every directory up to
    it is searchable by others, else the system's interpreter of the same version with our site-packages
    added (a pyenv interpreter under a 0700 /root is the usual case); None when neither exists."""
    import sysconfig

    from codesdk.supervisor.namespaces import UidRangeError, check_reachable_by_workers

    try:
        check_reachable_by_workers(sys.executable)
        return [sys.executable]
    except UidRangeError:
        pass
    system = Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")
    try:
        check_reachable_by_workers(str(system))
    except UidRangeError:
        return None
    site_packages = sysconfig.get_paths()["purelib"]
    check_reachable_by_workers(site_packages)  # raises with the reason if it is not
    bootstrap = (f"import runpy, site, sys; site.addsitedir({site_packages!r}); target = sys.argv.pop(1); "
                 "sys.argv[0] = target; run = runpy.run_path if target.endswith('.py') else runpy.run_module; "
                 "run(target, run_name='__main__')")
    return [str(system), "-c", bootstrap]


def worker_argv_for_any_uid() -> list[str] | None:
    """``codesdk-worker`` as worker uids can start it (see ``interpreter_for_any_uid``)."""
    python = interpreter_for_any_uid()
    return None if python is None else [*python, "codesdk.worker.main"]


def why_no_worker_uids() -> str | None:
    """Why this machine cannot run workers under their own uids (None if it can)."""
    if os.geteuid() != 0:
        return "per-namespace worker uids need root (or CAP_SETUID/CAP_SETGID/...); run the tests as root"
    if worker_argv_for_any_uid() is None:
        return "no Python interpreter here is runnable by other uids (ours is under a closed directory)"
    return None


if __name__ == "__main__":
    main()
