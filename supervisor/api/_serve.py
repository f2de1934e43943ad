"""Serving the API under trio with hypercorn's trio worker, on a unix socket (0600) and/or 127.0.0.1:PORT."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from pathlib import Path

import trio
from hypercorn.config import Config
from hypercorn.trio import serve

from ..engine import Engine
from ._app import KEEPALIVE_S, create_app
from ._auth import TokenAuth

log = logging.getLogger(__name__)


def _unix_listener(path: Path) -> socket.socket:
    """Bind the unix socket ourselves so it is mode 0600 before anyone can connect (no umask games)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with contextlib.suppress(FileNotFoundError):
        if path.is_socket():
            path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))
        os.chmod(path, 0o600)
    except BaseException:
        sock.close()
        raise
    return sock


async def serve_api(engine: Engine, auth: TokenAuth, unix_socket: Path | None = None, tcp_port: int | None = None,
                    *, keepalive_s: float = KEEPALIVE_S,
                    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve until cancelled; ``task_status.started`` gets the bound addresses (``unix:…``, ``127.0.0.1:…``)."""
    if unix_socket is None and tcp_port is None:
        raise ValueError("serve_api needs a unix socket path and/or a TCP port")
    config = Config()
    config.accesslog = None
    config.errorlog = log
    config.keep_alive_timeout = 30
    config.graceful_timeout = 2.0
    binds: list[str] = []
    if unix_socket is not None:
        sock = _unix_listener(Path(unix_socket))
        binds.append(f"fd://{sock.detach()}")  # hypercorn owns (and closes) the descriptor from here
    if tcp_port is not None:
        binds.append(f"127.0.0.1:{tcp_port}")
    config.bind = binds
    app = create_app(engine, auth, keepalive_s=keepalive_s)
    try:
        await serve(app, config, task_status=task_status)  # type: ignore[arg-type]
    finally:
        if unix_socket is not None:
            with contextlib.suppress(FileNotFoundError):
                Path(unix_socket).unlink()
