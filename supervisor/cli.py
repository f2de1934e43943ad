"""``codesdk``: run tasks through an in-process supervisor and read sessions back from the store.

Every command works on a data dir (``--data-dir``, default: see ``supervisor.config``). Errors a user
can cause print one clear line to stderr and exit non-zero; ``run`` exits 0 only if the task completed.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from functools import partial
from pathlib import Path
from typing import Any

import trio

from codesdk import ApiError
from protocol import InteractionMode, PermissionMode

from . import cli_remote
from .app import SupervisorOptions, open_engine
from .config import default_data_dir
from .engine import ApprovalRequest, ApproverAnswer, EngineError
from .engine._transcript import derive_transcript
from .namespaces import InvalidNamespace
from .render import EventPrinter, json_line, print_stored_events, print_transcript
from .store import EventStore, StoreError

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_STOPPED, EXIT_INTERRUPTED = 0, 1, 2, 3, 130


class CliError(Exception):
    """A user error: printed as one line, exit code 2."""


# -- run ------------------------------------------------------------------------------------------


async def _terminal_approver(request: ApprovalRequest) -> ApproverAnswer:
    """Ask on the terminal. Anything but y/yes denies."""
    shown = json.dumps(request.input, ensure_ascii=False)[:300]
    sys.stderr.write(f"\n? {request.tool_name} ({request.tool_class}) wants to run with {shown}\n"
                     f"  {request.reason}\n  Allow? [y/N] ")
    sys.stderr.flush()
    answer = await trio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
    allow = answer.strip().lower() in ("y", "yes")
    return ApproverAnswer(allow=allow, reason="approved on the terminal" if allow else "denied on the terminal")


async def cmd_run(args: argparse.Namespace) -> int:
    runtime_config: dict[str, Any] = {}
    if args.scenario:
        runtime_config["scenario"] = args.scenario
    for item in args.config or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise CliError(f"--config expects KEY=VALUE, got {item!r}")
        try:
            runtime_config[key] = json.loads(value)
        except json.JSONDecodeError:
            runtime_config[key] = value
    if args.url:
        return await cli_remote.run(args, runtime_config)
    interactive = not args.non_interactive and sys.stdin.isatty()
    printer = EventPrinter(sys.stdout, color=sys.stdout.isatty() and not os.environ.get("NO_COLOR"))
    worker_env: dict[str, str] = {}
    for item in args.env or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CliError(f"--env expects KEY=VALUE, got {item!r}")
        worker_env[key] = value
    options = SupervisorOptions(data_dir=args.data_dir, exec_allowlist=tuple(args.allow_exec or ()),
                                worker_env={args.namespace: worker_env})
    async with open_engine(options) as engine:
        if args.session:
            session = await engine.store.get_session(args.session)
        else:
            workspace = Path(args.workspace).resolve() if args.workspace else None
            if workspace is not None and not workspace.is_dir():
                raise CliError(f"--workspace {args.workspace} is not a directory")
            session = await engine.create_session(runtime=args.runtime, namespace=args.namespace, workspace=workspace)
        before = 0 if not args.session else await engine.store.last_seq(session.session_id)
        task = await engine.start_task(
            session.session_id, args.prompt, permission_mode=PermissionMode(args.mode),
            interaction_mode=InteractionMode.INTERACTIVE if interactive else InteractionMode.NON_INTERACTIVE,
            runtime_config=runtime_config, approver=_terminal_approver if interactive else None)
        if not args.json:
            printer.note(f"session {session.session_id}  task {task.task_id}  runtime {session.runtime}  "
                         f"namespace {session.namespace}  workspace {session.workspace}")
        interrupted = False
        with trio.open_signal_receiver(signal.SIGINT) as sigint:
            async with trio.open_nursery() as nursery:

                async def stop_on_ctrl_c() -> None:
                    nonlocal interrupted
                    async for _ in sigint:
                        interrupted = True
                        await engine.stop_task(task.task_id, reason="interrupted (Ctrl-C)")
                        return

                nursery.start_soon(stop_on_ctrl_c)
                async with engine.store.subscribe(session.session_id, after_seq=before, until_terminal=True) as sub:
                    async for event in sub:
                        if args.json:
                            json_line(event.to_json_obj())
                        else:
                            printer.print(event)
                nursery.cancel_scope.cancel()
        record = await engine.wait_task(task.task_id)
        if not args.json:
            printer.note(f"task {record.state}. Read it again: codesdk events {session.session_id}  |  "
                         f"transcript: codesdk show {session.session_id}")
    if interrupted:
        return EXIT_INTERRUPTED
    return {"completed": EXIT_OK, "stopped": EXIT_STOPPED}.get(str(record.state), EXIT_FAILED)


# -- reading the store ----------------------------------------------------------------------------


async def cmd_sessions(args: argparse.Namespace) -> int:
    if args.url:
        return await cli_remote.sessions(args)
    async with _store(args) as store:
        sessions = await store.list_sessions(namespace=args.namespace, limit=args.limit)
        for s in sessions:
            tasks = await store.list_tasks(s.session_id)
            last = tasks[-1].state.value if tasks else "-"
            if args.json:
                json_line({**s.to_json_obj(), "tasks": len(tasks), "last_task_state": last})
            else:
                print(f"{s.session_id}  {s.created_at:%Y-%m-%d %H:%M:%S}  {s.runtime:<9} {s.namespace:<16} "
                      f"tasks={len(tasks):<3} last={last:<9} events={s.last_seq}")
        if not sessions and not args.json:
            print("no sessions yet — start one with: codesdk run \"hello\"", file=sys.stderr)
    return EXIT_OK


async def cmd_events(args: argparse.Namespace) -> int:
    if args.url:
        return await cli_remote.events(args)
    printer = EventPrinter(sys.stdout, color=sys.stdout.isatty() and not os.environ.get("NO_COLOR"))
    async with _store(args) as store:
        await store.get_session(args.session)
        if args.follow:
            async with store.subscribe(args.session, after_seq=args.after) as sub:
                async for event in sub:
                    json_line(event.to_json_obj()) if args.json else printer.print(event)
            return EXIT_OK
        await print_stored_events(partial(store.read, args.session), args.after, args.json, printer)
    return EXIT_OK


async def cmd_show(args: argparse.Namespace) -> int:
    if args.url:
        return await cli_remote.show(args)
    async with _store(args) as store:
        session = await store.get_session(args.session)
        messages = await derive_transcript(store, args.session)
        if not args.json:
            print(f"session {session.session_id} ({session.runtime}, namespace {session.namespace})")
        print_transcript(messages, sys.stdout, as_json=args.json)
    return EXIT_OK


async def cmd_auth(args: argparse.Namespace) -> int:
    """Login state of a runtime in a namespace, asked of that namespace's own worker."""
    options = SupervisorOptions(data_dir=args.data_dir, idle_timeout_s=1.0)
    async with open_engine(options) as engine:
        result = await engine.ensure_login(args.namespace, args.runtime)
    if args.json:
        json_line(result.to_json_obj())
    else:
        status = result.status
        hint = f" ({status.method}{', ' + status.account_hint if status.account_hint else ''})" if status.method else ""
        print(f"{args.runtime} in {args.namespace}: {status.state}{hint}")
        if result.instructions:
            print(f"  to log in: {result.instructions}")
        elif status.message:
            print(f"  {status.message}")
    return EXIT_OK if result.logged_in else EXIT_FAILED


async def cmd_namespaces(args: argparse.Namespace) -> int:
    root = Path(args.data_dir) / "namespaces"
    async with _store(args) as store:
        sessions = await store.list_sessions(limit=100_000)
    counts: dict[str, int] = {}
    for s in sessions:
        counts[s.namespace] = counts.get(s.namespace, 0) + 1
    dirs = sorted(p.name for p in root.iterdir()) if root.is_dir() else []
    names = sorted(set(counts) | {d.replace(".", ":", 1) if d != "default" else d for d in dirs})
    for name in names:
        safe = name.replace(":", ".", 1)
        home = root / safe / "home"
        row = {"namespace": name, "sessions": counts.get(name, 0), "home": str(home) if home.exists() else None}
        if args.json:
            json_line(row)
        else:
            print(f"{name:<24} sessions={row['sessions']:<4} home={row['home'] or '(no worker started yet)'}")
    if not names and not args.json:
        print("no namespaces yet", file=sys.stderr)
    return EXIT_OK


def _store(args: argparse.Namespace) -> Any:
    if not Path(args.data_dir).exists():
        raise CliError(f"no data in {args.data_dir} yet (run a task first, or pass --data-dir)")
    return EventStore.open(args.data_dir)


# -- entry point ----------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="codesdk", description="CodeSDK: run coding-agent tasks, read sessions.")
    parser.add_argument("--data-dir", type=Path, default=default_data_dir(),
                        help="where the event store, blobs, workspaces and namespaces live (default: %(default)s)")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging on stderr (-vv: debug)")
    parser.add_argument("--url", default=os.environ.get("CODESDK_URL"),
                        help="use a running supervisor instead (unix:/path/api.sock or http://127.0.0.1:PORT) for "
                             "run, sessions, events and show; token from --token or CODESDK_TOKEN")
    parser.add_argument("--token", default=None, help="API bearer token (with --url)")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run a prompt as a task and stream its events as they happen")
    run.add_argument("prompt")
    run.add_argument("--runtime", default="scripted", help="runtime to use (default: scripted)")
    run.add_argument("--scenario", help="scripted runtime: scenario name from fixtures/scenarios (default: echo)")
    run.add_argument("--config", action="append", metavar="KEY=VALUE", help="extra runtime_config (JSON values)")
    run.add_argument("--session", help="continue an existing session (its transcript is sent along)")
    run.add_argument("--namespace", default="default", help="credential namespace: default | user:<id> | ci:<job>")
    run.add_argument("--workspace", help="directory the tools work in (default: a new one in the data dir)")
    run.add_argument("--mode", choices=[m.value for m in PermissionMode], default="ask",
                     help="permission mode (default: ask; asks on the terminal, denies when non-interactive)")
    run.add_argument("--non-interactive", action="store_true", help="never prompt; 'ask' decisions become denials")
    run.add_argument("--allow-exec", action="append", metavar="COMMAND",
                     help="enable the sandboxed workspace.exec tool for this command (repeatable)")
    run.add_argument("--env", action="append", metavar="KEY=VALUE",
                     help="a variable for the namespace's worker and runtime (e.g. ANTHROPIC_BASE_URL); repeatable")
    run.add_argument("--json", action="store_true", help="print events as JSON lines")
    run.set_defaults(handler=cmd_run)

    sessions = sub.add_parser("sessions", help="list sessions")
    sessions.add_argument("--namespace")
    sessions.add_argument("--limit", type=int, default=100)
    sessions.add_argument("--json", action="store_true")
    sessions.set_defaults(handler=cmd_sessions)

    events = sub.add_parser("events", help="print a session's events from the store")
    events.add_argument("session")
    events.add_argument("--after", type=int, default=0, help="only events with seq > AFTER")
    events.add_argument("--follow", "-f", action="store_true", help="keep printing new events as they are stored")
    events.add_argument("--json", action="store_true")
    events.set_defaults(handler=cmd_events)

    show = sub.add_parser("show", help="print a session's transcript")
    show.add_argument("session")
    show.add_argument("--json", action="store_true")
    show.set_defaults(handler=cmd_show)

    auth = sub.add_parser("auth", help="is a runtime logged in for a namespace, and how to log it in")
    auth.add_argument("--runtime", default="claude")
    auth.add_argument("--namespace", default="default")
    auth.add_argument("--json", action="store_true")
    auth.set_defaults(handler=cmd_auth)

    namespaces = sub.add_parser("namespaces", help="list credential namespaces and their directories")
    namespaces.add_argument("--json", action="store_true")
    namespaces.set_defaults(handler=cmd_namespaces)
    return parser


_USER_ERRORS = (CliError, EngineError, StoreError, InvalidNamespace, cli_remote.RemoteError, ApiError)


def _user_error(exc: BaseException) -> BaseException | None:
    """The user error inside ``exc`` (unwrapping trio's exception groups), if that's what it is."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc if isinstance(exc, _USER_ERRORS) else None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)]
    logging.basicConfig(stream=sys.stderr, level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(trio.run(args.handler, args))
    except (*_USER_ERRORS, BaseExceptionGroup) as exc:
        user_error = _user_error(exc)
        if user_error is None:
            raise
        print(f"codesdk: {user_error}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
