"""Credential namespaces: validated names, their private directories, and worker environments.

A namespace (``default``, ``user:<id>``, ``ci:<job>``) owns ``<data-dir>/namespaces/<safe-name>/`` (mode 0700)
with home/, config/, state/, cache/, data/, tmp/. A worker's environment is built from scratch from
those paths plus what the operator configured — never the supervisor's whole environment — so one
tenant's OAuth caches and tokens can't leak into another's runtime.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from protocol import IsolationLevel, IsolationMode, RuntimeEnv

_KINDS = ("user", "ci")
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")
SUBDIRS = ("home", "config", "state", "cache", "data", "tmp")
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"


class InvalidNamespace(ValueError):
    """A namespace name that is not ``default``, ``user:<id>`` or ``ci:<job>``."""


@dataclass(frozen=True)
class Namespace:
    name: str

    @classmethod
    def parse(cls, name: str) -> Namespace:
        if name == "default":
            return cls(name)
        kind, sep, ident = name.partition(":")
        if not sep or kind not in _KINDS:
            raise InvalidNamespace(
                f"invalid namespace {name!r}: use 'default', 'user:<id>' or 'ci:<job>'")
        if not _ID.match(ident) or ".." in ident:
            raise InvalidNamespace(
                f"invalid namespace {name!r}: the id must be 1-64 characters of letters, digits, '_', '.', '@', '-', "
                "start with a letter or digit, and not contain '..'")
        return cls(name)

    @property
    def safe_name(self) -> str:
        """Directory name: ':' becomes '.', which kinds and ids can't otherwise produce, so it's unique."""
        return self.name.replace(":", ".", 1)

    def root(self, data_dir: Path) -> Path:
        return data_dir / "namespaces" / self.safe_name


@dataclass(frozen=True)
class NamespaceDirs:
    root: Path
    home: Path
    config: Path
    state: Path
    cache: Path
    data: Path
    tmp: Path


def prepare_dirs(data_dir: Path, namespace: Namespace) -> NamespaceDirs:
    """Create the namespace's directories with mode 0700 (and tighten them if they already exist)."""
    root = namespace.root(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    paths = {name: root / name for name in SUBDIRS}
    # ``namespaces/`` too: an existing one left group/world-readable would expose every tenant's directory names.
    for path in (data_dir / "namespaces", root, *paths.values()):
        if path.is_symlink():
            raise InvalidNamespace(f"{path} is a symlink; refusing to use it as a namespace directory")
        path.mkdir(exist_ok=True, mode=0o700)
        os.chmod(path, 0o700)
    return NamespaceDirs(root=root, **paths)


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
    env.update(extra or {})
    return env


def runtime_env(namespace: Namespace, env: Mapping[str, str]) -> RuntimeEnv:
    """The safe view sent to the worker: paths and variable names, never values of other variables."""
    return RuntimeEnv(
        namespace=namespace.name, isolation=IsolationLevel.NAMESPACED, mode=IsolationMode.SUBPROCESS,
        home=env["HOME"], xdg_config_home=env["XDG_CONFIG_HOME"], xdg_state_home=env["XDG_STATE_HOME"],
        xdg_cache_home=env["XDG_CACHE_HOME"], xdg_data_home=env["XDG_DATA_HOME"], tmpdir=env["TMPDIR"],
        path=env["PATH"], variable_names=tuple(sorted(env)),
    )
