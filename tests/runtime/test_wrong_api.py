"""Issue 33: a wrong or unreachable model API, on Claude Code and Codex (the ACP agents: tests/runtime/test_acp.py,
with the same expectations): the same mistake gets the same code and retryable flag on every runtime, and the
message names the base URL the runtime used, never a key. The time to fail is printed, never asserted."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from codesdk.protocol import EventType, TaskFailureCode
from codesdk.supervisor.engine import session_events
from codesdk.supervisor.store import TaskState
from codesdk.worker.adapters.claude.launch import BadClaudeConfig, ClaudeSettings, claude_launch
from fixtures.fake_anthropic import FakeAnthropic

from tests.conftest import MakeEngine
from tests.contract.cases import CODEX_CONFIG, ClaudeCase, CodexCase
from tests.contract.conftest import unavailable
from tests.e2e.conftest import of_type
from tests.netns import skip_outside_netns

pytestmark = [pytest.mark.runtime, skip_outside_netns]

#: A wrong or unreachable model API -> (code, retryable), the same on every runtime (test_acp.WRONG_API).
WRONG_API = {"unreachable": (TaskFailureCode.API_UNREACHABLE, True),
             "404": (TaskFailureCode.INVALID_REQUEST, False), "401": (TaskFailureCode.AUTH_REQUIRED, False)}


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeAnthropic]:
    with FakeAnthropic.start(tmp_path / "api.jsonl") as server:
        yield server


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("runtime", [pytest.param(name, marks=pytest.mark.skipif(
    unavailable(name) is not None, reason=str(unavailable(name)))) for name in ("claude", "codex")])
@pytest.mark.parametrize("cause", list(WRONG_API))
async def test_a_wrong_or_unreachable_model_api_is_told_apart_and_named(
        make_engine: MakeEngine, fake: FakeAnthropic, runtime: str, cause: str) -> None:
    if cause == "unreachable":
        fake.port = _closed_port()  # the base URLs below now point at a closed port
    case = ClaudeCase(fake.base_url) if runtime == "claude" else CodexCase(fake.openai_base_url)
    # The retry budget is the caller's (runtime_config.max_retries), not the namespace's environment.
    config: dict[str, Any] = {"max_retries": 0} if runtime == "claude" else {**CODEX_CONFIG, "max_retries": 0}
    env = {k: v for k, v in case.worker_env().items() if k != "CLAUDE_CODE_MAX_RETRIES"}
    prompt = "SAY hello" if cause == "unreachable" else f"ERROR {cause}"
    with trio.fail_after(240):
        async with make_engine(worker_env={"*": env}) as engine:
            session = await engine.create_session(runtime=runtime)
            started = trio.current_time()
            task = await engine.start_task(session.session_id, prompt, runtime_config=config)
            record = await engine.wait_task(task.task_id)
            print(f"\n{runtime} {cause}: failed after {trio.current_time() - started:.1f} s")
            events = await session_events(engine.store, session.session_id)
    [failed] = of_type(events, EventType.TASK_FAILED)
    assert record.state == TaskState.FAILED
    assert (failed.code, failed.retryable) == WRONG_API[cause], failed
    assert case.base_url.rstrip("/") in failed.message, failed.message
    assert "sk-test" not in failed.message


def test_claudes_retry_budget_is_the_callers() -> None:
    """runtime_config.max_retries (0-10) becomes the CLI's CLAUDE_CODE_MAX_RETRIES; anything else is refused."""
    settings = ClaudeSettings.from_config({"max_retries": 0})
    launch = claude_launch(Path("/bin/claude"), settings, cwd="/", resume=None, environ={"PATH": "/bin"})
    assert launch.env["CLAUDE_CODE_MAX_RETRIES"] == "0"
    assert "CLAUDE_CODE_MAX_RETRIES" not in claude_launch(Path("/bin/claude"), ClaudeSettings.from_config({}),
                                                          cwd="/", resume=None, environ={}).env
    for bad in (-1, 11, "3", True):
        with pytest.raises(BadClaudeConfig, match="max_retries"):
            ClaudeSettings.from_config({"max_retries": bad})
