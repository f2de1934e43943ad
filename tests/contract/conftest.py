from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fixtures.fake_anthropic import FakeAnthropic
from worker.adapters.claude._launch import cli_path
from worker.adapters.codex._launch import codex_path

from ..netns import loopback_only
from .cases import Case, ClaudeCase, CodexCase, ScriptedCase


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "builtin_tools: needs a runtime with built-in tools an operator may enable")


@pytest.fixture(params=["scripted", pytest.param("claude", marks=pytest.mark.runtime),
                        pytest.param("codex", marks=pytest.mark.runtime)])
def case(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Case]:
    if request.param == "codex" and request.node.get_closest_marker("builtin_tools"):
        pytest.skip("codex runs with its built-in tools off under CodeSDK: no built-in to approve or deny")
    if request.param == "scripted":
        yield ScriptedCase()
        return
    if not loopback_only():
        pytest.skip("real runtimes run only inside a loopback-only network namespace: use ./scripts/test")
    if request.param == "claude" and cli_path() is None:
        pytest.skip("claude-agent-sdk (with its bundled CLI) is not installed: pip install 'codesdk[claude]'")
    if request.param == "codex" and codex_path() is None:
        pytest.skip("Codex is not installed: ./scripts/install-runtimes (needs node and npm)")
    with FakeAnthropic.start(tmp_path / "api.jsonl") as fake:
        case: Case = ClaudeCase(fake.base_url) if request.param == "claude" else CodexCase(fake.openai_base_url)
        case.fake = fake  # type: ignore[union-attr]
        yield case
