"""The redactor on its own, and the writer's choices for blobs (binary left out, JSON redacted value by value)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import cast

import pytest

from codesdk.protocol import (
    EventType,
    Model,
    ModelInput,
    ModelOutputDelta,
    NormalizedEvent,
    RuntimeInfo,
    TaskFailed,
    ToolCallCompleted,
    ToolCallRequested,
    Trace,
    sha256_hex,
    utc_now,
)
from codesdk.supervisor.bundle import (
    BundleError,
    BundleSources,
    Redactor,
    inspect_bundle,
    read_patterns_file,
    write_bundle,
)
from codesdk.supervisor.store import BlobNotFound, StoreReader

from tests.bundle.conftest import leaks, members

ENV_VALUE = 'va"lue\\with-escapes/42'


@pytest.mark.parametrize(("text", "kind"), [
    ("Authorization: Basic dXNlcjpwYXNz", "authorization"),
    ('{"authorization": "token abc"}', "authorization"),
    ("curl -H 'Bearer abcdefgh12345678'", "bearer"),
    ("key sk-ant-api03-AbCdEf0123456789xyz", "key"),
    ("gemini AIzaSyA1234567890abcdefghijklmnopqrstu", "key"),
    ("OPENAI_API_KEY=abcdefgh12345678", "secret_assignment"),
    ("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAA\n-----END OPENSSH PRIVATE KEY-----", "private_key"),
    ("-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEI cut short", "private_key"),
    ("csk_" + "Ab1-" * 11, "api_token"),
    ("hmac " + "0123456789abcdef" * 3, "hex_secret"),
    ("bridge token qW3eR5tY7uI9oP1aS3dF5gH7jK9lZ1xC3vB5", "base64_secret"),
])
def test_each_kind(text: str, kind: str) -> None:
    redactor = Redactor({})
    out = redactor.text(text, "f")
    assert f"[REDACTED:{kind}]" in out, out
    assert redactor.report()["f"][kind] >= 1


@pytest.mark.parametrize("text", [
    "sha256:" + "ab" * 32,
    "ses_0123456789abcdef0123456789abcdef and task_0123456789abcdef0123456789abcdef",
    "/tmp/pytest-of-root/pytest-7/test_something_long0/data/workspaces/ses_0123456789abcdef0123456789abcdef/a.txt",
    "input_tokens: 12, output_tokens: 7",
    "the quick brown fox jumps over the lazy dog",
])
def test_what_names_things_stays(text: str) -> None:
    redactor = Redactor({})
    assert redactor.text(text, "f") == text
    assert redactor.report() == {}


def test_values_are_found_inside_json_whatever_its_escaping() -> None:
    redactor = Redactor({ENV_VALUE: "namespace_env", "pin1": "namespace_env"}, [r"ACME-\d+"])
    value = {"a": [f"x{ENV_VALUE}y", {"deep": ENV_VALUE}], ENV_VALUE: 1, "b": "pin1 but not pin10 nor spin1",
             "c": "ACME-77"}
    out = json.dumps(redactor.json(value, "f"))
    assert "lue" not in out and "ACME-77" not in out
    assert "pin10" in out and "spin1" in out  # a short value only as a whole word
    assert redactor.report()["f"] == {"namespace_env": 4, "pattern": 1}


def test_bad_patterns_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match="not a valid regex"):
        Redactor({}, ["(unclosed"])
    (tmp_path / "bundle-redact.txt").write_text("# comment\n\nACME-\\d+\n  FOO  \n")
    assert read_patterns_file(tmp_path) == ["ACME-\\d+", "FOO"]
    assert read_patterns_file(tmp_path / "none") == []


class _Store:
    """The two reads the writer makes (``read``, ``get_blob``), over a fixed list of events and blobs."""

    def __init__(self, events: list[tuple[EventType, Model, RuntimeInfo]], blobs: dict[str, bytes]) -> None:
        self.events = [NormalizedEvent(seq=i + 1, type=t, payload=p, runtime=r, trace=Trace(session_id="ses_x"),
                                       time=utc_now())
                       for i, (t, p, r) in enumerate(events)]
        self.blobs = blobs

    async def read(self, session_id: str, after_seq: int = 0, limit: int = 1000) -> list[NormalizedEvent]:
        return [e for e in self.events if e.seq > after_seq][:limit]

    async def get_blob(self, ref: str) -> bytes:
        try:
            return self.blobs[ref]
        except KeyError:
            raise BlobNotFound(ref) from None


async def test_binary_blobs_are_left_out_text_and_json_redacted(tmp_path: Path) -> None:
    secret = "binary-canary-0123456789"
    binary = b"\x00\xff\xfe" + secret.encode() + b"\x80"
    text = f"log line with {secret}\n".encode()
    as_json = json.dumps({"env": {"K": secret}}).encode()
    blobs = {sha256_hex(b): b for b in (binary, text, as_json)}
    refs = list(blobs)
    missing = sha256_hex(b"never stored")
    runtime = RuntimeInfo(name="scripted")
    events: list[tuple[EventType, Model, RuntimeInfo]] = [
        (EventType.MODEL_INPUT, ModelInput(input_ref=refs[1], input_hash=refs[1], message_count=1),
         runtime.model_copy(update={"raw_ref": refs[0]})),
        (EventType.TOOL_CALL_REQUESTED, ToolCallRequested(
            tool_call_id="c1", input_hash=refs[0], tool_name="workspace.read",
            input={"other_ref": sha256_hex(b"named by a tool's input")}), runtime),
        (EventType.TOOL_CALL_COMPLETED, ToolCallCompleted(
            tool_call_id="c1", input_hash=refs[0], tool_name="workspace.read", result_ref=refs[2]), runtime),
        (EventType.TASK_FAILED, TaskFailed(code="RUNTIME_CRASHED", message="x",
                                           details={"stderr_tail_ref": missing}), runtime)]
    # a page size smaller than the events: several pages
    events += [(EventType.MODEL_OUTPUT_DELTA, ModelOutputDelta(block_id="b", delta=f"{i} {secret}"), runtime)
               for i in range(1200)]
    sources = BundleSources(store=cast(StoreReader, _Store(events, blobs)), session_id="ses_x",
                            secrets={secret: "namespace_env"}, environment={}, config={}, workers={}, health={})
    out = tmp_path / "b.tar.gz"
    manifest = await write_bundle(sources, out)
    assert leaks(out, [secret]) == []
    by_ref = {b["ref"]: b for b in manifest["blobs"]}
    assert by_ref[refs[0]]["included"] is False and "binary" in by_ref[refs[0]]["why"]
    assert by_ref[refs[1]] == {"ref": refs[1], "included": True, "as": "text", "redacted": True}
    assert by_ref[refs[2]]["as"] == "json"
    assert by_ref[missing]["included"] is False
    assert len(by_ref) == 4  # a ref inside a tool's input is not the session's to name
    files = members(out)
    assert f"blobs/{refs[0].removeprefix('sha256:')}" not in files
    assert json.loads(files[f"blobs/{refs[2].removeprefix('sha256:')}"]) == {"env": {"K": "[REDACTED:namespace_env]"}}
    assert manifest["counts"]["events"] == 1204 and len(files["events.jsonl"].splitlines()) == 1204
    assert manifest["redactions"]["by_file"]["events.jsonl"] == {"namespace_env": 1200}
    assert inspect_bundle(out)["counts"]["blobs_included"] == 2
