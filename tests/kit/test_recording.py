"""A worker's recordings of its tasks (``worker._recording``, for golden replays): made only when the operator's
test instruments are on, and never holding a secret of the worker's environment."""

from __future__ import annotations

import json
from pathlib import Path

import trio

from codesdk.testing import namespace_env, open_worker
from codesdk.testing.replay import Recording
from codesdk.protocol import EventType
from codesdk.supervisor.namespaces import RECORD_STREAMS_ENV

CANARY = "canary-secret-7c1d2e9f"
#: A password JSON escapes (a quote, a backslash, a tab): found before the line is serialized, not after.
ESCAPED = 'pa"ss\\word\t-canary-40e2'
#: A personal access token, named as GitHub names them.
PAT = "ghp_canary0123456789abcdef"


async def _run_recorded(tmp_path: Path, *, test_steps: bool) -> Path:
    recordings = tmp_path / "recordings"
    env = namespace_env(tmp_path / "home", scripted_test_steps=test_steps,
                        extra={RECORD_STREAMS_ENV: str(recordings), "MY_API_KEY": CANARY, "MY_PASSWORD": ESCAPED,
                               "GITHUB_PAT": PAT})
    with trio.fail_after(60):
        async with open_worker(env=env) as worker:
            task = await worker.start_task(f"the key is {CANARY}, {ESCAPED} and {PAT}", scenario="echo")
            assert (await task.until_terminal())[-1].event.type == EventType.TASK_COMPLETED
    return recordings


async def test_a_recording_holds_the_task_but_never_a_secret_of_the_worker(tmp_path: Path) -> None:
    recordings = await _run_recorded(tmp_path, test_steps=True)
    [path] = recordings.glob("*.jsonl")
    text = path.read_text()
    for secret in (CANARY, ESCAPED, PAT):  # neither from the environment nor where the task repeated it
        assert secret not in text and json.dumps(secret)[1:-1] not in text, secret
    recording = Recording.load(path)
    assert recording.runtime == "scripted" and recording.complete
    assert recording.entries[0]["env"]["MY_API_KEY"] == "<MY_API_KEY>"
    assert RECORD_STREAMS_ENV not in recording.entries[0]["env"]  # taken out: no runtime inherits it
    assert "the key is <MY_API_KEY>, <MY_PASSWORD> and <GITHUB_PAT>" in json.dumps(recording.entries[0]["params"])
    assert recording.live_events[-1]["type"] == "task.completed"


async def test_without_the_test_instruments_nothing_is_recorded(tmp_path: Path) -> None:
    assert not (await _run_recorded(tmp_path, test_steps=False)).exists()
