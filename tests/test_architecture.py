"""The house's floor plan, held against the code (docs/architecture.md): no import circle anywhere, each package
imports only the floors below it, nothing reaches into another package's private modules, and no module is known
by a name other than ``codesdk.…``.

Every import counts — inside functions and under ``TYPE_CHECKING`` too: a lazy import that closes a circle is still
a circle, and a type-only one still says which way the knowledge runs.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: Where each installed package's source lives in the checkout (codesdk/protocol etc. are symlinks to these).
FOLDERS = {"codesdk.protocol": REPO / "protocol", "codesdk.worker": REPO / "worker",
           "codesdk.supervisor": REPO / "supervisor", "codesdk": REPO / "codesdk"}
LINKED = {"protocol", "worker", "supervisor"}


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the module imported (the longest of ours that the statement names)
    line: int


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package, folder in FOLDERS.items():
        for path in folder.rglob("*.py"):
            relative = path.relative_to(folder)
            if package == "codesdk" and relative.parts[0] in LINKED:
                continue  # the symlinks: the same files, already counted under their own package
            parts = [*package.split("."), *relative.with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _ours(name: str) -> str | None:
    """The longest module of ours that ``name`` is or lies in; None for a name not of ours."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str) -> Iterator[Import]:
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if (target := _ours(alias.name)) is not None:
                    yield Import(module, target, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            for alias in node.names:  # ``from package import module`` imports that module
                target = _ours(f"{name}.{alias.name}") if f"{name}.{alias.name}" in MODULES else _ours(name)
                if target is not None and target != module:
                    yield Import(module, target, node.lineno)


GRAPH = {module: sorted({i.target for i in _imports(module)}) for module in MODULES}


def _circles() -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in GRAPH[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in sorted(GRAPH):
        if node not in index:
            visit(node)
    return circles


def test_the_graph_sees_the_whole_house() -> None:
    """A guard on the test itself: it reads every package, and resolves relative and symlinked imports."""
    assert {"codesdk.protocol", "codesdk.worker.main", "codesdk.supervisor.engine", "codesdk.client",
            "codesdk.testing"} <= set(MODULES)
    assert "codesdk.protocol" in GRAPH["codesdk.client"]
    assert len(MODULES) > 150


def test_no_import_circle() -> None:
    circles = _circles()
    tied = ["  " + " <-> ".join(c) + ": " + "; ".join(
        f"{a} imports {b}" for a in c for b in GRAPH[a] if b in c) for c in circles]
    assert not circles, "import circles:\n" + "\n".join(tied)


def _in(module: str, *packages: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


#: Each floor and what it may import of ours (besides itself). The floors, bottom up: the version; the protocol
#: (sans-IO); process handling; the worker (its client side included); the supervisor and the API client; the
#: test kit; the console scripts' dispatch.
FLOORS: list[tuple[str, tuple[str, ...]]] = [
    ("codesdk._version", ()),
    ("codesdk.protocol", ()),
    ("codesdk.procs", ()),
    ("codesdk.worker", ("codesdk._version", "codesdk.protocol", "codesdk.procs")),
    ("codesdk.client", ("codesdk._version", "codesdk.protocol")),
    ("codesdk.supervisor", ("codesdk._version", "codesdk.protocol", "codesdk.procs", "codesdk.worker.client",
                            "codesdk.worker.command", "codesdk.client")),
    ("codesdk.testing", ("codesdk._version", "codesdk.protocol", "codesdk.procs", "codesdk.worker")),
    ("codesdk._programs", ("codesdk.worker.main", "codesdk.testing.conformance")),
]


def _floor(module: str) -> str:
    return max((name for name, _ in FLOORS if _in(module, name)), key=len, default=module)


@pytest.mark.parametrize("floor,allowed", FLOORS, ids=[name for name, _ in FLOORS])
def test_each_floor_imports_only_what_is_below_it(floor: str, allowed: tuple[str, ...]) -> None:
    wrong = [f"{source} imports {target}" for source in MODULES if _floor(source) == floor
             for target in GRAPH[source] if not _in(target, floor, *allowed)]
    assert not wrong, "\n".join(wrong)


def test_the_face_package_imports_only_the_client() -> None:
    """``codesdk/__init__.py`` runs before every ``codesdk.*`` import: it names the client and the API's models, each
    imported on first use."""
    assert set(GRAPH["codesdk"]) <= {"codesdk._version", "codesdk.client", "codesdk.protocol", "codesdk.protocol.api"}


#: Inside the supervisor: the command lines are the top floor; nothing below them uses the API client, and the
#: store, the tools and the workers know nothing of the engine that drives them.
SUPERVISOR_NEVER = [
    ("codesdk.supervisor", "codesdk.supervisor.cli", "only the command lines are above everything"),
    ("codesdk.supervisor", "codesdk.client", "the service does not call itself through its own HTTP client"),
    ("codesdk.supervisor.store", "codesdk.supervisor.engine", "the store knows no engine"),
    ("codesdk.supervisor.tools", "codesdk.supervisor.engine", "the tools know no engine"),
    ("codesdk.supervisor.workers", "codesdk.supervisor.engine", "the worker pool knows no engine"),
    ("codesdk.supervisor.engine", "codesdk.supervisor.api", "the engine knows no HTTP"),
    ("codesdk.supervisor.engine", "codesdk.supervisor.service", "the engine is assembled, it does not assemble"),
]


def test_nothing_imports_the_command_front() -> None:
    """``cli.front`` is where the ``codesdk`` command starts: it parses, starts ``run``'s worker, then imports the
    rest. Imported back by anything, its lightness would rest on import order."""
    users = [m for m in MODULES if "codesdk.supervisor.cli.front" in GRAPH[m]]
    assert users == []


@pytest.mark.parametrize("source,target,why", SUPERVISOR_NEVER, ids=[f"{s}->{t}" for s, t, _ in SUPERVISOR_NEVER])
def test_the_supervisors_rooms_keep_their_rule(source: str, target: str, why: str) -> None:
    wrong = [f"{m} imports {t}" for m in MODULES if _in(m, source) and not _in(m, "codesdk.supervisor.cli")
             for t in GRAPH[m] if _in(t, target)]
    assert not wrong, f"{why}:\n" + "\n".join(wrong)


def _private_owner(module: str) -> str | None:
    """The package whose private module ``module`` is (``a.b._c`` -> ``a.b``), or None if it is public."""
    parts = module.split(".")
    for depth, part in enumerate(parts):
        if part.startswith("_") and not part.startswith("__"):
            return ".".join(parts[:depth])
    return None


def test_no_module_reaches_into_another_packages_private_modules() -> None:
    """A private module (``_name``) is its package's business: others go through the package's face."""
    wrong = []
    for source in MODULES:
        for target in GRAPH[source]:
            owner = _private_owner(target)
            if owner is not None and target != "codesdk._version" and not _in(source, owner):
                wrong.append(f"{source} imports {target}")
    assert not wrong, "\n".join(wrong)


def _python_sources() -> Iterator[Path]:
    for folder in ("protocol", "worker", "supervisor", "codesdk", "tests", "scripts", "fixtures"):
        for path in (REPO / folder).rglob("*.py"):
            if not (folder == "codesdk" and path.relative_to(REPO / folder).parts[0] in LINKED):
                yield path


def test_no_module_is_imported_by_a_second_name() -> None:
    """``protocol``, ``worker`` and ``supervisor`` are importable from the checkout's root, but as such they would be
    second copies of ``codesdk.protocol`` … (two classes of each model, two registries): nothing may name them."""
    wrong = []
    for path in _python_sources():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module]
            else:
                continue
            wrong += [f"{path.relative_to(REPO)}:{node.lineno}: {name}" for name in names
                      if name.split(".")[0] in LINKED]
    assert not wrong, "\n".join(wrong)
