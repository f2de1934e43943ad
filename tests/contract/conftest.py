from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from codesdk.testing import loopback_only
from codesdk.testing.replay import Recording
from fixtures.fake_anthropic import FakeAnthropic
from supervisor.namespaces import RECORD_STREAMS_ENV
from worker.adapters.acp._codex_acp import CodexAcpProfile
from worker.adapters.acp._gemini import GeminiProfile
from worker.adapters.acp._opencode import OpenCodeProfile
from worker.adapters.claude._launch import cli_path
from worker.adapters.codex._launch import codex_path

from ..conftest import STREAMS
from .cases import Case, ClaudeCase, CodexAcpCase, CodexCase, GeminiCase, OpenCodeCase, ScriptedCase

#: Runtimes whose built-in tools stay off under CodeSDK: the built-in contract tests do not apply to them.
_NO_BUILTINS = {"codex": "codex runs with its built-in tools off", "gemini": "gemini's built-in tools are excluded",
                "opencode": "opencode's built-in tools are denied",
                "codex-acp": "codex-acp's own tools that act are off (view_image reads only, apply_patch is not driven here)"}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "builtin_tools: needs a runtime with built-in tools an operator may enable")
    config.addinivalue_line("markers", "conversation: needs a runtime that keeps a conversation of its own")


@pytest.fixture(params=["scripted", *(pytest.param(name, marks=pytest.mark.runtime)
                                      for name in ("claude", "codex", "gemini", "opencode", "codex-acp"))])
def case(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Case]:
    if request.param in _NO_BUILTINS and request.node.get_closest_marker("builtin_tools"):
        pytest.skip(f"{_NO_BUILTINS[request.param]} under CodeSDK: no built-in to approve or deny")
    if request.param == "scripted":
        if request.node.get_closest_marker("conversation"):
            pytest.skip("the scripted runtime keeps no conversation of its own")
        yield ScriptedCase()
        return
    if not loopback_only():
        pytest.skip("real runtimes run only inside a loopback-only network namespace: use ./scripts/test")
    if request.param == "claude" and cli_path() is None:
        pytest.skip("claude-agent-sdk (with its bundled CLI) is not installed: pip install 'codesdk[claude]'")
    if request.param == "codex" and codex_path() is None:
        pytest.skip("Codex is not installed: ./scripts/install-runtimes (needs node and npm)")
    for profile in (GeminiProfile(), OpenCodeProfile(), CodexAcpProfile()):
        if request.param == profile.name and profile.program(os.environ) is None:
            pytest.skip(profile.missing_reason(os.environ))
    with FakeAnthropic.start(tmp_path / "api.jsonl") as fake:
        case: Case
        if request.param == "claude":
            case = ClaudeCase(fake.base_url)
        elif request.param == "codex":
            case = CodexCase(fake.openai_base_url)
        elif request.param == "gemini":
            case = GeminiCase(fake.gemini_base_url)
        elif request.param == "codex-acp":
            case = CodexAcpCase(fake.openai_base_url)
        else:
            case = OpenCodeCase(fake.chat_completions_base_url)
        case.fake = fake  # type: ignore[union-attr]
        if not request.config.getoption("--record-streams"):
            yield case
            return
        recorded = tmp_path / "recorded-streams"
        environment = case.worker_env
        monkeypatch.setattr(case, "worker_env", lambda: {**environment(), RECORD_STREAMS_ENV: str(recorded)})
        yield case
        keep_recordings(recorded, STREAMS / request.param / request.node.originalname)


def keep_recordings(recorded: Path, target: Path) -> None:
    """The test's recordings, in the order their tasks started, as ``target/taskN.jsonl`` (replacing the test's
    earlier ones); not those cut short by the death of their worker. Paths of this run (the workspace, temp dirs)
    stay in them: the replay's normalizing hides them."""
    if target.exists():
        shutil.rmtree(target)
    files = [f for f in sorted(recorded.glob("*.jsonl")) if Recording.load(f).complete] if recorded.is_dir() else []
    if files:
        target.mkdir(parents=True)
        for number, file in enumerate(files, 1):
            shutil.copyfile(file, target / f"task{number}.jsonl")
