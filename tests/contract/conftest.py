from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from codesdk.testing import loopback_only
from codesdk.testing.replay import Recording
from fixtures.fake_anthropic import FakeAnthropic
from codesdk.supervisor.namespaces import RECORD_STREAMS_ENV
from codesdk.worker.adapters.acp._codex_acp import CodexAcpProfile
from codesdk.worker.adapters.acp._gemini import GeminiProfile
from codesdk.worker.adapters.acp._opencode import OpenCodeProfile
from codesdk.worker.adapters.claude.launch import cli_path
from codesdk.worker.adapters.codex.launch import codex_path

from tests.conftest import STREAMS
from tests.contract.cases import Case, ClaudeCase, CodexAcpCase, CodexCase, GeminiCase, OpenCodeCase, ScriptedCase

#: Runtimes whose built-in tools stay off under CodeSDK: the built-in contract tests do not apply to them.
_NO_BUILTINS = {"codex": "codex runs with its built-in tools off", "gemini": "gemini's built-in tools are excluded",
                "opencode": "opencode's built-in tools are denied",
                "codex-acp": "codex-acp's own tools that act are off (view_image reads only, apply_patch is not driven here)"}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "builtin_tools: needs a runtime with built-in tools an operator may enable")
    config.addinivalue_line("markers", "conversation: needs a runtime that keeps a conversation of its own")


#: Every runtime the contract covers, the scripted one first.
RUNTIMES = ("scripted", "claude", "codex", "gemini", "opencode", "codex-acp")


def unavailable(name: str) -> str | None:
    """Why the runtime cannot be driven here (None: it can)."""
    if name == "scripted":
        return None
    if not loopback_only():
        return "real runtimes run only inside a loopback-only network namespace: use ./scripts/test"
    if name == "claude" and cli_path() is None:
        return "claude-agent-sdk (with its bundled CLI) is not installed: pip install 'codesdk[claude]'"
    if name == "codex" and codex_path() is None:
        return "Codex is not installed: ./scripts/install-runtimes (needs node and npm)"
    for profile in (GeminiProfile(), OpenCodeProfile(), CodexAcpProfile()):
        if name == profile.name and profile.program(os.environ) is None:
            return profile.missing_reason(os.environ)
    return None


def make_case(name: str, fake: FakeAnthropic) -> Case:
    """The case of a runtime, talking to ``fake`` (one fake serves every runtime's dialect)."""
    cases: dict[str, Callable[[], Case]] = {
        "scripted": ScriptedCase, "claude": lambda: ClaudeCase(fake.base_url),
        "codex": lambda: CodexCase(fake.openai_base_url), "gemini": lambda: GeminiCase(fake.gemini_base_url),
        "codex-acp": lambda: CodexAcpCase(fake.openai_base_url),
        "opencode": lambda: OpenCodeCase(fake.chat_completions_base_url)}
    case = cases[name]()
    case.fake = fake  # type: ignore[union-attr]
    return case


@pytest.fixture(params=["scripted", *(pytest.param(name, marks=pytest.mark.runtime) for name in RUNTIMES[1:])])
def case(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Case]:
    if request.param in _NO_BUILTINS and request.node.get_closest_marker("builtin_tools"):
        pytest.skip(f"{_NO_BUILTINS[request.param]} under CodeSDK: no built-in to approve or deny")
    if request.param == "scripted":
        if request.node.get_closest_marker("conversation"):
            pytest.skip("the scripted runtime keeps no conversation of its own")
        yield ScriptedCase()
        return
    if (reason := unavailable(request.param)) is not None:
        pytest.skip(reason)
    with FakeAnthropic.start(tmp_path / "api.jsonl") as fake:
        case = make_case(request.param, fake)
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
