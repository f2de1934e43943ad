"""The ``codesdk`` commands against a running supervisor (``--url``), through ``codesdk.AsyncClient``.

Remote runs are non-interactive from the CLI's side: calls the policy would ask about are denied with a
recorded reason (use the API's approvals for human decisions).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from codesdk import AsyncClient
from protocol import TERMINAL_EVENT_TYPES, EventType, Message

from .render import EventPrinter, json_line, print_stored_events, print_transcript


class RemoteError(Exception):
    """Bad --url/--token use; printed as one line."""


def client_for(args: argparse.Namespace) -> AsyncClient:
    token = args.token or os.environ.get("CODESDK_TOKEN")
    if not token:
        raise RemoteError("--url needs a token: --token TOKEN or CODESDK_TOKEN")
    url: str = args.url
    if url.startswith("unix:"):
        return AsyncClient(socket=url[len("unix:"):], token=token)
    if url.startswith(("http://", "https://")):
        return AsyncClient(base_url=url, token=token)
    if Path(url).exists():
        return AsyncClient(socket=url, token=token)
    raise RemoteError(f"--url {url!r}: give unix:/path/to/api.sock, an existing socket path, or http://host:port")


def _printer() -> EventPrinter:
    return EventPrinter(sys.stdout, color=sys.stdout.isatty() and not os.environ.get("NO_COLOR"))


async def run(args: argparse.Namespace, runtime_config: dict[str, Any]) -> int:
    printer = _printer()
    async with client_for(args) as client:
        if args.session:
            session = await client.get_session(args.session)
        else:
            session = await client.create_session(namespace=args.namespace, runtime=args.runtime)
        last: Any = None
        async for event in client.run(session["session_id"], args.prompt, permission_mode=args.mode,
                                      runtime_config=runtime_config):
            json_line(event.to_json_obj()) if args.json else printer.print(event)
            last = event
        if not args.json:
            printer.end_line()
    if last is None or last.type not in TERMINAL_EVENT_TYPES:
        return 1
    return {EventType.TASK_COMPLETED: 0, EventType.TASK_STOPPED: 3}.get(last.type, 1)


async def sessions(args: argparse.Namespace) -> int:
    async with client_for(args) as client:
        for s in await client.list_sessions():
            if args.json:
                json_line(s)
            else:
                print(f"{s['session_id']}  {s['created_at'][:19]}  {s['runtime']:<9} {s['namespace']:<16} "
                      f"events={s.get('last_seq', 0)}")
    return 0


async def events(args: argparse.Namespace) -> int:
    printer = _printer()
    async with client_for(args) as client:
        if args.follow:
            async for event in client.stream(args.session, after_seq=args.after):
                json_line(event.to_json_obj()) if args.json else printer.print(event)
            return 0
        await print_stored_events(lambda after, limit: client.events(args.session, after_seq=after, limit=limit),
                                  args.after, args.json, printer)
    return 0


async def show(args: argparse.Namespace) -> int:
    async with client_for(args) as client:
        transcript = await client.transcript(args.session)
    print_transcript([Message.model_validate(m) for m in transcript["messages"]], sys.stdout, as_json=args.json)
    return 0
