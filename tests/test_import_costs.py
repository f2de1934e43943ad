"""What a program loads before it can work: an embedded supervisor (``codesdk run``) stays free of the HTTP stack.
(Which package may import which is ``test_architecture``'s; the ``codesdk`` command's front and the worker's first
imports are held in ``tests/e2e/test_headstart.py``.)"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

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
