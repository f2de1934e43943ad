"""The engine's modules import only those below them (the order its package docstring gives): no import circle,
and the tool flow reaches the engine through its port alone."""

from __future__ import annotations

import ast
from pathlib import Path

import codesdk.supervisor.engine

LAYERS = ["_transcript", "_errors", "_telemetry", "_deadlines", "_ports", "_compile", "_stopping", "_meter", "_runs",
          "_recorder", "_batch", "_audience", "_approvals", "_grants", "_questions", "_toolport", "_toolflow", "_steering", "_ending", "_budgets",
          "_intake", "_leasing", "_lifecycle", "_requests", "_engine"]
PACKAGE = Path(codesdk.supervisor.engine.__file__).parent


def _imports(module: str) -> set[str]:
    """The package's own modules that ``module`` imports (also under TYPE_CHECKING)."""
    tree = ast.parse((PACKAGE / f"{module}.py").read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            found |= {node.module.split(".")[0]} if node.module else {alias.name for alias in node.names}
    return found


def test_every_module_is_in_a_layer() -> None:
    assert {p.stem for p in PACKAGE.glob("_*.py")} - {"__init__"} == set(LAYERS)


def test_each_module_imports_only_lower_layers() -> None:
    for rank, module in enumerate(LAYERS):
        above = _imports(module) - set(LAYERS[:rank])
        assert not above, f"{module} imports {sorted(above)}, which are not below it"


def test_the_tool_flow_knows_nothing_of_the_engine_its_workers_or_its_store() -> None:
    assert _imports("_toolflow") <= {"_approvals", "_runs", "_telemetry", "_toolport"}
    source = (PACKAGE / "_toolflow.py").read_text()
    assert "EventStore" not in source and "WorkerProcess" not in source
