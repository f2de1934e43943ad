"""``codesdk auth login``: a runtime's own interactive login, run in one namespace's environment.

OAuth logins stay per namespace: the runtime's login command (its adapter names it) runs with the namespace's
HOME/XDG dirs and stored variables, as the namespace's own uid when its home belongs to one, so the credentials it
writes land where that namespace's worker — and only it — finds them. CodeSDK never opens a browser: the command
gets ``BROWSER=true`` (runtimes that honour it print the URL instead) and no display; what the runtime prints goes
straight to the operator's terminal, and what the operator types (the code) straight to the runtime.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import trio

from ..namespaces import Namespace, NamespaceEnv, build_env, prepare_dirs

#: What the login runs with besides the namespace's environment: a "browser" that opens nothing.
NO_BROWSER = {"BROWSER": "true"}


def login_environment(data_dir: Path, namespace: str) -> tuple[dict[str, str], Path, tuple[int, int] | None]:
    """The namespace's worker environment (plus ``NO_BROWSER``), its home, and the uid/gid to run as (None: ours)."""
    dirs = prepare_dirs(data_dir, Namespace.parse(namespace))
    env = {**build_env(dirs, NamespaceEnv(data_dir).values(namespace)), **NO_BROWSER}
    info = os.stat(dirs.home)
    owner = (info.st_uid, info.st_gid) if os.geteuid() == 0 and info.st_uid != 0 else None
    return env, dirs.home, owner


async def run_login(data_dir: Path, namespace: str, argv: Sequence[str]) -> int:
    """Run ``argv`` attached to this terminal in the namespace's environment; its exit code."""
    env, home, owner = await trio.to_thread.run_sync(login_environment, data_dir, namespace)
    user, group = owner if owner is not None else (None, None)
    done = await trio.run_process(list(argv), stdin=None, env=env, cwd=str(home), check=False, user=user,
                                  group=group, extra_groups=[] if owner is not None else None)
    return int(done.returncode)
