"""The ``codesdk`` command's front: its command line, and a head start for ``run``.

The standard library only (and the light ``common``, ``run_ahead``, ``workers.launch``, ``namespaces``, ``ids``): for
``run`` on a new session with an embedded supervisor, the front chooses the session's id, makes its workspace and
starts its namespace's worker right here (``RunAhead``), telling that worker what the task will ask so it starts the
runtime's program at once (``worker._ahead``). So the worker's interpreter and the runtime start while this one
imports the supervisor (trio, the protocol's models, the store), instead of after it. Then ``local`` takes over
(and ``remote`` with ``--url``); neither imports this module back.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from codesdk._version import __version__

from ..config import default_data_dir
from .common import (
    add_budget_flags,
    add_fetch_flags,
    add_question_flags,
    DEFAULT_NAMESPACE,
    DEFAULT_RUNTIME,
    ISOLATION_LEVELS,
    SESSION_STATES,
    Parser,
    config_item,
    data_dir,
    env_item,
    namespace_name,
    regex,
    runtime_name,
    seconds,
    strict_values,
)
from .decision_args import add_parsers as add_decision_parsers
from .webhook_args import add_parser as add_webhooks_parser
from .run_ahead import RunAhead

#: ``protocol.PermissionMode``'s values, here without importing the protocol (a test holds them equal).
PERMISSION_MODES = ("ask", "auto", "yolo")


def entry() -> None:
    """The ``codesdk`` command: ``main``, then out without the interpreter's teardown of every module (its output
    is flushed and every process it started is already reaped: nothing is left to finalise)."""
    code = main()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more to say anyway
            pass
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    """Parse, start ``run``'s worker, run the command; its exit code."""
    args = build_parser().parse_args(argv)
    ahead = RunAhead.start(args)
    try:
        from .local import run_command  # the heavy imports, while the worker starts

        return run_command(args, ahead)
    finally:
        if ahead is not None:
            ahead.close()  # not used (a service holds the data dir, an error): nothing may outlive us


def _at_least(low: int) -> Callable[[str], int]:
    """An argparse type: a whole number no smaller than ``low`` (a usage error otherwise, never a traceback)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if value < low:
            raise argparse.ArgumentTypeError(f"expected a whole number of at least {low}, got {text!r}")
        return value

    return parse


def _global_options(parser: argparse.ArgumentParser, *, in_subcommand: bool) -> None:
    """Options every command takes, before or after the subcommand's name (after it, they win)."""
    def default(value: Any) -> Any:
        return argparse.SUPPRESS if in_subcommand else value

    parser.add_argument("--data-dir", type=data_dir, default=default(default_data_dir()),
                        help="where the event store, blobs, workspaces and namespaces live (default: "
                             f"{default_data_dir()})")
    parser.add_argument("-v", "--verbose", action="count", default=default(0),
                        help="more logging on stderr (-vv: debug)")
    parser.add_argument("--url", default=default(os.environ.get("CODESDK_URL") or None),
                        help="use a running supervisor instead (unix:/path/api.sock or http://127.0.0.1:PORT) for "
                             "run, sessions, events, show, auth, runtime-env, bundle, blob, archive, unarchive, delete, fork, "
                             "approvals, decide, grants, revoke, webhooks and acp; token "
                             "from --token or CODESDK_TOKEN")
    parser.add_argument("--token", default=default(None), help="API bearer token (with --url)")


def build_parser() -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = Parser(prog="codesdk", description="CodeSDK: run coding-agent tasks, read sessions.")
    parser.add_argument("--version", action="version", version=f"codesdk {__version__}")
    _global_options(parser, in_subcommand=False)
    common = argparse.ArgumentParser(add_help=False)
    _global_options(common, in_subcommand=True)
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, text: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=text, parents=[common])

    run = command("run", "run a prompt as a task and stream its events as they happen")
    run.add_argument("prompt")
    run.add_argument("--runtime", type=runtime_name, help=f"runtime to use (default: {DEFAULT_RUNTIME}); with --session: move the "
                                        "session to this runtime, which is given the session's transcript")
    run.add_argument("--max-input-tokens", type=_at_least(1), metavar="N",
                     help="cap the compiled input at about N tokens (below the runtime's own budget): large tool "
                          "outputs, then the oldest turns are left out, and model.input reports what (a runtime "
                          "that takes up its own session is sent the prompt only and manages its context itself)")
    run.add_argument("--timeout", type=seconds, metavar="SECONDS",
                     help="the task's deadline, wall clock from its start: past it the task is stopped and fails "
                          "TASK_TIMEOUT (default: the supervisor's; none embedded)")
    run.add_argument("--idle-timeout", type=seconds, metavar="SECONDS",
                     help="stop the task (TASK_TIMEOUT) when its runtime sends no event for this long; time spent "
                          "waiting for an approval or a tool the supervisor runs does not count (default: the "
                          "supervisor's; none embedded)")
    add_budget_flags(run, "budget-", "the task's budget; reaching it stops the task (task.stopped: budget_reached) and "
                                     "pauses its session until `codesdk budget SESSION --raise`")
    run.add_argument("--scenario", help="scripted runtime: scenario name, one of those shipped with the scripted runtime (default: echo)")
    run.add_argument("--config", action="append", type=config_item, metavar="KEY=VALUE", help="extra runtime_config (JSON values)")
    run.add_argument("--session", help="continue an existing session (its transcript is sent along)")
    run.add_argument("--namespace", type=namespace_name, help="credential namespace: default | user:<id> | ci:<job> (default: "
                                          f"{DEFAULT_NAMESPACE}; through --url: the token's own; with --session: the session's)")
    run.add_argument("--workspace", help="directory the tools work in (default: a new one in the data dir)")
    run.add_argument("--title", help="the new session's title, for people (at most 200 characters; `codesdk sessions "
                                     "--search` finds it)")
    run.add_argument("--isolation", choices=ISOLATION_LEVELS,
                     help="where the new session's runtime keeps its HOME: namespaced (the namespace's own; the "
                          "default), ephemeral (one made for the session, removed with it: credentials only from "
                          "the namespace's variables) or shared (your own HOME and logins; namespace default of a "
                          "single-user service only)")
    run.add_argument("--mode", choices=PERMISSION_MODES, default="ask",
                     help="permission mode (default: ask; asks on the terminal, denies when non-interactive)")
    run.add_argument("--non-interactive", action="store_true", help="never prompt; 'ask' decisions become denials")
    run.add_argument("--allow-exec", action="append", metavar="COMMAND",
                     help="enable the sandboxed workspace.exec tool for this command (repeatable)")
    add_fetch_flags(run, "for this command")
    add_question_flags(run, "on the terminal (this command's own supervisor; a service has its own)")
    run.add_argument("--env", action="append", type=env_item, metavar="KEY=VALUE",
                     help="a variable for the namespace's worker and runtime (e.g. ANTHROPIC_BASE_URL); repeatable")
    run.add_argument("--json", action="store_true", help="print events as JSON lines")
    run.add_argument("--steer", action=argparse.BooleanOptionalAction, default=None,
                     help="while the task runs, send each line typed on stdin to it as a message (steering); "
                          "default: on when stdin is a terminal, off otherwise (--steer reads piped lines too; "
                          "--no-steer never reads stdin for it)")

    sessions = command("sessions", "list sessions")
    sessions.add_argument("--namespace", type=namespace_name)
    sessions.add_argument("--limit", type=_at_least(1), default=100, help="at most this many (default 100)")
    sessions.add_argument("--state", choices=SESSION_STATES, default=SESSION_STATES[0],
                          help="live (default: all but the archived), idle, busy, archived or all")
    sessions.add_argument("--search", metavar="TEXT",
                          help="only sessions whose title or one of whose prompts contains TEXT")
    sessions.add_argument("--json", action="store_true")

    for name, text in (("archive", "leave a session out of `codesdk sessions` (kept whole and usable; "
                                   "`codesdk sessions --state archived` lists it)"),
                       ("unarchive", "bring an archived session back into `codesdk sessions`")):
        change = command(name, text)
        change.add_argument("session")
        change.add_argument("--json", action="store_true", help="print the session as JSON")

    delete = command("delete", "delete a session: its events, tasks, the blobs only it held and its default "
                               "workspace (refused while a task of it runs: stop it first); prints what was removed")
    delete.add_argument("session")
    delete.add_argument("--json", action="store_true", help="print what was removed as JSON")

    fork = command("fork", "fork a session at an event into a new session, whose runtime is given the conversation "
                           "up to there; prints the new session's line, its id first")
    fork.add_argument("session")
    fork.add_argument("--at", type=_at_least(1), metavar="SEQ",
                      help="the last event the fork keeps (default: the newest before any running task); not one "
                           "inside a task")
    fork.add_argument("--title", help="the fork's title (default: the session's)")
    fork.add_argument("--new-workspace", action="store_true",
                      help="give the fork an empty workspace of its own (default: it works in the session's)")
    fork.add_argument("--json", action="store_true", help="print the new session as JSON")

    budget = command("budget", "a session's budget: show it, set its limits, or raise it once paused (--raise)")
    budget.add_argument("session")
    add_budget_flags(budget, "", "the session's limit")
    budget.add_argument("--raise", dest="raise_", action="store_true",
                        help="end the session's pause at its budget: the limits given replace its own")
    budget.add_argument("--continue", dest="continue_", action="store_true",
                        help="with --raise: start a task that goes on with the work (through a running service; "
                             "embedded, raise and then `codesdk run --session SESSION PROMPT`)")
    budget.add_argument("--json", action="store_true", help="print the budget as JSON")

    events = command("events", "print a session's events from the store")
    events.add_argument("session")
    events.add_argument("--after", type=_at_least(0), default=0, help="only events with seq > AFTER")
    events.add_argument("--follow", "-f", action="store_true", help="keep printing new events as they are stored")
    events.add_argument("--json", action="store_true")

    show = command("show", "print a session's transcript")
    show.add_argument("session")
    show.add_argument("--json", action="store_true")

    auth = command("auth", "is a runtime logged in for a namespace (status), or log it in there (login)")
    auth.add_argument("action", nargs="?", choices=["status", "login"], default="status",
                      help="status (default): logged in or not, and how to log in; login: run the runtime's own "
                           "login with the namespace's HOME (it prints a URL; CodeSDK never opens a browser)")
    auth.add_argument("--runtime", type=runtime_name, default="claude")
    auth.add_argument("--namespace", type=namespace_name, default="default")
    auth.add_argument("--json", action="store_true")

    runtime_env = command("runtime-env", "what a namespace's worker runs with: HOME and XDG folders, variable names "
                                         "(never values), its uid, and what each runtime would load on its own")
    runtime_env.add_argument("namespace", type=namespace_name, nargs="?", default="default")
    runtime_env.add_argument("--session", help="also look for project files in this session's workspace")
    runtime_env.add_argument("--json", action="store_true")

    bundle = command("bundle", "write a support bundle of a session (events, blobs, versions, worker logs; "
                               "secrets redacted), or check and summarize one (--inspect)")
    bundle.add_argument("session", nargs="?", help="the session to bundle")
    bundle.add_argument("-o", "--output", type=Path, help="the archive to write (default: codesdk-bundle-SESSION.tar.gz)")
    bundle.add_argument("--force", action="store_true", help="overwrite the output file if it exists")
    bundle.add_argument("--redact", action="append", type=regex, metavar="REGEX",
                        help="also redact what matches REGEX (repeatable; beside <data-dir>/bundle-redact.txt)")
    bundle.add_argument("--inspect", metavar="FILE", type=Path,
                        help="check a bundle against its manifest and summarize it (writes nothing)")
    bundle.add_argument("--json", action="store_true", help="--inspect: print the manifest as JSON")

    blob = command("blob", "write a blob a session's events name (a tool's result, a compiled input, a raw message: "
                           "the value of an event's *_ref field) to a file or stdout")
    blob.add_argument("session", help="the session whose events name it")
    blob.add_argument("ref", help="sha256:<hex> (as the event carries it), or the hex alone")
    blob.add_argument("-o", "--output", type=Path, help="the file to write (default: stdout)")
    blob.add_argument("--force", action="store_true", help="overwrite the output file if it exists")

    namespaces = command("namespaces", "list credential namespaces and their directories")
    namespaces.add_argument("--json", action="store_true")

    add_decision_parsers(command)
    add_webhooks_parser(command, common)

    acp = command("acp", "serve CodeSDK as an Agent Client Protocol agent on stdin/stdout, for editors (Zed, "
                         "JetBrains IDEs...); through a running service with --url, else an embedded supervisor")
    acp.add_argument("--namespace", type=namespace_name,
                     help="the namespace new sessions go to (default: as for run: the token's own)")
    acp.add_argument("--runtime", type=runtime_name, help=f"new sessions' runtime (default: {DEFAULT_RUNTIME})")
    acp.add_argument("--cwd-workspace", action=argparse.BooleanOptionalAction, default=None,
                     help="the editor's cwd becomes a new session's workspace (default: on embedded; through a "
                          "service the admin token only, else the service gives the session its own)")
    acp.add_argument("--allow-exec", action="append", metavar="COMMAND",
                     help="embedded: enable the sandboxed workspace.exec tool for this command (repeatable)")
    add_fetch_flags(acp, "(embedded)")
    acp.add_argument("--env", action="append", type=env_item, metavar="KEY=VALUE",
                     help="embedded: a variable for the workers and runtimes (e.g. ANTHROPIC_BASE_URL); repeatable")
    return strict_values(parser)


if __name__ == "__main__":
    entry()
