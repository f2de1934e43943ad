"""What ``codesdk run`` prepares before the supervisor is imported: its new session's id and workspace, and its
namespace's worker, started with what the task will ask (``RunAhead``).

A module of its own, light like ``front`` (the standard library, the light ``workers.launch``, ``namespaces`` and
``ids``): ``front`` starts it before the heavy imports, and ``local`` hands it to the engine after them; neither
needs the other for it.
"""

from __future__ import annotations

import sys

import argparse
import contextlib
from dataclasses import dataclass, field
from pathlib import Path

from codesdk.procs.children import Children

from ..ids import new_id
from ..namespaces import UnsafeDataDir, WorkspaceRefused, make_workspace, secure_data_dir
from ..workers.launch import Headstart, PoolConfig, workers_env
from .common import DEFAULT_NAMESPACE, DEFAULT_RUNTIME, CliError, run_config, run_env


@dataclass
class RunAhead:
    """What ``run`` prepared before the supervisor was imported: its namespace's worker (``headstart``), and its
    new session's id and workspace, so that the worker could start the runtime in that workspace already.

    ``close`` undoes what was not used: the worker unless the pool adopted it, and the workspace made here unless a
    session was created with it (``claim``)."""

    headstart: Headstart | None
    session_id: str | None = None
    #: The workspace made here, until a session has it.
    made_workspace: Path | None = None
    #: This process's registry of its children, its headstart worker owned there: the supervisor gets it too.
    children: Children = field(default_factory=Children)

    @classmethod
    def start(cls, args: argparse.Namespace) -> RunAhead | None:
        """For ``run`` with an embedded supervisor on a new session; None where its worker cannot be known yet:
        through ``--url``, or continuing a session (whose namespace is in the store)."""
        if args.command != "run" or args.url or args.session:
            return None
        try:
            variables, runtime_config = run_env(args.env), run_config(args)
        except CliError:
            return None  # the command itself reports it
        namespace = args.namespace or DEFAULT_NAMESPACE
        data_dir = Path(args.data_dir)
        session_id = new_id("ses")
        ahead = cls(None, session_id=session_id)
        try:
            if args.workspace:
                workspace = Path(args.workspace).resolve()
            else:  # the session's own, as the engine makes it (``Engine.create_session``)
                secure_data_dir(data_dir)
                workspace = make_workspace(data_dir / "workspaces" / session_id, namespace, data_dir, None)
                ahead.made_workspace = workspace
        except (OSError, ValueError, UnsafeDataDir, WorkspaceRefused):
            return ahead  # the engine's own attempt says what is wrong, in context
        if getattr(args, "isolation", None) not in (None, "namespaced"):
            return ahead  # its worker is the session's own (ephemeral) or the shared one: none to start ahead
        task = {"runtime": args.runtime or DEFAULT_RUNTIME, "runtime_config": runtime_config,
                "workspace": str(workspace),
                # as cmd_run decides: an interactive task's runtime is started able to ask its user
                "interactive": not getattr(args, "non_interactive", False) and sys.stdin.isatty()}
        config = PoolConfig(data_dir=data_dir, env=workers_env({"*": variables}, test_scenarios=True),
                            children=ahead.children)
        ahead.headstart = Headstart.start(config, namespace, runtime_ahead=task)
        return ahead

    def claim(self, workspace: str | None) -> None:
        """A session was created with ``workspace``: if that is the one made here, it is the session's now."""
        if self.made_workspace is not None and workspace is not None and Path(workspace) == self.made_workspace:
            self.made_workspace = None

    def close(self) -> None:
        if self.headstart is not None:
            self.headstart.discard()
        if self.made_workspace is not None:
            with contextlib.suppress(OSError):  # not empty: something is in it, so it is not ours to remove
                self.made_workspace.rmdir()
            self.made_workspace = None
