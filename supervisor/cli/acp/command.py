"""``codesdk acp``'s command-line side: stdout kept for the protocol alone, and the service the connection speaks
to — a running one (``--url``/``--token``) or one embedded in this process, like ``codesdk run``'s, serving its API
on a private unix socket to this connection only."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from functools import partial
from pathlib import Path

import trio

from codesdk.client import AsyncClient, Unauthorized

from ..common import CliError, fetch_flags_refusal, fetch_options, run_env
from .server import Defaults, run_connection


def protocol_stdout() -> int:
    """A private copy of stdout for the protocol; fd 1 (and ``sys.stdout``) then go to stderr, so that nothing
    printed by accident (a library's warning, a stray print) can reach the client as a broken line."""
    out = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return out


async def cmd_acp(args: argparse.Namespace) -> int:
    if args.url and (args.allow_exec or args.allow_fetch or args.env):
        raise CliError("--allow-exec, --allow-fetch and --env configure an embedded supervisor; a running service has "
                       "its own (`codesdk-supervisor serve --allow-exec/--allow-fetch`, `codesdk-supervisor namespace "
                       "env set`)")
    if (refusal := fetch_flags_refusal(args)) is not None:
        raise CliError(refusal)
    out = protocol_stdout()
    stdin, stdout = trio.lowlevel.FdStream(os.dup(0)), trio.lowlevel.FdStream(out)
    async with stdin, stdout:
        if args.url:
            from ..remote import client_for

            async with client_for(args) as client:
                namespace, unnamed = await _token_namespace(client, args.namespace)
                defaults = Defaults(namespace=namespace, unnamed=unnamed, runtime=args.runtime,
                                    cwd_workspace=bool(args.cwd_workspace), needs_token=True)
                await run_connection(client, defaults, stdin, stdout)
            return 0
        await _embedded(args, stdin, stdout)
    return 0


async def _token_namespace(client: AsyncClient, named: str | None) -> tuple[str | None, str]:
    """Where new sessions go when ``_meta.codesdk.namespace`` does not say (``namespace_to_use``, as ``codesdk
    run``), or None and why a session must name one. A token the service refuses is told so on the client's first
    request (auth_required), not here."""
    from ..remote import NamespaceUnnamed, namespace_to_use

    try:
        return await namespace_to_use(client, named), ""
    except Unauthorized:
        return "default", ""
    except NamespaceUnnamed as several:
        return None, (f"this token is bound to several namespaces ({', '.join(several.namespaces)}); name one in "
                      "_meta.codesdk.namespace, or start codesdk acp with --namespace NS")


async def _embedded(args: argparse.Namespace, stdin: trio.lowlevel.FdStream, stdout: trio.lowlevel.FdStream) -> None:
    from ...api import TokenAuth
    from ...api.server import serve_api
    from ...service.assembly import SupervisorOptions, open_engine
    from ...store import DataDirBusy

    # This supervisor serves one local user (like `codesdk run`'s): the variables are every namespace's.
    options = SupervisorOptions(data_dir=args.data_dir, exec_allowlist=tuple(args.allow_exec or ()),
                                fetch=fetch_options(args), fetch_unattended=args.allow_fetch_unattended,
                                worker_env={"*": run_env(args.env)}, holder="codesdk acp", test_scenarios=True)
    auth = TokenAuth()  # in memory: one admin token, for this connection's client alone
    token = auth.add_principal("acp", [], admin=True)
    defaults = Defaults(namespace=args.namespace or "default", runtime=args.runtime,
                        cwd_workspace=args.cwd_workspace is not False)
    try:
        async with open_engine(options) as engine:
            with tempfile.TemporaryDirectory(prefix="codesdk-acp-") as private:  # 0700: ours alone
                socket = Path(private) / "api.sock"
                async with trio.open_nursery() as nursery:
                    await nursery.start(partial(serve_api, engine, auth, socket, None))
                    async with AsyncClient(socket=socket, token=token) as client:
                        await run_connection(client, defaults, stdin, stdout)
                    nursery.cancel_scope.cancel()
    except DataDirBusy as busy:
        raise CliError(f"{busy}: run `codesdk acp --url unix:/path/to/api.sock --token TOKEN` to go through the "
                       "running service") from None
