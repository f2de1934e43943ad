"""``codesdk approvals``, ``decide``, ``grants`` and ``revoke``: deciding what waits for a person, and the grants
scoped decisions made (docs/sessions.md, "Scoped grants").

Deciding needs the supervisor that runs the waiting task, so ``approvals`` and ``decide`` go through its API
(``--url``, or the service holding the data dir). ``grants`` reads the store beside a running supervisor;
``revoke`` (in ``local``, beside the other changes to a session) is done by a supervisor embedded on the data dir,
or through the API.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from codesdk.protocol import CommandPattern, HostPattern, PathPattern, api

from ..engine import read_grants
from ..store import EventStore
from ..api.views import grant_answer
from .common import EXIT_OK, CliError, api_exit_code
from .render import json_line

def _pattern(args: argparse.Namespace) -> dict[str, Any] | None:
    if args.path is not None:
        return {"kind": "path", "prefix": args.path}
    if args.command_prefix is not None:
        return {"kind": "command", "argv": args.command_prefix.split()}
    if args.host is not None:
        return {"kind": "host", "host": args.host}
    return None


def decision_of(args: argparse.Namespace, approval_id: str) -> api.ApprovalDecision:
    """The decision the flags say, checked as the API checks it (a ``CliError`` naming the flag)."""
    body: dict[str, Any] = {"approval_id": approval_id, "allow": args.verdict == "allow", "reason": args.reason or "",
                            "scope": args.scope}
    if (pattern := _pattern(args)) is not None:
        body["pattern"] = pattern
    if args.input is not None:
        try:
            body["input"] = json.loads(args.input)
        except ValueError as exc:
            raise CliError(f"--input is not JSON: {exc}") from None
    try:
        return api.ApprovalDecision.model_validate(body)
    except ValidationError as exc:  # said in the flags' words, on one line
        raise CliError(f"the decision is not valid: {_in_flags_words(exc)}") from None


#: The decision's fields, by the flags that give them.
_FLAGS = {"pattern": "--path/--command/--host", "input": "--input", "scope": "--scope", "reason": "--reason"}


def _in_flags_words(exc: ValidationError) -> str:
    said = []
    for error in exc.errors():
        field, *inner = [str(part) for part in error["loc"]] or ["decision"]
        where = _FLAGS.get(field, field) + (f" ({'.'.join(inner)})" if inner else "")
        why = error["msg"].removeprefix("Value error, ").replace("scope 'rule'", "--scope rule")
        said.append(f"{where}: {why.replace('a pattern', 'one of --path, --command, --host')}")
    return "; ".join(said)


def pattern_text(pattern: PathPattern | CommandPattern | HostPattern | None) -> str:
    if isinstance(pattern, PathPattern):
        return f" path:{pattern.prefix}"
    if isinstance(pattern, CommandPattern):
        return f" command:{' '.join(pattern.argv)}"
    if isinstance(pattern, HostPattern):
        return f" host:{pattern.host}"
    return ""


def grant_line(grant: api.Grant) -> str:
    task = f" task={grant.task_id}" if grant.task_id else ""
    revoked = f" revoked_by={grant.revoked_by}" if grant.revoked_by else ""
    return (f"{grant.grant_id}  {grant.state.value:<7} {grant.decision.value:<5} {grant.scope.value:<7} "
            f"{grant.tool_name}{pattern_text(grant.pattern)}{task}  by={grant.created_by or '-'}{revoked}")


def print_grant(grant: api.Grant, as_json: bool) -> None:
    json_line(grant.to_json_obj()) if as_json else print(grant_line(grant))


def _needs_service(args: argparse.Namespace) -> None:
    if not args.url:
        raise CliError("approvals are decided in the supervisor that runs their task: pass --url (or set "
                       "CODESDK_URL) to reach it. `codesdk run` asks on its own terminal instead")


def routing_note(routing: api.Routing | None, expires_at: datetime, now: datetime | None = None) -> str:
    """Who could answer a pending request, in a few words (nothing for a settled one); ``now``: when it is shown."""
    if routing is None:
        return ""
    if routing.answerable:
        who = [f"{routing.streams} client(s) following" if routing.streams else "",
               f"{routing.consoles} console(s) open" if routing.consoles else "",
               "a webhook" if routing.webhook else ""]
        note = f"  [answerable: {' and '.join(w for w in who if w) or 'its task asks its own approver'}"
    else:
        note = "  [nobody can answer: attach a client (an event stream of the namespace, or the console) or " \
               "register a webhook"
    if routing.fallback is not None:
        note += f"; fallback {routing.fallback.value}, expires {_clock(expires_at)}"
    if routing.escalates_at is not None:  # a pending request is escalated when the time comes, then stays so
        done = routing.escalates_at <= (now or datetime.now(UTC))
        note += f"; {'escalated' if done else 'escalates'} {_clock(routing.escalates_at)}"
    return note + "]"


def _clock(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%H:%M:%SZ")


async def cmd_approvals(args: argparse.Namespace) -> int:
    from .remote import client_for  # imported only when used: the HTTP client costs start-up time
    _needs_service(args)
    async with client_for(args) as client:
        rows = await client.approvals(args.state)
    for row in rows:
        if args.json:
            json_line(row.to_json_obj())
        else:
            shown = json.dumps(row.input, ensure_ascii=False)[:120]
            print(f"{row.approval_id}  {row.state.value:<8} {row.tool_name} ({row.tool_class})  session="
                  f"{row.session_id}  {shown}{routing_note(row.routing, row.expires_at)}")
    if not rows and not args.json:
        print(f"no {args.state} approvals", file=sys.stderr)
    return EXIT_OK


async def cmd_decide(args: argparse.Namespace) -> int:
    from .remote import client_for  # imported only when used: the HTTP client costs start-up time
    _needs_service(args)
    decisions = [decision_of(args, approval_id) for approval_id in args.approval]
    async with client_for(args) as client:
        results = await client.decide_many(decisions)
    code = EXIT_OK
    for result in results:
        if args.json:
            json_line(result.to_json_obj())
        elif result.approval is not None:
            print(f"{result.approval_id}  {result.approval.state.value}")
        else:
            error = result.error or {}
            print(f"{result.approval_id}  not decided ({result.status} {error.get('code', '')}): "
                  f"{error.get('message', '')}", file=sys.stderr)
        if result.status != 200 and code == EXIT_OK:
            code = api_exit_code(result.status, str((result.error or {}).get("code", "")))
    return code


async def cmd_grants(args: argparse.Namespace) -> int:
    if args.url:
        from .remote import client_for  # imported only when used: the HTTP client costs start-up time
        async with client_for(args) as client:
            grants = await client.grants(args.session)
    else:
        if not Path(args.data_dir).exists():
            raise CliError(f"no data in {args.data_dir} yet (run a task first, or pass --data-dir)")
        async with EventStore.open(args.data_dir, read_only=True) as store:
            session = await store.get_session(args.session)
            grants = [grant_answer(session.session_id, entry) for entry in await read_grants(store, session)]
    for grant in grants:
        print_grant(grant, args.json)
    if not grants and not args.json:
        print(f"session {args.session} has no grants (a decision with a scope other than once makes one)",
              file=sys.stderr)
    return EXIT_OK
