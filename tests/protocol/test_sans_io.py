"""protocol/ must stay pure: no I/O libraries anywhere in its import graph."""

from __future__ import annotations

import ast
from pathlib import Path

FORBIDDEN = {"trio", "anyio", "asyncio", "subprocess", "socket", "sqlite3", "apsw", "os", "threading", "psutil"}
PROTOCOL = Path(__file__).resolve().parents[2] / "protocol"


def test_protocol_imports_no_io_modules() -> None:
    offenders = []
    for path in sorted(PROTOCOL.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] in FORBIDDEN]
    assert offenders == []
