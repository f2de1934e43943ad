"""The replay kit itself (``codesdk.testing.replay``): a replay shows what changed, never hangs on a recording
that does not fit, and its normalizing keeps what is decided while hiding what is made up on each run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from codesdk.testing.replay import Recording, RecordingError, ReplayUnavailable, normalize, replay, to_golden
from codesdk.protocol import StartTaskParams

from tests.conftest import GOLDEN, STREAMS

STREAMING = STREAMS / "claude" / "test_streams_deltas_then_completes" / "task1.jsonl"


def _edited(tmp_path: Path, source: Path, edit: object) -> Recording:
    """``source`` with each entry passed through ``edit`` (None drops it), as a new recording."""
    entries = [json.loads(line) for line in source.read_text().splitlines()]
    kept = [e for e in (edit(entry) for entry in entries) if e is not None]  # type: ignore[operator]
    path = tmp_path / source.name
    path.write_text("".join(json.dumps(e) + "\n" for e in kept))
    return Recording.load(path)


async def _replayed(recording: Recording) -> str:
    try:
        replayed = await replay(recording)
    except ReplayUnavailable as exc:
        pytest.skip(str(exc))
    return to_golden(normalize(replayed.as_golden_entries(), recording.params))


async def test_a_runtime_that_says_something_else_shows_in_the_events(tmp_path: Path) -> None:
    def louder(entry: dict[str, object]) -> dict[str, object]:
        if entry["kind"] == "stdout":
            entry["line"] = str(entry["line"]).replace("ntract", "NTRACT")
        return entry

    golden = (GOLDEN / "claude" / "test_streams_deltas_then_completes" / "task1.events.jsonl").read_text()
    got = await _replayed(_edited(tmp_path, STREAMING, louder))
    assert got != golden and "Echo: hello coNTRACT" in got and "Echo: hello contract" in golden


async def test_an_adapter_that_writes_something_else_to_its_runtime_is_a_divergence(tmp_path: Path) -> None:
    def other_prompt(entry: dict[str, object]) -> dict[str, object]:
        if entry["kind"] == "stdin" and '"type":"user"' in str(entry["data"]):
            entry["data"] = str(entry["data"]).replace("hello contract", "hello elsewhere")
        return entry

    recording = _edited(tmp_path, STREAMING, other_prompt)
    try:
        replayed = await replay(recording)
    except ReplayUnavailable as exc:
        pytest.skip(str(exc))
    assert any("hello elsewhere" in d for d in replayed.diverged)
    assert any("hello contract" in d for d in replayed.diverged)


async def test_a_recording_cut_short_ends_its_task_as_a_crash(tmp_path: Path) -> None:
    """Its program's output stops midway and it never exits when recorded: the replay still ends, once, with
    the program's death — no hang, and the stream keeps its invariants (``replay`` checks them)."""
    seen = {"stdout": 0}

    def cut(entry: dict[str, object]) -> dict[str, object] | None:
        if entry["kind"] == "stdout":
            seen["stdout"] += 1
        return entry if seen["stdout"] <= 6 and entry["kind"] not in ("exit", "stdout_end") else None

    recording = _edited(tmp_path, STREAMING, cut)
    try:
        replayed = await replay(recording)
    except ReplayUnavailable as exc:
        pytest.skip(str(exc))
    last = replayed.events[-1].event.to_json_obj()
    assert last["type"] == "task.failed" and last["payload"]["code"] == "RUNTIME_CRASHED"
    assert not recording.complete and any("ends before its task did" in d for d in replayed.diverged)


@pytest.mark.parametrize(("content", "complaint"), [
    ("", "is empty"),
    ("[1]\n", ":1: not a recorded step"),
    ('{"kind": "stdout", "line": "x"}\n', "does not begin with the task's start (its first step is 'stdout')"),
    ('{"kind": "start", "params": {}}\n', ":1: a start step needs runtime (a string)"),
    ('{"kind": "start", "runtime": "claude", "params": {"runtime": "claude"}}\n',
     ":1: the task's start params are not runtime.startTask params: "),
    (None, ":2: a stdout step needs line (a string)"),
    (None, ":2: unknown step 'telepathy'"),
    (None, ":2: a second start"),
    (None, ":2: an event step's event is not one a worker sends"),
    (None, ":2: not JSON (the file ends mid-line: was it cut short?)"),
])
def test_a_malformed_recording_is_refused_saying_which_line_and_why(tmp_path: Path, content: str | None,
                                                                     complaint: str) -> None:
    path = tmp_path / "bad.jsonl"
    if content is None:  # a good start, then a bad step
        start = STREAMING.read_text().splitlines()[0]
        step = {"stdout": '{"kind": "stdout"}', "unknown": '{"kind": "telepathy"}', "second": start,
                "event": '{"kind": "event", "n": 1, "event": {"type": "no.such.event", "payload": {}}}',
                "JSON": '{"kind": "stdout", "li'}[next(word for word in ("stdout", "unknown", "second", "event", "JSON")
                                                       if word in complaint)]
        content = f"{start}\n{step}\n"
    path.write_text(content)
    with pytest.raises(RecordingError) as refused:
        Recording.load(str(path))  # a str path is fine too
    assert complaint in str(refused.value)


def test_blank_lines_in_a_recording_are_no_steps(tmp_path: Path) -> None:
    path = tmp_path / "edited.jsonl"
    path.write_text(STREAMING.read_text() + "\n\n")  # an editor's trailing blank lines
    assert Recording.load(path).entries == Recording.load(STREAMING).entries


def _params(workspace: str = "/tmp/ws-1") -> StartTaskParams:
    return StartTaskParams.model_validate({
        "runtime": "claude", "task_id": "task_1", "session": {"session_id": "ses_1"}, "workspace": workspace,
        "messages": [{"role": "user", "blocks": [{"type": "text", "text": "hi"}]}]})


def test_normalizing_numbers_made_up_ids_and_hides_paths_and_measurements() -> None:
    events = [
        {"type": "tool.call.requested", "payload": {"tool_call_id": "toolu_0123456789ab", "input_hash": "sha256:aa",
                                                    "input": {"path": "/tmp/ws-1/a.txt"}}},
        {"type": "tool.call.completed", "payload": {"tool_call_id": "toolu_0123456789ab", "input_hash": "sha256:aa",
                                                    "result_preview": "3456789ab=ok"}},
        {"type": "usage.reported", "payload": {"input_tokens": 2541, "cost_usd": 0.0123}},
        {"type": "model.output.delta", "payload": {"block_id": "task_1:msg_abcdefgh:0", "kind": "text", "index": 0,
                                                   "delta": "called toolu_0"}},
        {"type": "model.output.delta", "payload": {"block_id": "task_1:msg_abcdefgh:0", "kind": "text", "index": 1,
                                                   "delta": "123456789ab"}},
    ]
    requested, completed, usage, delta = normalize(events, _params())
    assert requested["payload"] == {"tool_call_id": "<toolu_1>", "input_hash": "<input_hash_1>",
                                    "input": {"path": "<workspace>/a.txt"}}
    assert completed["payload"]["input_hash"] == "<input_hash_1>"
    assert completed["payload"]["result_preview"] == "<…toolu_1>=ok"  # the id the preview cut
    # what a run measured (a cost) is hidden; what the runtime decided (its token count) stays
    assert usage["payload"] == {"input_tokens": 2541, "cost_usd": "<measured>"}
    assert delta["payload"] == {"block_id": "<task>:<msg_1>:0", "kind": "text", "delta": "called <toolu_1>",
                                "deltas": 2}


def test_normalizing_is_the_same_for_the_same_run_made_again() -> None:
    """Two runs that differ only in what they made up normalize to the same text."""
    def run(suffix: str, workspace: str) -> str:
        return to_golden(normalize([{"type": "x", "payload": {"id": f"call_{suffix}", "cwd": workspace,
                                                             "again": f"call_{suffix}"}}], _params(workspace)))

    assert run("aaaaaaaa", "/tmp/ws-1") == run("bbbbbbbb", "/tmp/ws-2")
