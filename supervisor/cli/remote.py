"""The ``codesdk`` commands against a running supervisor (``--url``), through ``codesdk.AsyncClient``.

Lines typed while a remote run streams are sent to its task (``typed``), as with the embedded supervisor.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import IO, Any

import trio

from codesdk.client import ApiError, AsyncClient
from codesdk.protocol import (
    BudgetLimits,
    TERMINAL_EVENT_TYPES,
    EnsureLoginResult,
    EventType,
    GrantScope,
    Message,
    NormalizedEvent,
    QuestionReply,
    QuestionRequested,
    RuntimeCapabilities,
    api,
    config_refusal,
)

from .common import (
    STOP_SIGNALS,
    DEFAULT_NAMESPACE,
    DEFAULT_RUNTIME,
    DECISION_PROMPT,
    CliError,
    LineReader,
    ask_decision_on_terminal,
    budget_limits,
    check_session_flags,
    exit_code,
    read_again,
    read_terminal,
    runtime_note,
)
from .typed import TypedLines, reads_lines, typed_note
from .render import EventPrinter, json_line, print_stored_events, print_transcript, session_line
from .questions import ask_on_terminal as ask_questions


def client_for(args: argparse.Namespace) -> AsyncClient:
    token = args.token or os.environ.get("CODESDK_TOKEN")
    if not token:
        raise CliError("--url needs a token: --token TOKEN or CODESDK_TOKEN")
    url: str = args.url
    if url.startswith("unix:"):
        return AsyncClient(socket=url[len("unix:"):], token=token)
    if url.startswith(("http://", "https://")):
        return AsyncClient(base_url=url, token=token)
    if Path(url).exists():
        return AsyncClient(socket=url, token=token)
    raise CliError(f"--url {url!r}: give unix:/path/to/api.sock, an existing socket path, or http://host:port")


class NamespaceUnnamed(CliError):
    """A token bound to several namespaces, and a new session that names none."""

    def __init__(self, namespaces: list[str]) -> None:
        self.namespaces = namespaces
        super().__init__(f"this token is bound to several namespaces ({', '.join(namespaces)}); name the one to use "
                         "with --namespace NS")


async def namespace_to_use(client: AsyncClient, named: str | None) -> str:
    """Where a command's new sessions go: the namespace it names, else the token's own as the service reckons it
    for a request naming none — a tenant's only namespace, the admin's ``default``. ``NamespaceUnnamed`` for a
    tenant's token bound to several."""
    if named:
        return named
    me = await client.me()
    if me.admin or not me.namespaces:
        return DEFAULT_NAMESPACE
    if len(me.namespaces) > 1:
        raise NamespaceUnnamed(list(me.namespaces))
    return me.namespaces[0]


def _printer() -> EventPrinter:
    return EventPrinter(sys.stdout, color=sys.stdout.isatty() and not os.environ.get("NO_COLOR"))


#: ``codesdk run`` flags that configure the embedded supervisor; a running service has its own configuration.
_LOCAL_ONLY = {"env": "set the namespace's variables with `codesdk-supervisor namespace env set NS KEY=VALUE`",
               "allow_exec": "workspace.exec is configured on the service (`codesdk-supervisor serve --allow-exec`)",
               **{flag: "http.fetch is configured on the service (`codesdk-supervisor serve --allow-fetch`)"
                  for flag in ("allow_fetch", "allow_fetch_address", "allow_fetch_post", "allow_fetch_unattended")},
               **{flag: "a service's questions wait and fall back as its operator set "
                        "(`codesdk-supervisor serve --question-timeout/--question-fallback`)"
                  for flag in ("question_timeout", "question_fallback")}}


async def _check_offer(client: AsyncClient, namespace: str, runtime: str, runtime_config: dict[str, Any]) -> None:
    """What the service's worker for ``namespace`` offers refuses (``Engine.check_offer``'s rules, read through
    ``GET /v1/runtimes``): an unknown runtime or a ``runtime_config`` it does not take is the command's mistake."""
    offers = {offer.name: offer for offer in await client.runtimes(namespace)}
    offer = offers.get(runtime)
    if offer is None:
        raise CliError(f"no runtime {runtime!r} in namespace {namespace!r}; it can run: "
                       f"{', '.join(sorted(offers)) or 'none'}")
    refusal = config_refusal(RuntimeCapabilities.model_validate(offer.capabilities), runtime_config)
    if refusal is not None:
        raise CliError(refusal)


async def run_via_api(args: argparse.Namespace, runtime_config: dict[str, Any]) -> int:
    for flag, instead in _LOCAL_ONLY.items():
        if getattr(args, flag, None):
            raise CliError(f"--{flag.replace('_', '-')} cannot be honoured through the API: {instead}")
    printer = _printer()
    async with client_for(args) as client:
        if args.session:
            session = await client.get_session(args.session)
            check_session_flags(args, session.namespace)
        else:
            check_session_flags(args, args.namespace or DEFAULT_NAMESPACE)
            namespace = await namespace_to_use(client, args.namespace)
            if args.runtime or runtime_config:  # refused before the session is stored, as the embedded CLI does
                await _check_offer(client, namespace, args.runtime or DEFAULT_RUNTIME, runtime_config)
            session = await client.create_session(namespace=namespace, runtime=args.runtime,
                                                  workspace=args.workspace, title=args.title,
                                                  isolation=args.isolation)
        last: Any = None
        received: list[int] = []
        with trio.open_signal_receiver(*STOP_SIGNALS) as signals:
            async with trio.open_nursery() as nursery:
                task_id: list[str] = []

                async def stop_on_signal() -> None:
                    async for signum in signals:
                        received.append(signum)
                        if task_id:
                            with contextlib.suppress(ApiError):  # it may have ended meanwhile
                                await client.stop_task(task_id[0], f"interrupted ({signal.Signals(signum).name})")
                            return

                nursery.start_soon(stop_on_signal)
                interactive = not args.non_interactive and sys.stdin.isatty()

                async def send_line(text: str) -> str:
                    if not task_id:
                        raise CliError("the task has not started yet: type it again in a moment")
                    return (await client.send_input(task_id[0], text)).delivery.value

                lines = TypedLines(send_line, typed_note(args, printer)) if reads_lines(args) else None
                read: LineReader = lines.read if lines is not None else read_terminal
                async for event in client.run(session.session_id, args.prompt, permission_mode=args.mode,
                                              runtime_config=runtime_config, runtime=args.runtime,
                                              max_input_tokens=args.max_input_tokens,
                                              timeout_s=args.timeout, idle_timeout_s=args.idle_timeout,
                                              approver=_terminal_approver(read) if interactive else None,
                                              answerer=_terminal_answerer(read) if interactive else None,
                                              budget=budget_limits(args)):
                    if event.type == EventType.TASK_STARTED and event.trace.task_id:
                        task_id.append(event.trace.task_id)
                        if lines is not None:
                            nursery.start_soon(lines.run)
                        if not args.json:
                            runtime = runtime_note(args.runtime or session.runtime, session.runtime)
                            printer.note(f"session {session.session_id}  task {event.trace.task_id}  runtime "
                                         f"{runtime}  namespace {session.namespace}  workspace "
                                         f"{session.workspace}")
                    json_line(event.to_json_obj()) if args.json else printer.print(event)
                    last = event
                nursery.cancel_scope.cancel()
    ended = last.type.value if last is not None and last.type in TERMINAL_EVENT_TYPES else None
    if not args.json:
        printer.end_line()
        sid = session.session_id
        printer.note(f"task {(ended or 'not ended').removeprefix('task.')}. Read it again: "
                     f"{read_again(args, 'events', sid)}  |  transcript: {read_again(args, 'show', sid)}")
    return exit_code(ended, received[0] if received else None)


def _terminal_approver(read: LineReader) -> Callable[[NormalizedEvent], Awaitable[api.DecisionRequest]]:
    """Ask about an ``approval.requested`` event, which was printed just before, each answer read by ``read`` (the
    typed lines' reader when it owns stdin): once, for the task or the session (a grant), or no."""
    async def approve(event: NormalizedEvent) -> api.DecisionRequest:
        allow, scope, reason = await ask_decision_on_terminal(DECISION_PROMPT, read)
        return api.DecisionRequest(allow=allow, reason=reason, scope=GrantScope(scope))
    return approve


def _terminal_answerer(read: LineReader) -> Callable[[NormalizedEvent], Awaitable[QuestionReply]]:
    """Ask a ``question.requested`` event's questions, which were printed just before."""
    async def answer(event: NormalizedEvent) -> QuestionReply:
        asked = event.payload
        assert isinstance(asked, QuestionRequested)
        return await ask_questions(asked.message, asked.questions, read)
    return answer


async def auth_status_via_api(args: argparse.Namespace) -> EnsureLoginResult:
    async with client_for(args) as client:
        return EnsureLoginResult.model_validate(await client.auth_status(args.namespace, args.runtime))


async def runtime_env_via_api(args: argparse.Namespace) -> api.RuntimeEnvView:
    async with client_for(args) as client:
        return await client.runtime_env(args.namespace, session_id=args.session)


async def namespaces_via_api(args: argparse.Namespace) -> int:
    """The namespaces the token sees, with their session counts (a service does not show its directories)."""
    async with client_for(args) as client:
        rows = await client.namespaces()
    for row in rows:
        if args.json:
            json_line(row.to_json_obj())
        else:
            print(f"{row.namespace:<24} sessions={row.sessions}")
    if not rows and not args.json:
        print("no namespaces yet", file=sys.stderr)
    return 0


async def sessions_via_api(args: argparse.Namespace) -> int:
    """The sessions the token sees, oldest first, page by page (the service's cursor), up to ``--limit``."""
    left, after = args.limit, None
    async with client_for(args) as client:
        while left > 0:
            page = await client.list_sessions(namespace=args.namespace, after=after, limit=min(left, 1000),
                                              state=args.state, q=args.search)
            for s in page.sessions:
                json_line(s.to_json_obj()) if args.json else print(session_line(s))
            left -= len(page.sessions)
            if not page.has_more:
                break
            after = page.next_after
    return 0


async def archive_via_api(args: argparse.Namespace, archived: bool) -> api.Session:
    """``archive`` (``archived``) or ``unarchive`` the session; the session as it is now."""
    async with client_for(args) as client:
        return await (client.archive if archived else client.unarchive)(args.session)


async def delete_via_api(args: argparse.Namespace) -> api.DeletedSession:
    async with client_for(args) as client:
        return await client.delete_session(args.session)


async def fork_via_api(args: argparse.Namespace) -> api.Session:
    async with client_for(args) as client:
        return await client.fork_session(args.session, at_seq=args.at, title=args.title,
                                         workspace="new" if args.new_workspace else "shared")


async def budget_via_api(args: argparse.Namespace, limits: BudgetLimits | None) -> api.SessionBudgetView:
    async with client_for(args) as client:
        if args.raise_:
            raised = await client.raise_budget(args.session, limits, continue_=args.continue_)
            if raised.task is not None:
                print(f"codesdk: task {raised.task.task_id} goes on with the work; follow it with: "
                      f"{read_again(args, 'events -f', args.session)}", file=sys.stderr)
            return raised
        if limits is not None:
            return await client.set_session_budget(args.session, limits)
        return await client.session_budget(args.session)


async def events_via_api(args: argparse.Namespace) -> int:
    printer = _printer()
    async with client_for(args) as client:
        if args.follow:
            async for event in client.stream(args.session, after_seq=args.after):
                json_line(event.to_json_obj()) if args.json else printer.print(event)
            return 0
        await print_stored_events(lambda after, limit: client.events(args.session, after_seq=after, limit=limit),
                                  args.after, args.json, printer)
    return 0


async def show_via_api(args: argparse.Namespace) -> int:
    async with client_for(args) as client:
        transcript = await client.transcript(args.session)
    print_transcript([Message.model_validate(m) for m in transcript.messages], sys.stdout, as_json=args.json)
    return 0


async def blob_via_api(args: argparse.Namespace, ref: str, into: IO[bytes]) -> int:
    async with client_for(args) as client:
        return await client.download(args.session, ref, into)


async def bundle_via_api(args: argparse.Namespace, out: Path) -> int:
    """The session's support bundle, as the service writes it, saved to ``out`` atomically."""
    from ..bundle import BundleError, atomic_output, check_output, inspect_bundle

    if args.redact:
        raise CliError("--redact cannot be honoured through the API: the service redacts the patterns in its "
                       "<data-dir>/bundle-redact.txt")
    check_output(out, args.force)
    async with client_for(args) as client:
        with atomic_output(out) as handle:
            await client.bundle(args.session, handle)
            handle.flush()
            try:  # what arrived is checked before it is kept: a cut-short download is no bundle
                manifest = await trio.to_thread.run_sync(inspect_bundle, Path(handle.name))
            except BundleError as exc:
                raise BundleError(f"the service's bundle did not arrive intact ({exc})") from None
    redacted = sum(sum(kinds.values()) for kinds in manifest["redactions"]["by_file"].values())
    print(f"codesdk: wrote {out} ({manifest['counts']['events']} events, {redacted} redactions); check it with: "
          f"codesdk bundle --inspect {out}", file=sys.stderr)
    return 0
