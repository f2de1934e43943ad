"""The README's app, run as written against a real service: what a new user copies works, on typed models only."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import trio

from tests.api.conftest import Api

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_app() -> str:
    text = README.read_text()
    found = re.search(r"<!-- example: the README app[^\n]*-->\n```python\n(.*?)```", text, re.S)
    assert found, "README.md lost its marked app example"
    return found.group(1)


async def test_the_readme_app_runs_a_task_through_the_service(api: Api, tmp_path: Path) -> None:
    app = tmp_path / "app.py"
    app.write_text(readme_app())
    env = {**os.environ, "CODESDK_SOCKET": str(api.socket), "CODESDK_TOKEN": api.alice,
           "CODESDK_NAMESPACE": "user:alice"}
    with trio.fail_after(120):
        result = await trio.run_process([sys.executable, str(app)], env=env, capture_stdout=True,
                                        capture_stderr=True, check=False)
    out = result.stdout.decode()
    assert result.returncode == 0, (out, result.stderr.decode())
    assert "fix the failing test" in out  # the scripted runtime's echo, streamed delta by delta
    assert re.search(r"task task_\S+: completed, \d+ tokens out\n\Z", out), out
