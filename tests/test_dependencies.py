"""Proof that the pinned libraries do their job together under trio on this interpreter.

pytest-trio is an older release; the tests exercise it end to end. These checks pin the specific behaviours the
code relies on, so an upgrade that changes them fails here first.
"""

from __future__ import annotations

from importlib.metadata import version

import trio
import trio.lowlevel


def test_pinned_versions_are_the_ones_installed() -> None:
    assert version("trio").startswith("0.35")
    assert version("pytest-trio") == "0.8.0"
    assert version("rfc8785") == "0.1.4"
    assert version("pydantic").startswith("2.")
    assert version("mcp").startswith("2.3")


async def test_pytest_trio_runs_this_under_trio() -> None:
    assert trio.lowlevel.current_task() is not None
    with trio.fail_after(5):
        await trio.lowlevel.checkpoint()


async def test_mcp_in_process_client_and_server_under_trio() -> None:
    from mcp import Client
    from mcp.server.mcpserver import MCPServer
    from mcp.types import TextContent

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
            content = result.content[0]
            assert isinstance(content, TextContent) and content.text == "echo: hi"


def test_the_codex_the_adapter_expects_is_the_one_pinned_and_locked() -> None:
    """``runtimes/package.json`` pins Codex exactly and its lock holds that version with an integrity hash; the
    adapter's ``CODEX_VERSION`` (what it reports when no build is installed) says the same."""
    import json
    from pathlib import Path

    from codesdk.worker.adapters.codex.launch import CODEX_VERSION, codex_version

    runtimes = Path(__file__).resolve().parents[1] / "runtimes"
    pinned = json.loads((runtimes / "package.json").read_text())["dependencies"]["@openai/codex"]
    locked = json.loads((runtimes / "package-lock.json").read_text())["packages"]["node_modules/@openai/codex"]
    assert pinned == locked["version"] == CODEX_VERSION and locked["integrity"].startswith("sha512-")
    assert codex_version() in ("", CODEX_VERSION)  # installed: the same build
