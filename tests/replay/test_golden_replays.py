"""Golden replays: each recorded runtime stream (``fixtures/streams``, made by ``--record-streams`` from the
contract tests' runs of the real runtimes) is played again through CodeSDK's worker and its runtime's adapter —
no runtime, no network — and the events that come out must be the golden ones (``tests/golden``). A runtime
upgrade whose output the adapter maps differently, or an adapter change, shows up as a diff of those events.

Re-recording (needs the runtimes and a loopback-only namespace: ``./scripts/test``)::

    ./scripts/test tests/contract tests/replay -k claude --record-streams --update-goldens

then review ``git diff tests/golden``. With ``--record-streams`` each replay must also give exactly the events
the worker sent while it was recorded: the replay is faithful to the run it replays.
"""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest

from codesdk.testing.replay import (
    Recording,
    ReplayUnavailable,
    installed_version,
    normalize,
    replay,
    to_golden,
)
from codesdk.supervisor.namespaces import RECORD_STREAMS_ENV, NamespaceEnv, NamespaceEnvError
from codesdk.worker.command import RECORD_STREAMS_ENV as RECORD_ENV

from tests.conftest import GOLDEN, STREAMS

RECORDINGS = sorted(STREAMS.glob("*/*/task*.jsonl"))


def _golden_of(recording: Path) -> Path:
    runtime, test = recording.parts[-3], recording.parts[-2]
    return GOLDEN / runtime / test / f"{recording.stem}.events.jsonl"


def _diff(expected: str, got: str, expected_name: str, got_name: str) -> str:
    return "".join(difflib.unified_diff(expected.splitlines(keepends=True), got.splitlines(keepends=True),
                                        expected_name, got_name, n=2))


@pytest.mark.parametrize("path", RECORDINGS, ids=lambda p: f"{p.parts[-3]}/{p.parts[-2]}/{p.stem}")
async def test_a_recorded_stream_replays_to_its_golden_events(path: Path, request: pytest.FixtureRequest) -> None:
    recording = Recording.load(path)
    try:
        replayed = await replay(recording)
    except ReplayUnavailable as exc:
        pytest.skip(str(exc))
    assert replayed.diverged == [], (
        f"the adapter no longer talks to {recording.runtime} as it did when {path.name} was recorded, so the "
        "recording is no evidence of what the runtime would answer now; re-record it (see this module's docstring):\n"
        + "\n".join(replayed.diverged))
    got = to_golden(normalize(replayed.as_golden_entries(), recording.params))
    if request.config.getoption("--record-streams"):
        live = to_golden(normalize(recording.live_events, recording.params))
        assert got == live, ("the replay differs from what the worker sent when recorded:\n"
                             + _diff(live, got, "recorded", "replayed"))
    golden = _golden_of(path)
    if request.config.getoption("--update-goldens"):
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(got, encoding="utf-8")
        return
    assert golden.exists(), f"{golden} is missing: run the replays with --update-goldens and review it"
    expected = golden.read_text(encoding="utf-8")
    if got != expected:
        pytest.fail(f"{path.relative_to(STREAMS.parent.parent)} no longer replays to its golden events "
                    f"({recording.runtime} {recording.version}):\n{_diff(expected, got, str(golden.name), 'replayed')}"
                    "\nIf the change is intended, accept it with --update-goldens and review git diff tests/golden.",
                    pytrace=False)


def test_every_golden_has_its_recording() -> None:
    """A golden whose recording is gone would silently stop being checked."""
    orphans = [g for g in GOLDEN.glob("*/*/*.events.jsonl")
               if not (STREAMS / g.parts[-3] / g.parts[-2] / g.name.replace(".events.jsonl", ".jsonl")).exists()]
    assert orphans == []


def test_claude_has_recordings() -> None:
    assert any(p.parts[-3] == "claude" for p in RECORDINGS)


def test_the_recordings_are_of_the_runtime_versions_this_build_runs() -> None:
    """Upgrading a pinned runtime comes with its streams re-recorded: its goldens' diff is the review of what
    the upgrade changes in CodeSDK's events."""
    stale = sorted({f"{r.runtime}: recorded with {r.version}, this build runs {installed}"
                    for r in map(Recording.load, RECORDINGS)
                    if (installed := installed_version(r.runtime)) and installed not in ("unavailable", "unknown", r.version)})
    assert stale == [], "re-record the streams (see this module's docstring): " + "; ".join(stale)


def test_only_the_operator_turns_recording_on(tmp_path: Path) -> None:
    """A recording holds everything a task saw: a tenant's stored variables may not ask a worker for one."""
    assert RECORD_STREAMS_ENV == RECORD_ENV
    with pytest.raises(NamespaceEnvError, match=RECORD_STREAMS_ENV):
        NamespaceEnv(tmp_path).update("default", {RECORD_STREAMS_ENV: str(tmp_path)})
