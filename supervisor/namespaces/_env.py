"""A worker's environment, built from scratch: its namespace's paths, PATH, LANG and the operator's variables."""

from __future__ import annotations

from collections.abc import Mapping

from ._dirs import NamespaceDirs

DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
#: How ``codesdk run`` asks the worker it launches ahead to start a runtime before its task
#: (``worker._ahead.RUNTIME_AHEAD_ENV``; a test holds the two equal). Set only there: never from an operator's or a
#: tenant's variables, which could otherwise have a worker start programs nobody asked for.
RUNTIME_AHEAD_ENV = "CODESDK_RUNTIME_AHEAD"
#: Makes a worker record everything its tasks see into a directory, for golden replays (``worker._recording``; a
#: test holds the two equal). A test instrument of the operator's (it needs ``CODESDK_SCRIPTED_TEST_STEPS=1`` too),
#: never a tenant's: stored namespace variables may not set it.
RECORD_STREAMS_ENV = "CODESDK_RECORD_STREAMS"


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

