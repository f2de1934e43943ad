"""One worker serving its supervisor on stdio: what ``codesdk-worker`` runs, and what each worker the template forks
runs (``template``).

Order matters: stdout is claimed before anything can print, a runtime asked for ahead (``_ahead``) starts before trio
and the protocol's models are imported, and the interpreter's teardown is skipped once everything is written.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from pathlib import Path

from ._ahead import hint_from_env, start_ahead
from ._lifeline import PARENT_DEATH_SIGNAL
from ._recording import record_dir_from_env


def claim_stdout() -> int:
    """Keep a private copy of fd 1 for the protocol and point fd 1 (and sys.stdout) at stderr.

    After this, a stray ``print`` or a library writing to fd 1 lands in the log, never on the wire.
    """
    protocol_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return protocol_fd


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from codesdk._version import __version__

    parser = argparse.ArgumentParser(
        prog="codesdk-worker",
        description="CodeSDK worker: line-delimited JSON-RPC 2.0 on stdin/stdout, logs on stderr. Also "
                    "`codesdk-worker mcp-bridge` (the MCP server an agent starts) and `codesdk-worker conformance "
                    "-- COMMAND` (the protocol's conformance suite against any worker command).",
    )
    parser.add_argument("--version", action="version", version=f"codesdk {__version__}")
    # No default here: the protocol's (8 MiB) is applied by the server. Importing it now would import the protocol's
    # models before a runtime started ahead (~0.35 s).
    parser.add_argument("--max-frame-bytes", type=int, default=os.environ.get("CODESDK_MAX_FRAME_BYTES"),
                        help="largest accepted line (default 8 MiB)")
    parser.add_argument("--scenario-dir", type=Path, default=os.environ.get("CODESDK_SCENARIO_DIR"),
                        help="where the scripted runtime finds scenario files (default: those shipped with it)")
    parser.add_argument("--log-level", default=os.environ.get("CODESDK_LOG_LEVEL", "INFO"))
    parser.add_argument("--template", action="store_true",
                        help="serve as the pool's worker template: fork workers on request (stdin is a unix socket "
                             "from the supervisor; see codesdk/worker/template.py)")
    args = parser.parse_args(argv)
    if args.max_frame_bytes is not None and args.max_frame_bytes < 1024:
        parser.error("--max-frame-bytes must be at least 1024")
    return args


def run(argv: list[str] | None = None) -> int:
    """Serve the supervisor on stdin/stdout until it ends the conversation; never returns normally: the process
    exits here (``os._exit``) once everything is written and closed."""
    parent = os.getppid()  # the supervisor; see _lifeline
    signal.signal(PARENT_DEATH_SIGNAL, signal.SIG_IGN)  # before anything else: its default would end us, no cleanup
    protocol_fd = claim_stdout()
    args = parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=args.log_level.upper(),
                        format=f"%(asctime)s worker[{os.getpid()}] %(levelname)s %(name)s: %(message)s")
    hint = hint_from_env()  # out of our environment before anything copies it
    record_dir = record_dir_from_env()  # likewise: no runtime inherits it
    # The runtime a task is expected to need starts first, before trio: it takes longer to start than we do.
    started = start_ahead(*hint) if hint is not None else None

    import trio  # imported after stdout is claimed: nothing it or its deps print can reach the wire

    async def serve() -> None:
        from codesdk.protocol import DEFAULT_MAX_FRAME_BYTES

        from ._lifeline import watch_parent
        from .server import WorkerServer
        from .adapters.runtime_process import RuntimeAhead
        from .adapters.registry import default_registry

        ahead = RuntimeAhead.adopt(started) if started is not None else None

        stdin = trio.lowlevel.FdStream(os.dup(0))
        stdout = trio.lowlevel.FdStream(protocol_fd)
        max_frame_bytes = DEFAULT_MAX_FRAME_BYTES if args.max_frame_bytes is None else args.max_frame_bytes
        server = WorkerServer(default_registry(args.scenario_dir, ahead), stdout, max_frame_bytes, record_dir)
        try:
            async with stdin, stdout, trio.open_nursery() as nursery:
                nursery.start_soon(watch_parent, parent, server.stop_serving)
                if ahead is not None:
                    nursery.start_soon(ahead.expire)
                await server.serve(stdin)
                nursery.cancel_scope.cancel()
        finally:
            if ahead is not None:
                await ahead.discard()

    try:
        trio.run(serve)
    finally:
        from ._lifeline import end_descendants

        end_descendants()  # a runtime its adapter could not stop does not outlive the worker
    # Everything is written and closed: skip the interpreter's teardown of every module (~0.1 s that the
    # supervisor would wait for at each worker's exit).
    logging.shutdown()
    sys.stderr.flush()
    os._exit(0)
