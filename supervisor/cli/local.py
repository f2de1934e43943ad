"""``codesdk``: run tasks through an in-process supervisor and read sessions back from the store.

Every command works on a data dir (``--data-dir``, default: see ``supervisor.config``). Errors a user
can cause print one clear line to stderr and exit non-zero; ``run`` exits 0 only if the task completed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from functools import partial
from pathlib import Path
from typing import IO, Any, TypeVar

import trio

from codesdk.protocol import (
    HASH_PREFIX,
    BudgetLimits,
    EnsureLoginResult,
    GrantScope,
    InteractionMode,
    QuestionReply,
    IsolationLevel,
    PermissionMode,
    api,
    is_hash,
)

from ..service.assembly import SupervisorOptions, open_engine
from .common import (
    DEFAULT_NAMESPACE,
    DEFAULT_RUNTIME,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    STOP_SIGNALS,
    CliError,
    api_exit_code,
    DECISION_PROMPT,
    LineReader,
    ask_decision_on_terminal,
    budget_limits,
    check_session_flags,
    check_title,
    exit_code,
    fetch_flags_refusal,
    fetch_options,
    question_policy,
    read_again,
    read_terminal,
    run_config,
    run_env,
    runtime_note,
)
from .questions import ask_on_terminal as ask_questions
from .run_ahead import RunAhead
from ..api.views import budget_answer, deleted_answer, grant_answer, runtime_env_answer, session_answer
from ..terminal import one_line
from .typed import TypedLines, reads_lines, typed_note
from ..config import ADMIN_TOKEN_FILE
from ..engine import (
    Answerer,
    ApprovalRequest,
    Approver,
    ApproverAnswer,
    Engine,
    EngineError,
    TaskNotActive,
    derive_transcript,
    error_status,
)
from .login import run_login
from ..namespaces import InvalidNamespace, UnsafeDataDir
from .render import (
    EventPrinter,
    budget_note,
    deleted_line,
    isolation_note,
    json_line,
    print_budget,
    print_runtime_env,
    print_stored_events,
    print_transcript,
    session_line,
)
from ..workers.launch import WorkerPolicy
from ..store import DataDirBusy, EventStore, QuestionRecord, StoreError, StoreReader

T = TypeVar("T")

# -- run ------------------------------------------------------------------------------------------


def _terminal_approver(read: LineReader) -> Approver:
    """Ask on the terminal, each answer read by ``read`` (the typed lines' reader when it owns stdin): once, for
    the task or the session (a grant), or no."""
    async def approve(request: ApprovalRequest) -> ApproverAnswer:
        shown = json.dumps(request.input, ensure_ascii=False)[:300]
        allow, scope, reason = await ask_decision_on_terminal(
            f"\n? {request.tool_name} ({request.tool_class}) wants to run with {shown}\n  {request.reason}\n"
            f"{DECISION_PROMPT}", read)
        return ApproverAnswer(allow=allow, reason=reason, scope=GrantScope(scope))
    return approve


def _terminal_answerer(read: LineReader) -> Answerer:
    """Ask a runtime's question on the terminal (its ``question.requested`` was printed just before)."""
    async def answer(record: QuestionRecord) -> QuestionReply:
        return await ask_questions(record.request.message, record.request.questions, read)
    return answer


async def cmd_run(args: argparse.Namespace, ahead: RunAhead | None = None) -> int:
    runtime_config = run_config(args)
    if (refusal := fetch_flags_refusal(args)) is not None:
        raise CliError(refusal)
    if args.session and args.workspace:
        raise CliError("--workspace cannot be used with --session: a session keeps the workspace it was created with")
    if args.session and args.title:
        raise CliError("--title names a new session; it cannot be used with --session")
    check_title("--title", args.title)
    if args.url:
        from .remote import run_via_api  # imported only when used: the HTTP client costs start-up time
        return await run_via_api(args, runtime_config)
    # This supervisor serves one task in one namespace: the variables are that namespace's.
    options = SupervisorOptions(data_dir=args.data_dir, exec_allowlist=tuple(args.allow_exec or ()),
                                fetch=fetch_options(args), fetch_unattended=args.allow_fetch_unattended,
                                worker_env={"*": run_env(args.env)}, holder="codesdk run", test_scenarios=True,
                                questions=question_policy(args),
                                children=ahead.children if ahead is not None else None)  # its headstart's
    with trio.open_signal_receiver(*STOP_SIGNALS) as signals:
        try:
            async with open_engine(options) as engine:
                if ahead is not None and ahead.headstart is not None:
                    engine.pool.offer(ahead.headstart)
                return await _run_embedded(args, engine, runtime_config, signals, ahead)
        except DataDirBusy as busy:
            _service_instead(args, busy)
    from .remote import run_via_api  # imported only when used: the HTTP client costs start-up time
    return await run_via_api(args, runtime_config)


async def _run_embedded(args: argparse.Namespace, engine: Engine, runtime_config: dict[str, Any],
                        signals: AsyncIterator[int], ahead: RunAhead | None) -> int:
    interactive = not args.non_interactive and sys.stdin.isatty()
    printer = EventPrinter(sys.stdout, color=sys.stdout.isatty() and not os.environ.get("NO_COLOR"))
    if args.session:
        session = await engine.store.get_session(args.session)
        check_session_flags(args, session.namespace)
        engine.prewarm(session.namespace)
        switching = bool(args.runtime) and args.runtime != session.runtime
        if switching or runtime_config:
            await engine.check_offer(session.namespace, args.runtime or session.runtime, runtime_config,
                                     available=switching, worker_needed=switching)
    else:
        isolation = IsolationLevel(args.isolation or IsolationLevel.NAMESPACED)
        if isolation == IsolationLevel.NAMESPACED:  # another level's worker is the session's own: made with it
            engine.prewarm(args.namespace or DEFAULT_NAMESPACE)  # the worker starts while the session is made
        workspace = Path(args.workspace).resolve() if args.workspace else None
        if workspace is not None and not workspace.is_dir():
            raise CliError(f"--workspace {args.workspace} is not a directory")
        check_session_flags(args, args.namespace or DEFAULT_NAMESPACE)
        if args.runtime or runtime_config:
            await engine.check_offer(args.namespace or DEFAULT_NAMESPACE, args.runtime or DEFAULT_RUNTIME,
                                     runtime_config, available=bool(args.runtime))
        session = await engine.create_session(runtime=args.runtime or DEFAULT_RUNTIME,
                                              namespace=args.namespace or DEFAULT_NAMESPACE, workspace=workspace,
                                              session_id=ahead.session_id if ahead is not None else None,
                                              title=args.title, isolation=isolation)
        if ahead is not None:
            ahead.claim(session.workspace)
    before = await engine.store.last_seq(session.session_id) if args.session else 0  # a new one: session.created
    running: list[str] = []

    async def send_line(text: str) -> str:
        return (await engine.send_input(running[0], text)).delivery.value

    lines = TypedLines(send_line, typed_note(args, printer)) if reads_lines(args) else None
    read: LineReader = lines.read if lines is not None else read_terminal
    task = await engine.start_task(
        session.session_id, args.prompt, permission_mode=PermissionMode(args.mode),
        interaction_mode=InteractionMode.INTERACTIVE if interactive else InteractionMode.NON_INTERACTIVE,
        runtime_config=runtime_config,
        approver=_terminal_approver(read) if interactive else None,
        answerer=_terminal_answerer(read) if interactive else None,
        runtime=args.runtime, max_input_tokens=args.max_input_tokens, timeout_s=args.timeout,
        idle_timeout_s=args.idle_timeout, budget=_budget_of(args))
    if not args.json:
        printer.note(f"session {session.session_id}  task {task.task_id}  runtime "
                     f"{runtime_note(task.runtime, session.runtime)}  "
                     f"namespace {session.namespace}  workspace {session.workspace}")
    received: list[int] = []
    async with trio.open_nursery() as nursery:

        async def stop_on_signal() -> None:
            async for signum in signals:
                received.append(signum)
                name = signal.Signals(signum).name
                with contextlib.suppress(TaskNotActive):  # it ended meanwhile: its end is being printed
                    await engine.stop_task(task.task_id, reason=f"interrupted ({name})", requested_by="user")
                return

        nursery.start_soon(stop_on_signal)
        running.append(task.task_id)
        if lines is not None:
            nursery.start_soon(lines.run)
        async with engine.store.subscribe(session.session_id, after_seq=before, until_terminal=True) as sub:
            async for event in sub:
                if args.json:
                    json_line(event.to_json_obj())
                else:
                    printer.print(event)
        nursery.cancel_scope.cancel()
    record = await engine.wait_task(task.task_id)
    if not args.json:
        printer.note(f"task {record.state}. Read it again: {read_again(args, 'events', session.session_id)}  |  "
                     f"transcript: {read_again(args, 'show', session.session_id)}")
    return exit_code(record.terminal_type, received[0] if received else None)


def _service_instead(args: argparse.Namespace, busy: DataDirBusy) -> None:
    """The data dir is held by a running service: use its API as the local admin (``--url``/``--token`` are
    filled in), or stop with what to do — whom it is held by, and ``--url``."""
    holder = busy.holder
    url = next((a for a in holder.api if a.startswith("unix:")), None) if holder is not None else None
    if url is None:
        raise CliError(str(busy))
    token_file = Path(args.data_dir) / ADMIN_TOKEN_FILE
    try:
        token = token_file.read_text().strip()
    except OSError as exc:
        raise CliError(f"{busy} (its admin token {token_file} is not readable here: {exc.strerror}; pass "
                       f"--url {url} --token TOKEN)") from exc
    assert holder is not None
    print(f"codesdk: {args.data_dir} is in use by {holder.describe()}; going through its API at {url}",
          file=sys.stderr)
    args.url, args.token = url, token
    args.url_from_data_dir = True  # reading it again goes the same way: by the data dir


# -- reading the store ----------------------------------------------------------------------------


async def cmd_sessions(args: argparse.Namespace) -> int:
    check_title("--search", args.search)
    if args.url:
        from .remote import sessions_via_api  # imported only when used: the HTTP client costs start-up time
        return await sessions_via_api(args)
    async with _store(args) as store:
        sessions = await store.list_sessions(namespace=args.namespace, limit=args.limit,
                                             state=api.SessionFilter(args.state), text=args.search)
        for s in sessions:
            tasks = await store.list_tasks(s.session_id)
            last = tasks[-1].state.value if tasks else "-"
            state = session_answer(s).state.value
            if args.json:
                json_line({**s.to_json_obj(), "state": state, "tasks": len(tasks), "last_task_state": last})
            else:
                title = f"  {one_line(s.title)}" if s.title else ""
                print(f"{s.session_id}  {s.created_at:%Y-%m-%d %H:%M:%S}  {s.runtime:<9} {s.namespace:<16} "
                      f"tasks={len(tasks):<3} last={last:<9} events={s.last_seq} state={state}"
                      f"{isolation_note(s.isolation)}{budget_note(s.budget)}{title}")
        if not sessions and not args.json:
            if args.search or args.state != api.SessionFilter.LIVE:
                print(f"no {args.state} sessions{' with that text' if args.search else ''}", file=sys.stderr)
            elif await store.list_sessions(namespace=args.namespace, limit=1, state=api.SessionFilter.ARCHIVED):
                print("no live sessions; `codesdk sessions --state archived` lists the archived", file=sys.stderr)
            else:
                print("no sessions yet — start one with: codesdk run \"hello\"", file=sys.stderr)
    return EXIT_OK


# -- a session's life: archive, unarchive, delete, fork -----------------------------------------------------------


async def _embedded(args: argparse.Namespace, change: Callable[[Engine], Awaitable[T]]) -> T | None:
    """``change`` done by a supervisor embedded on the data dir; None when it is to go through the API instead:
    ``--url``, or a running service holds the data dir (``args.url`` and ``args.token`` are then its own)."""
    if args.url:
        return None
    if not Path(args.data_dir).exists():
        raise CliError(f"no data in {args.data_dir} yet (run a task first, or pass --data-dir)")
    try:
        async with open_engine(SupervisorOptions(data_dir=args.data_dir, holder=f"codesdk {args.command}")) as engine:
            return await change(engine)
    except DataDirBusy as busy:
        _service_instead(args, busy)
    return None


def _budget_of(args: argparse.Namespace, prefix: str = "budget_") -> BudgetLimits | None:
    limits = budget_limits(args, prefix)
    return None if limits is None else BudgetLimits.model_validate(limits)


async def cmd_budget(args: argparse.Namespace) -> int:
    """Show a session's budget, set its limits, or raise it once paused (``--raise``)."""
    limits = _budget_of(args, "")
    if args.continue_ and not args.raise_:
        raise CliError("--continue goes with --raise: it starts the task that goes on once the budget is raised")
    if args.raise_ and args.continue_ and not args.url:
        raise CliError("--continue needs a running service (--url): an embedded supervisor ends with the command. "
                       f"Raise without it, then: codesdk run --session {args.session} \"continue\"")

    async def change(engine: Engine) -> api.SessionBudgetView:
        if args.raise_:
            record, _ = await engine.raise_budget(args.session, limits or BudgetLimits(), by="cli")
        elif limits is not None:
            record = await engine.set_budget(args.session, limits, by="cli")
        else:
            record = await engine.store.get_session(args.session)
        return budget_answer(record)

    view: api.SessionBudgetView | None = await _embedded(args, change)
    if view is None:
        from .remote import budget_via_api  # imported only when used: the HTTP client costs start-up time
        view = await budget_via_api(args, limits)
    if args.json:
        json_line(view.to_json_obj())
    else:
        print_budget(view)
    return EXIT_OK


async def cmd_archive(args: argparse.Namespace) -> int:
    """``archive`` or ``unarchive`` a session; prints it as it is now."""
    archived = args.command == "archive"

    async def change(engine: Engine) -> api.Session:
        return session_answer(await engine.update_session(args.session, archived=archived, by="cli"))

    session = await _embedded(args, change)
    if session is None:
        from .remote import archive_via_api  # imported only when used: the HTTP client costs start-up time
        session = await archive_via_api(args, archived)
    if args.json:
        json_line(session.to_json_obj())
        return EXIT_OK
    print(session_line(session))
    if archived:
        print(f"codesdk: `codesdk sessions` leaves {session.session_id} out now (--state archived lists it); bring it "
              f"back with: {read_again(args, 'unarchive', session.session_id)}", file=sys.stderr)
    return EXIT_OK


async def cmd_delete(args: argparse.Namespace) -> int:
    """Delete a session (not while a task of it runs); prints what was removed."""

    async def change(engine: Engine) -> api.DeletedSession:
        dropped, removed = await engine.delete_session(args.session, by="cli")
        return deleted_answer(dropped, removed)

    deleted = await _embedded(args, change)
    if deleted is None:
        from .remote import delete_via_api  # imported only when used: the HTTP client costs start-up time
        deleted = await delete_via_api(args)
    json_line(deleted.to_json_obj()) if args.json else print(deleted_line(deleted))
    return EXIT_OK


async def cmd_revoke(args: argparse.Namespace) -> int:
    """Revoke a grant of a session; prints it as it is now."""
    from .decisions import print_grant

    async def change(engine: Engine) -> api.Grant:
        session = await engine.store.get_session(args.session)
        return grant_answer(session.session_id, await engine.grants.revoke(session, args.grant, "cli"))

    grant = await _embedded(args, change)
    if grant is None:
        from .remote import client_for  # imported only when used: the HTTP client costs start-up time
        async with client_for(args) as client:
            grant = await client.revoke_grant(args.session, args.grant)
    print_grant(grant, args.json)
    return EXIT_OK


async def cmd_fork(args: argparse.Namespace) -> int:
    """Fork a session at an event; prints the new session's line (its id first), and how to go on with it."""
    check_title("--title", args.title)

    async def change(engine: Engine) -> api.Session:
        return session_answer(await engine.fork_session(args.session, at_seq=args.at, title=args.title,
                                                  new_workspace=args.new_workspace, by="cli"))

    fork = await _embedded(args, change)
    if fork is None:
        from .remote import fork_via_api  # imported only when used: the HTTP client costs start-up time
        fork = await fork_via_api(args)
    if args.json:
        json_line(fork.to_json_obj())
        return EXIT_OK
    print(session_line(fork))
    sys.stdout.flush()
    at = f" at seq {fork.forked_from.seq}" if fork.forked_from is not None else ""
    workspace = "an empty workspace of its own" if args.new_workspace else "the same workspace"
    print(f"codesdk: forked {args.session}{at} into {fork.session_id} ({workspace}: {fork.workspace}); go on with: "
          f"{read_again(args, 'run --session', fork.session_id)} \"PROMPT\"", file=sys.stderr)
    return EXIT_OK


async def cmd_events(args: argparse.Namespace) -> int:
    if args.url:
        from .remote import events_via_api  # imported only when used: the HTTP client costs start-up time
        return await events_via_api(args)
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
        from .remote import show_via_api  # imported only when used: the HTTP client costs start-up time
        return await show_via_api(args)
    async with _store(args) as store:
        session = await store.get_session(args.session)
        messages = await derive_transcript(store, args.session)
        if not args.json:
            print(f"session {session.session_id} ({session.runtime}, namespace {session.namespace})")
        print_transcript(messages, sys.stdout, as_json=args.json)
    return EXIT_OK


async def cmd_auth(args: argparse.Namespace) -> int:
    """Login state of a runtime in a namespace, asked of that namespace's own worker (through the running
    service when it holds the data dir); with ``login``, the runtime's own login in that namespace."""
    if not args.url:
        options = SupervisorOptions(data_dir=args.data_dir, holder="codesdk auth",
                                    worker_policy=WorkerPolicy(idle_timeout_s=1.0))
        try:
            async with open_engine(options) as engine:
                await engine.check_offer(args.namespace, args.runtime, available=False)
                result = await engine.ensure_login(args.namespace, args.runtime)
        except DataDirBusy as busy:
            _service_instead(args, busy)
    if args.url:
        from .remote import auth_status_via_api  # imported only when used: the HTTP client costs start-up time
        result = await auth_status_via_api(args)
    if args.action == "login":
        return await _login(args, result)
    if args.json:
        json_line(result.to_json_obj())
    else:
        status = result.status
        hint = f" ({status.method}{', ' + status.account_hint if status.account_hint else ''})" if status.method else ""
        print(f"{args.runtime} in {args.namespace}: {status.state}{hint}")
        if result.instructions:
            print(f"  what to do: {result.instructions}")
        elif status.message:
            print(f"  {status.message}")
    return EXIT_OK if result.logged_in else EXIT_FAILED


async def cmd_runtime_env(args: argparse.Namespace) -> int:
    """What a namespace's worker runs with, asked of that worker (through the running service when it holds the
    data dir, or with --url)."""
    if not args.url:
        options = SupervisorOptions(data_dir=args.data_dir, holder="codesdk runtime-env",
                                    worker_policy=WorkerPolicy(idle_timeout_s=1.0))
        try:
            async with open_engine(options) as engine:
                view = runtime_env_answer(args.namespace, await engine.runtime_env(args.namespace, args.session))
        except DataDirBusy as busy:
            _service_instead(args, busy)
    if args.url:
        from .remote import runtime_env_via_api  # imported only when used: the HTTP client costs start-up time
        view = await runtime_env_via_api(args)
    if args.json:
        json_line(view.to_json_obj())
    else:
        print_runtime_env(view, sys.stdout)
    return EXIT_OK


async def _login(args: argparse.Namespace, result: EnsureLoginResult) -> int:
    if not result.login_command:
        print(f"{args.runtime} has no login of its own: {result.status.message or 'nothing to do'}")
        return EXIT_OK if result.logged_in else EXIT_FAILED
    if result.logged_in:
        print(f"{args.runtime} in {args.namespace} is logged in already ({result.status.method}); logging in again",
              file=sys.stderr)
    print(f"codesdk: running `{' '.join(result.login_command)}` for namespace {args.namespace} (its own HOME); "
          "CodeSDK opens no browser — open the URL it prints yourself and follow what it says (enter the code it "
          "shows there, or paste the one the page gives you here)", file=sys.stderr)
    code = await run_login(Path(args.data_dir), args.namespace, result.login_command)
    if code == 0:
        print(f"codesdk: done; check with: codesdk auth --runtime {args.runtime} --namespace {args.namespace}",
              file=sys.stderr)
        return EXIT_OK
    print(f"codesdk: the login exited with code {code}; nothing was changed by CodeSDK", file=sys.stderr)
    return EXIT_FAILED


async def cmd_bundle(args: argparse.Namespace) -> int:
    """A session's support bundle (``supervisor.bundle``), written by an embedded supervisor on the data dir or by
    the running service (``--url``, or the one holding the data dir); or ``--inspect`` one."""
    from .. import bundle  # imported only when used

    if args.inspect is not None:
        if args.session or args.output:
            raise CliError("--inspect FILE reads a bundle; it takes no SESSION or -o")
        manifest = await trio.to_thread.run_sync(bundle.inspect_bundle, args.inspect)
        if args.json:
            json_line(manifest)
        else:
            print("\n".join(bundle.summary_lines(manifest)))
        return EXIT_OK
    if not args.session:
        raise CliError("give the SESSION to bundle (or --inspect FILE)")
    if args.output is None and ("/" in args.session or args.session.startswith(".")):
        raise CliError(f"{args.session!r} is no session id to name a file after; give the output with -o FILE")
    out = Path(args.output or f"codesdk-bundle-{args.session}.tar.gz").absolute()
    bundle.check_output(out, args.force)  # before any work: a refusal costs nothing
    if not args.url:
        if not Path(args.data_dir).exists():
            raise CliError(f"no data in {args.data_dir} yet (run a task first, or pass --data-dir)")
        options = SupervisorOptions(data_dir=args.data_dir, holder="codesdk bundle")
        try:
            async with open_engine(options) as engine:
                sources = await bundle.sources_from_engine(engine, args.session, extra_patterns=args.redact or ())
                manifest = await bundle.write_bundle(sources, out, force=args.force)
        except DataDirBusy as busy:
            _service_instead(args, busy)
        else:
            _bundle_written(out, manifest)
            return EXIT_OK
    from .remote import bundle_via_api  # imported only when used: the HTTP client costs start-up time
    return await bundle_via_api(args, out)


def _bundle_written(out: Path, manifest: dict[str, Any]) -> None:
    redacted = sum(sum(kinds.values()) for kinds in manifest["redactions"]["by_file"].values())
    print(f"codesdk: wrote {out} ({manifest['counts']['events']} events, {manifest['counts']['blobs_included']} "
          f"blobs, {redacted} redactions); check it with: codesdk bundle --inspect {out}", file=sys.stderr)


async def cmd_blob(args: argparse.Namespace) -> int:
    """A blob the session's events name, read from the store on the data dir or from the service (``--url``): to
    ``-o FILE`` (written whole or not at all) or to stdout."""
    from ..bundle import atomic_output, check_output  # imported only when used

    ref = args.ref if args.ref.startswith(HASH_PREFIX) else HASH_PREFIX + args.ref
    if not is_hash(ref):
        raise CliError(f"{args.ref!r} is no blob ref: a blob is named sha256:<64 hex digits> (an event's *_ref)")
    out = Path(args.output).absolute() if args.output else None
    if out is not None:
        check_output(out, args.force)

    async def save(into: IO[bytes]) -> int:
        if args.url:
            from .remote import blob_via_api  # imported only when used: the HTTP client costs start-up time
            return await blob_via_api(args, ref, into)
        async with _store(args) as store:
            if not await store.names_blob(args.session, ref):
                raise CliError(f"session {args.session} names no blob {ref} (its events' *_ref fields say which)")
            data = await store.get_blob(ref)
        into.write(data)
        return len(data)

    if out is None:
        await save(sys.stdout.buffer)
        sys.stdout.buffer.flush()
        return EXIT_OK
    with atomic_output(out) as handle:
        size = await save(handle)
    print(f"codesdk: wrote {out} ({size} bytes)", file=sys.stderr)
    return EXIT_OK


async def cmd_namespaces(args: argparse.Namespace) -> int:
    if args.url:  # the namespaces the token sees, from the service (without the directories: those are its own)
        from .remote import namespaces_via_api  # imported only when used: the HTTP client costs start-up time
        return await namespaces_via_api(args)
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


def _store(args: argparse.Namespace) -> AbstractAsyncContextManager[StoreReader]:
    """The store, read-only: reading needs no lock, so it works beside a running supervisor."""
    if not Path(args.data_dir).exists():
        raise CliError(f"no data in {args.data_dir} yet (run a task first, or pass --data-dir)")
    return EventStore.open(args.data_dir, read_only=True)


# -- entry point ----------------------------------------------------------------------------------


#: Errors a user can cause: printed as one line, no traceback (``refusal_exit_code`` says which exit code).
_USER_ERRORS: tuple[type[BaseException], ...] = (CliError, EngineError, StoreError, InvalidNamespace, UnsafeDataDir)


def _user_errors() -> tuple[type[BaseException], ...]:
    client = sys.modules.get("codesdk.client")  # its ApiError can only be raised once it was imported
    bundle = sys.modules.get("codesdk.supervisor.bundle")  # likewise its BundleError
    found = (*_USER_ERRORS, client.ApiError) if client is not None else _USER_ERRORS
    return (*found, bundle.BundleError) if bundle is not None else found


def _innermost(exc: BaseException) -> BaseException:
    """``exc`` out of trio's exception groups of one."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _user_error(exc: BaseException) -> BaseException | None:
    """The user error inside ``exc`` (unwrapping trio's exception groups), if that's what it is."""
    exc = _innermost(exc)
    if isinstance(exc, BaseExceptionGroup):  # a refusal beside what it caused (tasks torn down): the refusal is news
        refusals, rest = exc.split(_user_errors())
        found: BaseException | None = refusals
        while isinstance(found, BaseExceptionGroup):
            found = found.exceptions[0]
        if found is not None and rest is not None:  # not shown as the error, never lost: -vv prints it whole
            logging.getLogger("codesdk.cli").debug("beside the refusal %r:", str(found), exc_info=rest)
        return found
    return exc if isinstance(exc, _user_errors()) else None


def refusal_exit_code(error: BaseException) -> int:
    """The exit code of a user error, by whose move it is: the command's (EXIT_USAGE) or the service's
    (EXIT_UNAVAILABLE: try again later, or the operator acts). A refusal maps as the API answers it
    (``error_status``), so the embedded and the remote CLI exit alike."""
    client = sys.modules.get("codesdk.client")
    if client is not None and isinstance(error, client.ApiError):
        return api_exit_code(error.status, error.code)
    answer = error_status(error)
    return api_exit_code(answer.status, answer.code) if answer is not None else EXIT_USAGE


def run_command(args: argparse.Namespace, ahead: RunAhead | None = None) -> int:
    """Run a parsed command; ``ahead``: what ``run`` prepared before this module was imported."""
    from .decisions import cmd_approvals, cmd_decide, cmd_grants
    from .webhooks import cmd_webhooks
    from .acp.command import cmd_acp

    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)]
    logging.basicConfig(stream=sys.stderr, level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    commands: dict[str, Callable[[argparse.Namespace], Awaitable[int]]] = {
        "run": partial(cmd_run, ahead=ahead), "sessions": cmd_sessions, "events": cmd_events,
                "show": cmd_show, "auth": cmd_auth, "runtime-env": cmd_runtime_env, "namespaces": cmd_namespaces, "bundle": cmd_bundle,
                "blob": cmd_blob, "archive": cmd_archive, "unarchive": cmd_archive, "delete": cmd_delete,
                "fork": cmd_fork, "budget": cmd_budget, "approvals": cmd_approvals, "decide": cmd_decide, "grants": cmd_grants,
                "revoke": cmd_revoke, "webhooks": cmd_webhooks, "acp": cmd_acp}
    try:
        return int(trio.run(commands[args.command], args))
    except BrokenPipeError:
        return EXIT_OK
    except (Exception, BaseExceptionGroup) as exc:
        if isinstance(_innermost(exc), BrokenPipeError):  # whoever read our output went away (`| head`)
            return EXIT_OK
        user_error = _user_error(exc)
        if user_error is None:
            raise
        print(f"codesdk: {user_error}", file=sys.stderr)
        return refusal_exit_code(user_error)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
