"""``codesdk-worker``: which program to be. A worker serving its supervisor on stdio (``_stdio``), the worker
template that forks workers (``--template``: ``template``), or the MCP bridge an agent starts (``mcp-bridge``).

(``codesdk-worker conformance`` is the test kit's, dispatched before this module: ``codesdk._programs``.)
"""

from __future__ import annotations

import os
import signal
import sys


def main(argv: list[str] | None = None) -> int:
    command_line = sys.argv[1:] if argv is None else argv
    if command_line[:1] == ["mcp-bridge"]:  # an agent's MCP server: stdio is MCP's, not ours
        from .mcp.bridge.main import main as bridge_main

        return bridge_main(command_line[1:])
    if command_line == ["--version"]:  # before stdout is handed to the protocol (and to stderr)
        from codesdk._version import __version__

        print(f"codesdk {__version__}")
        return 0
    if "--template" not in command_line:
        from ._stdio import run

        return run(command_line)
    # The template: before logging is configured (each forked worker configures its own) and with stdout claimed,
    # as every worker it forks has it.
    import socket

    from ._lifeline import PARENT_DEATH_SIGNAL
    from ._stdio import claim_stdout, parse_args
    from .template import serve

    signal.signal(PARENT_DEATH_SIGNAL, signal.SIG_IGN)
    os.close(claim_stdout())
    parse_args(command_line)  # refuses what a forked worker would refuse, before the first fork
    worker_args = [arg for arg in command_line if arg != "--template"]
    return serve(socket.socket(fileno=os.dup(0)), worker_args)


if __name__ == "__main__":
    sys.exit(main())
