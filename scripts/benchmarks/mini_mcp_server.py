"""The smallest stdio MCP server the ACP benchmark's direct client gives its agent: one tool, ``workspace_read``,
answered from the file itself. The standard library only, so that it costs what a hand-written tool server costs
(the baseline CodeSDK's MCP bridge is measured against)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

TOOL = {"name": "workspace_read", "description": "Read a file of the workspace",
        "inputSchema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}


def answer(message: dict[str, object]) -> dict[str, object] | None:
    method, params = message.get("method"), message.get("params")
    if "id" not in message:
        return None  # notifications (initialized, cancelled) need no answer
    if method == "initialize":
        version = params.get("protocolVersion", "2025-06-18") if isinstance(params, dict) else "2025-06-18"
        result: object = {"protocolVersion": version, "capabilities": {"tools": {}},
                          "serverInfo": {"name": "bench", "version": "1"}}
    elif method == "tools/list":
        result = {"tools": [TOOL]}
    elif method == "tools/call" and isinstance(params, dict):
        path = str((params.get("arguments") or {}).get("path", ""))
        text = json.dumps({"path": path, "text": (Path.cwd() / path).read_text()})
        result = {"content": [{"type": "text", "text": text}], "isError": False}
    elif method == "ping":
        result = {}
    else:
        return {"jsonrpc": "2.0", "id": message["id"], "error": {"code": -32601, "message": f"no {method}"}}
    return {"jsonrpc": "2.0", "id": message["id"], "result": result}


def main() -> None:
    for line in sys.stdin:
        if line.strip():
            reply = answer(json.loads(line))
            if reply is not None:
                sys.stdout.write(json.dumps(reply) + "\n")
                sys.stdout.flush()


if __name__ == "__main__":
    main()
