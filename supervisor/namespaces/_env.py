"""A worker's environment, built from scratch: its namespace's paths, PATH, LANG and the operator's variables."""

from __future__ import annotations

from collections.abc import Mapping

from codesdk.worker.command import RECORD_STREAMS_ENV as RECORD_STREAMS_ENV
from codesdk.worker.command import RUNTIME_AHEAD_ENV as RUNTIME_AHEAD_ENV

from ._dirs import NamespaceDirs

DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"


def build_env(dirs: NamespaceDirs, extra: Mapping[str, str] | None = None, path: str | None = None) -> dict[str, str]:
    """The worker's whole environment: namespace paths, PATH, LANG and the operator's variables only."""
    env = {
        "HOME": str(dirs.home),
        "XDG_CONFIG_HOME": str(dirs.config),
        "XDG_STATE_HOME": str(dirs.state),
        "XDG_CACHE_HOME": str(dirs.cache),
        "XDG_DATA_HOME": str(dirs.data),
        "TMPDIR": str(dirs.tmp),
        "PATH": path or DEFAULT_PATH,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
    }
    env.update({name: value for name, value in (extra or {}).items() if name != RUNTIME_AHEAD_ENV})
    return env

