"""Proof that the pinned libraries do their job together under trio on this interpreter.

jsonrpcserver and pytest-trio are older releases; the worker tests exercise them end to end. These checks pin
the specific behaviours the code relies on, so an upgrade that changes them fails here first.
"""

from __future__ import annotations

import json
from importlib.metadata import version

import jsonrpcserver  # noqa: F401  (imported for its DeprecationWarning-free use below)
import trio
import trio.lowlevel
from jsonrpcserver import InvalidParams, Success, dispatch_to_serializable


def test_pinned_versions_are_the_ones_installed() -> None:
    assert version("trio").startswith("0.35")
    assert version("jsonrpcserver") == "5.0.9"
    assert version("pytest-trio") == "0.8.0"
    assert version("rfc8785") == "0.1.4"
    assert version("pydantic").startswith("2.")
    assert version("mcp").startswith("2.3")


def test_jsonrpcserver_sync_dispatch_with_a_methods_dict() -> None:
    methods = {"add": lambda a, b: Success(a + b), "strict": lambda **p: InvalidParams({"why": "no"})}
    ok = dispatch_to_serializable(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "add", "params": [2, 3]}),
                                  methods)
    assert ok == {"jsonrpc": "2.0", "result": 5, "id": 1}
    codes = [dispatch_to_serializable(text, methods)["error"]["code"] for text in (
        "{", '{"jsonrpc":"2.0","id":2}', '{"jsonrpc":"2.0","id":3,"method":"nope"}',
        '{"jsonrpc":"2.0","id":4,"method":"add","params":[1]}', '{"jsonrpc":"2.0","id":5,"method":"strict"}')]
    assert codes == [-32700, -32600, -32601, -32602, -32602]


async def test_pytest_trio_runs_this_under_trio() -> None:
    assert trio.lowlevel.current_task() is not None
    with trio.fail_after(5):
        await trio.lowlevel.checkpoint()


async def test_mcp_in_process_client_and_server_under_trio() -> None:
    from mcp import Client
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("codesdk-check")

    @server.tool()
    def echo(text: str) -> str:
        """Echo the text back."""
        return f"echo: {text}"

    with trio.fail_after(30):
        async with Client(server) as client:
            tools = await client.list_tools()
            assert [t.name for t in tools.tools] == ["echo"]
            result = await client.call_tool("echo", {"text": "hi"})
            assert result.content[0].text == "echo: hi"
