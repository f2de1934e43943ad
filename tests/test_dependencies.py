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
    assert version("msgspec").startswith("0.22")  # the wire decoder leans on its 0.22 behaviour (tests/protocol)
    assert version("h11").startswith("0.16")  # http.fetch speaks HTTP/1.1 through it (supervisor/tools/_fetch.py)
    assert version("mcp").startswith("2.3")  # the test extra's: the oracle of our MCP server


def test_every_library_the_code_imports_is_declared() -> None:
    """A library the installed code imports but only another dependency brings (starlette came with mcp) breaks the
    day that dependency drops it: each must be named in pyproject.toml's dependencies (or an extra, for the modules
    only that extra's users load)."""
    import ast
    import re
    import sys
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    def names(requirements: list[str]) -> set[str]:
        return {re.split(r"[\[<>=~!; ]", r, maxsplit=1)[0].lower().replace("-", "_") for r in requirements}
    declared = names(project["dependencies"])
    extras = {extra: names(reqs) for extra, reqs in project["optional-dependencies"].items()}
    imported_as = {"pydantic_core": "pydantic", "httpx2": "httpx2", "opentelemetry": "opentelemetry_sdk"}
    # the PostgreSQL store and its encrypted namespace variables; the pytest plugin; traces
    only_in_extra = {"psycopg": "postgresql", "cryptography": "postgresql", "pytest": "test", "opentelemetry": "otel"}
    missing = []
    for folder in ("protocol", "worker", "supervisor", "codesdk"):
        for path in (root / folder).rglob("*.py"):
            if folder == "codesdk" and path.relative_to(root / folder).parts[0] in {"protocol", "worker", "supervisor"}:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    tops = [alias.name.split(".")[0] for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                    tops = [node.module.split(".")[0]]
                else:
                    continue
                for top in tops:
                    if top in sys.stdlib_module_names or top == "codesdk":
                        continue
                    package = imported_as.get(top, top)
                    extra = only_in_extra.get(top)
                    if package not in declared and (extra is None or package not in extras[extra]):
                        missing.append(f"{path.relative_to(root)}: {top}")
    assert not missing, "imported but not declared in pyproject.toml:\n" + "\n".join(sorted(set(missing)))


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
