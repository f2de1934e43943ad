"""A fake ``codesdk-worker`` that completes the handshake, then writes whatever it is told to stdout.

Standard library only, so nothing it imports can misbehave on its behalf. It understands:

- ``runtime.initialize``: a valid handshake answer (no runtimes);
- ``hostile.write`` {``data`` (base64), ``bytewise`` (one write(2) per byte), ``then``}: writes the bytes
  verbatim to fd 1, then ``"reply"`` (answer ``{"written": n}``), ``"exit"`` (exit 0 without a word) or
  ``"sigkill"`` (kill itself mid-conversation, leaving whatever was written — a torn frame, say);
- ``runtime.shutdown``: ack, then exit 0. Anything else gets -32601.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import sys
from typing import Any


def _send(obj: dict[str, Any]) -> None:
    os.write(1, json.dumps(obj, separators=(",", ":")).encode() + b"\n")


def _write(data: bytes, bytewise: bool) -> None:
    if bytewise:
        for index in range(len(data)):
            os.write(1, data[index:index + 1])
        return
    view = memoryview(data)
    while view:
        view = view[os.write(1, view):]


def main() -> int:
    for raw in sys.stdin.buffer:
        request = json.loads(raw)
        request_id, method, params = request.get("id"), request.get("method"), request.get("params") or {}
        if method == "runtime.initialize":
            _send({"jsonrpc": "2.0", "id": request_id, "result": {
                "protocol_version": "1.0", "worker": {"name": "hostile-worker", "version": "0"},
                "pid": os.getpid(), "runtimes": []}})
        elif method == "hostile.write":
            data = base64.b64decode(params["data"])
            _write(data, bool(params.get("bytewise")))
            then = params.get("then", "reply")
            if then == "exit":
                return 0
            if then == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
            _send({"jsonrpc": "2.0", "id": request_id, "result": {"written": len(data)}})
        elif method == "runtime.shutdown":
            _send({"jsonrpc": "2.0", "id": request_id, "result": {"ok": True}})
            return 0
        else:
            _send({"jsonrpc": "2.0", "id": request_id, "error": {"code": -32601, "message": "Method not found"}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
