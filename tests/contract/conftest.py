from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fixtures.fake_anthropic import FakeAnthropic
from worker.adapters.claude._launch import cli_path

from ..netns import loopback_only
from .cases import ClaudeCase, ScriptedCase


@pytest.fixture(params=["scripted", pytest.param("claude", marks=pytest.mark.runtime)])
def case(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ScriptedCase | ClaudeCase]:
    if request.param == "scripted":
        yield ScriptedCase()
        return
    if not loopback_only():
        pytest.skip("real runtimes run only inside a loopback-only network namespace: use ./scripts/test")
    if cli_path() is None:
        pytest.skip("claude-agent-sdk (with its bundled CLI) is not installed: pip install 'codesdk[claude]'")
    with FakeAnthropic.start(tmp_path / "api.jsonl") as fake:
        case = ClaudeCase(fake.base_url)
        case.fake = fake  # type: ignore[attr-defined]
        yield case
