"""Run a program on stdio and record both directions of its line-delimited JSON-RPC: ``tee.py LOG -- PROGRAM…``.

Each line is passed on unchanged and appended to LOG as ``{"dir": "in"|"out", "line": …}``: the tests check every
line the ACP agent wrote against the protocol's schema, knowing which request each answer answers."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from typing import IO


def main() -> int:
    log_path, program = sys.argv[1], sys.argv[3:]
    child = subprocess.Popen(program, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert child.stdin is not None and child.stdout is not None
    lock = threading.Lock()
    log = open(log_path, "a", encoding="utf-8")

    def record(direction: str, line: bytes) -> None:
        with lock:
            log.write(json.dumps({"dir": direction, "line": line.decode("utf-8", "replace")}) + "\n")
            log.flush()

    def copy(source: IO[bytes], sink: IO[bytes], direction: str) -> None:
        for line in iter(source.readline, b""):
            record(direction, line)
            sink.write(line)
            sink.flush()
        sink.close()

    into = threading.Thread(target=copy, args=(sys.stdin.buffer, child.stdin, "in"), daemon=True)
    into.start()
    copy(child.stdout, sys.stdout.buffer, "out")
    return child.wait()


if __name__ == "__main__":
    sys.exit(main())
