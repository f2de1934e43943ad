"""The ``codesdk`` command's front: its command line, and a head start for ``run``'s worker.

The standard library only (and the light ``worker_launch``): ``run`` starts its namespace's worker right here,
so that the worker's interpreter starts while this one imports the supervisor (trio, the protocol's models, the
store), instead of after it. Then ``supervisor.cli`` takes over.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any

from .cli_common import DEFAULT_NAMESPACE, DEFAULT_RUNTIME, CliError
from .config import default_data_dir
from .worker_launch import Headstart, PoolConfig, workers_env

#: ``protocol.PermissionMode``'s values, here without importing the protocol (a test holds them equal).
PERMISSION_MODES = ("ask", "auto", "yolo")


def entry() -> None:
    """The ``codesdk`` command: parse, start ``run``'s worker, run the command, then out without the
    interpreter's teardown of every module (its output is flushed and every process it started is already
    reaped: nothing is left to finalise)."""
    args = build_parser().parse_args()
    headstart = start_worker_ahead(args)
    try:
        from .cli import run_command  # the heavy imports, while the worker starts

        code = run_command(args, headstart)
    finally:
        if headstart is not None:
            headstart.discard()  # not adopted (a service holds the data dir, an error): nothing may outlive us
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more to say anyway
            pass
    os._exit(code)


def start_worker_ahead(args: argparse.Namespace) -> Headstart | None:
    """For ``run`` with an embedded supervisor on a new session: its namespace's worker, launched now, exactly
    as the supervisor's pool will want it (else the pool discards it). None where that cannot be known yet:
    through ``--url``, or continuing a session (whose namespace is in the store)."""
    if args.command != "run" or args.url or args.session:
        return None
    try:
        variables = run_env(args.env)
    except CliError:
        return None  # the command itself reports it
    config = PoolConfig(data_dir=Path(args.data_dir), env=workers_env({"*": variables}, test_scenarios=True))
    return Headstart.start(config, args.namespace or DEFAULT_NAMESPACE)


def run_env(items: list[str] | None) -> dict[str, str]:
    """``run --env KEY=VALUE ...`` as a mapping (``CliError`` on a malformed one)."""
    variables: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CliError(f"--env expects KEY=VALUE, got {item!r}")
        variables[key] = value
    return variables


def _global_options(parser: argparse.ArgumentParser, *, in_subcommand: bool) -> None:
    """Options every command takes, before or after the subcommand's name (after it, they win)."""
    def default(value: Any) -> Any:
        return argparse.SUPPRESS if in_subcommand else value

    parser.add_argument("--data-dir", type=Path, default=default(default_data_dir()),
                        help="where the event store, blobs, workspaces and namespaces live (default: "
                             f"{default_data_dir()})")
    parser.add_argument("-v", "--verbose", action="count", default=default(0),
                        help="more logging on stderr (-vv: debug)")
    parser.add_argument("--url", default=default(os.environ.get("CODESDK_URL")),
                        help="use a running supervisor instead (unix:/path/api.sock or http://127.0.0.1:PORT) for "
                             "run, sessions, events, show and auth; token from --token or CODESDK_TOKEN")
    parser.add_argument("--token", default=default(None), help="API bearer token (with --url)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="codesdk", description="CodeSDK: run coding-agent tasks, read sessions.")
    _global_options(parser, in_subcommand=False)
    common = argparse.ArgumentParser(add_help=False)
    _global_options(common, in_subcommand=True)
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, text: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=text, parents=[common])

    run = command("run", "run a prompt as a task and stream its events as they happen")
    run.add_argument("prompt")
    run.add_argument("--runtime", help=f"runtime to use (default: {DEFAULT_RUNTIME}; with --session: the session's)")
    run.add_argument("--scenario", help="scripted runtime: scenario name from fixtures/scenarios (default: echo)")
    run.add_argument("--config", action="append", metavar="KEY=VALUE", help="extra runtime_config (JSON values)")
    run.add_argument("--session", help="continue an existing session (its transcript is sent along)")
    run.add_argument("--namespace", help="credential namespace: default | user:<id> | ci:<job> (default: "
                                          f"{DEFAULT_NAMESPACE}; with --session: the session's)")
    run.add_argument("--workspace", help="directory the tools work in (default: a new one in the data dir)")
    run.add_argument("--mode", choices=PERMISSION_MODES, default="ask",
                     help="permission mode (default: ask; asks on the terminal, denies when non-interactive)")
    run.add_argument("--non-interactive", action="store_true", help="never prompt; 'ask' decisions become denials")
    run.add_argument("--allow-exec", action="append", metavar="COMMAND",
                     help="enable the sandboxed workspace.exec tool for this command (repeatable)")
    run.add_argument("--env", action="append", metavar="KEY=VALUE",
                     help="a variable for the namespace's worker and runtime (e.g. ANTHROPIC_BASE_URL); repeatable")
    run.add_argument("--json", action="store_true", help="print events as JSON lines")

    sessions = command("sessions", "list sessions")
    sessions.add_argument("--namespace")
    sessions.add_argument("--limit", type=int, default=100)
    sessions.add_argument("--json", action="store_true")

    events = command("events", "print a session's events from the store")
    events.add_argument("session")
    events.add_argument("--after", type=int, default=0, help="only events with seq > AFTER")
    events.add_argument("--follow", "-f", action="store_true", help="keep printing new events as they are stored")
    events.add_argument("--json", action="store_true")

    show = command("show", "print a session's transcript")
    show.add_argument("session")
    show.add_argument("--json", action="store_true")

    auth = command("auth", "is a runtime logged in for a namespace (status), or log it in there (login)")
    auth.add_argument("action", nargs="?", choices=["status", "login"], default="status",
                      help="status (default): logged in or not, and how to log in; login: run the runtime's own "
                           "login with the namespace's HOME (it prints a URL; CodeSDK never opens a browser)")
    auth.add_argument("--runtime", default="claude")
    auth.add_argument("--namespace", default="default")
    auth.add_argument("--json", action="store_true")

    namespaces = command("namespaces", "list credential namespaces and their directories")
    namespaces.add_argument("--json", action="store_true")
    return parser
if __name__ == "__main__":
    entry()
