"""The supervisor's packages keep to their places: what an embedded supervisor imports stays free of the HTTP stack,
only the command lines use the API client, nothing imports the ``codesdk`` command's front back, and each package
is used through its face."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import codesdk

from tests.worker.harness import REPO

#: The HTTP stack: the server (Starlette on hypercorn) and the client (httpx2).
HTTP_STACK = ("starlette", "hypercorn", "httpx2")


@pytest.mark.parametrize("module", ["codesdk.supervisor.service.assembly", "codesdk.supervisor.cli.local"])
def test_an_embedded_supervisor_imports_no_http_stack(module: str) -> None:
    """``codesdk run`` (cli.local on the assembly) serves no API and calls none: the ~0.1 s of the HTTP stack's
    imports would be spent on every command for nothing."""
    probe = (f"import sys, json, {module}; print(json.dumps(sorted(m for m in sys.modules "
             f"if m.split('.')[0] in {set(HTTP_STACK)!r})))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, cwd=REPO,
                          check=True)
    assert json.loads(done.stdout) == []


# -- what imports what ----------------------------------------------------------------------------

SUPERVISOR = REPO / "supervisor"


def _module_name(path: Path) -> str:
    parts = ["codesdk", "supervisor", *path.relative_to(SUPERVISOR).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path) -> Iterator[str]:
    """Every module a source file imports, anywhere in it (also inside functions and under TYPE_CHECKING), with
    relative imports resolved; ``from package import name`` yields ``package.name`` too (it may be a module)."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def supervisor_sources() -> list[Path]:
    return sorted(p for p in SUPERVISOR.rglob("*.py") if "__pycache__" not in p.parts)


#: The client's names, as the ``codesdk`` package re-exports them on first use.
CLIENT_NAMES = {f"codesdk.{name}" for name in codesdk.__all__ if name != "__version__"}


def test_only_the_command_lines_use_the_api_client() -> None:
    """The supervisor serves the API; only its command lines (``cli/``: ``codesdk --url``, the admin commands)
    call it as a client. Anything else would run the dependency the wrong way round."""
    users = sorted(f"{path.relative_to(REPO)} imports {name}" for path in supervisor_sources()
                   if path.relative_to(SUPERVISOR).parts[0] != "cli"
                   for name in imported_modules(path)
                   if name == "codesdk.client" or name.startswith("codesdk.client.") or name in CLIENT_NAMES)
    assert users == []


def test_nothing_imports_the_command_front_back() -> None:
    """``front`` parses and starts ``run``'s worker, then imports ``local``: were ``local`` (or anything it imports)
    to import ``front`` again, the two would be one circle, and ``front``'s lightness would rest on import order."""
    front = "codesdk.supervisor.cli.front"
    users = sorted(str(path.relative_to(REPO)) for path in supervisor_sources()
                   if path.name != "front.py" and any(name == front or name.startswith(f"{front}.")
                                                      for name in imported_modules(path)))
    assert users == []


def _private_module(name: str) -> str | None:
    """The private module (``codesdk.supervisor.store._store``) that an imported name is in or under, if any."""
    parts = name.split(".")
    for index, part in enumerate(parts):
        if part.startswith("_") and not part.startswith("__"):
            return ".".join(parts[:index + 1])
    return None


def test_each_package_of_the_supervisor_is_used_through_its_face() -> None:
    """A package's private modules (``engine._transcript``, ``store._store``, ``namespaces._variables``, …) are its
    own to move and split: every other package imports what the face exports. (The test suite may reach inside to
    test a module on its own; production code may not.)"""
    reaching_in = []
    for path in supervisor_sources():
        parts = path.relative_to(SUPERVISOR).parts
        own = f"codesdk.supervisor.{parts[0]}." if len(parts) > 1 else None
        for name in imported_modules(path):
            private = _private_module(name)
            if (private is not None and private.startswith("codesdk.supervisor.")
                    and (own is None or not private.startswith(own))):
                reaching_in.append(f"{path.relative_to(REPO)} imports {private}")
    assert sorted(set(reaching_in)) == []
