"""``python -m supervisor.api --data-dir D [--socket PATH] [--port N]``: serve the API until Ctrl-C.

A stop-gap runner until ``codesdk-supervisor serve`` (supervisor/service.py) wires ``serve_api`` in with
sd_notify and draining. Creates ``D/api-tokens.json`` and ``D/admin.token`` (0600) on first start.
"""

from __future__ import annotations

import argparse
import logging
from functools import partial
from pathlib import Path

import trio

from ..app import SupervisorOptions, open_engine
from ..config import default_data_dir
from ._auth import ADMIN_TOKEN_FILE, TokenAuth
from ._serve import serve_api


async def _main(data_dir: Path, socket_path: Path | None, port: int | None) -> None:
    async with open_engine(SupervisorOptions(data_dir=data_dir)) as engine, trio.open_nursery() as nursery:
        auth = TokenAuth.bootstrap(data_dir)
        bound = await nursery.start(partial(serve_api, engine, auth, socket_path, port))
        logging.getLogger("supervisor.api").warning("serving on %s (admin token in %s)", ", ".join(bound),
                                                    data_dir / ADMIN_TOKEN_FILE)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m supervisor.api", description=__doc__)
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--socket", type=Path, default=None, help="unix socket path (default: DATA_DIR/api.sock)")
    parser.add_argument("--port", type=int, default=None, help="also listen on 127.0.0.1:PORT")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    data_dir: Path = args.data_dir or default_data_dir()
    socket_path: Path = args.socket or data_dir / "api.sock"
    try:
        trio.run(_main, data_dir, socket_path, args.port)
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
