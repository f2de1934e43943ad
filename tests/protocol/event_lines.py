"""Worker event lines for the decoder's tests: the general path (the oracle), strategies that write lines a worker
would write or nearly (a small JSON writer that can repeat keys, escape key characters, add whitespace, write NaN,
Infinity, overflowing floats and long integers, then byte-level damage), and typical examples.

The general path is what a line means without the fast path: the strict decoder (``decode_json``), the envelope
check, then ``RuntimeEventParams.model_validate``.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, get_args

from hypothesis import strategies as st
from pydantic import BaseModel

from codesdk.protocol import (
    PAYLOAD_MODELS,
    WORKER_EVENT_TYPES,
    EventType,
    Method,
    ModelOutputDelta,
    RuntimeEventParams,
    RuntimeInfo,
    SandboxSummary,
    TaskFailed,
    ToolCallCompleted,
    ToolCallRequested,
    ToolOutputDelta,
    UsageReported,
    WorkerEvent,
    canonical_hash,
    decode_json,
    encode_event_notification,
)
from codesdk.protocol._framing import MAX_INTEGER_DIGITS, MAX_NESTING_DEPTH

_ENVELOPE_KEYS = frozenset({"jsonrpc", "method", "params"})


def general_path(line: bytes) -> RuntimeEventParams | None:
    """The oracle: what the supervisor makes of ``line`` without the fast path (None: not a valid event)."""
    value = decode_json(line)
    if not (isinstance(value, dict) and value.keys() == _ENVELOPE_KEYS and value["method"] == Method.EVENT
            and value["jsonrpc"] == "2.0" and isinstance(value["params"], dict)):
        return None
    try:
        return RuntimeEventParams.model_validate(value["params"])
    except Exception:  # noqa: BLE001 - invalid_event, whatever the reason
        return None


# --- strategies ------------------------------------------------------------------------------------

#: Strings that sit on the edges of the key count and of the decoders.
_TRICKY = [":", '":', '\\":', '\\', '\\\\', ' :', "\t:", "NaN", "Infinity", "1e400", '"', "{", "[", "\U0001f600",
           "é", "\x7f", "\u2028", "a\u0000b"]
texts = st.text(max_size=12) | st.sampled_from(_TRICKY)
json_scalars = (st.none() | st.booleans() | st.integers(-(2**70), 2**70) | texts
                | st.floats(allow_nan=False, allow_infinity=False))
json_values = st.recursive(json_scalars, lambda kids: st.lists(kids, max_size=3)
                           | st.dictionaries(texts, kids, max_size=3), max_leaves=10)
times = st.datetimes(timezones=st.sampled_from([UTC, None]) | st.timezones())
ids = st.text(alphabet="abcdefghij0123456789:-_", min_size=1, max_size=12)


@st.composite
def worker_events(draw: st.DrawFn) -> dict[str, Any]:
    """A worker event as a JSON-compatible dict (valid, or nearly: drawn payloads may break a constraint)."""
    event_type = draw(st.sampled_from(sorted(WORKER_EVENT_TYPES)))
    payload = draw(st.builds(PAYLOAD_MODELS[event_type])).to_json_obj()
    if event_type == EventType.TOOL_CALL_REQUESTED and draw(st.booleans()):
        payload["input"] = draw(st.dictionaries(texts, json_values, max_size=3))
    if event_type == EventType.TASK_FAILED:
        payload["details"] = draw(st.dictionaries(texts, json_values, max_size=3))
    event: dict[str, Any] = {"type": event_type.value, "runtime": {"name": draw(ids)}, "payload": payload}
    if draw(st.booleans()):
        moment = draw(times)
        event["time"] = moment.isoformat() if draw(st.booleans()) or moment.tzinfo is None else \
            moment.astimezone(UTC).isoformat().replace("+00:00", "Z")
    if draw(st.booleans()):
        event["runtime"]["model"] = draw(texts)
    if draw(st.booleans()):
        event["raw"] = draw(json_values)
    return {"jsonrpc": "2.0", "method": "runtime.event",
            "params": {"task_id": draw(ids), "n": draw(st.integers(1, 2**40)), "event": event}}


class _Writer:
    """Renders a JSON value as text, drawing now and then a departure from what ``json.dumps`` would write."""

    def __init__(self, draw: st.DrawFn, wild: bool) -> None:
        self.draw = draw
        self.wild = wild  # False: exactly the worker's compact encoding

    def chance(self) -> bool:
        return self.wild and self.draw(st.integers(0, 9)) == 0

    def ws(self) -> str:
        return self.draw(st.sampled_from([" ", "\t", "\r", "\n", "  "])) if self.chance() else ""

    def string(self, text: str) -> str:
        encoded = json.dumps(text, ensure_ascii=self.chance())
        if self.chance():  # spell one character as a \u escape
            inner = encoded[1:-1]
            if inner and "\\" not in inner:
                at = self.draw(st.integers(0, len(inner) - 1))
                encoded = '"' + inner[:at] + f"\\u{ord(inner[at]):04x}" + inner[at + 1:] + '"'
        if self.chance():
            encoded = encoded[:-1] + self.draw(st.sampled_from(["\\ud800", "\\udc00", "\\ud83d\\ude00"])) + '"'
        return encoded

    def number(self, value: float) -> str:
        if self.chance():
            return self.draw(st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400", "-1e400", "1E+308",
                                              "1e-400", "-0", "1.0", "7" * MAX_INTEGER_DIGITS,
                                              "7" * (MAX_INTEGER_DIGITS + 1), "-" + "7" * MAX_INTEGER_DIGITS,
                                              "9" * 400 + ".5"]))
        return json.dumps(value)

    def value(self, value: Any) -> str:
        if isinstance(value, dict):
            items = list(value.items())
            if items and self.chance():  # a key twice, with this or another value
                key, old = self.draw(st.sampled_from(items))
                items.insert(self.draw(st.integers(0, len(items))), (key, self.draw(st.just(old) | json_values)))
            if self.chance():
                items.append((self.draw(texts), self.draw(json_values)))
            body = ",".join(f"{self.ws()}{self.string(k)}{self.ws()}:{self.ws()}{self.value(v)}{self.ws()}"
                            for k, v in items)
            return "{" + body + "}"
        if isinstance(value, list):
            return "[" + ",".join(self.ws() + self.value(v) + self.ws() for v in value) + "]"
        if isinstance(value, str):
            return self.string(value)
        if isinstance(value, bool) or value is None:
            return json.dumps(value)
        if self.chance() and self.chance():
            return "[" * MAX_NESTING_DEPTH + self.number(value) + "]" * MAX_NESTING_DEPTH
        return self.number(value)


@st.composite
def event_lines(draw: st.DrawFn) -> bytes:
    obj = draw(worker_events())
    line = _Writer(draw, wild=draw(st.booleans())).value(obj).encode("utf-8", "surrogatepass")
    for _ in range(draw(st.integers(0, 2))):  # byte-level damage
        at = draw(st.integers(0, len(line)))
        piece = draw(st.binary(max_size=3) | st.sampled_from([b'"', b":", b'":', b"\\", b",", b"{", b"}", b" "]))
        cut = draw(st.integers(0, 3))
        line = line[:at] + piece + line[at + cut:]
    return line


# --- examples ------------------------------------------------------------------------------------------

_RUNTIME = RuntimeInfo(name="scripted", model="scripted-1", runtime_session_id="scripted-s1")
_HASH = canonical_hash({"path": "a.txt"})
EXAMPLES = [
    (EventType.MODEL_OUTPUT_DELTA, ModelOutputDelta(block_id="t1:b1", delta="Some text: with a colon", index=3)),
    (EventType.TOOL_OUTPUT_DELTA, ToolOutputDelta(tool_call_id="c1", input_hash=_HASH, delta="total 48\n")),
    (EventType.TOOL_CALL_REQUESTED, ToolCallRequested(tool_call_id="c1", input_hash=_HASH, tool_name="workspace.read",
                                                      input={"path": "a.txt", "limit": 2, "opts": {"x": [1.5, None]}})),
    (EventType.TOOL_CALL_COMPLETED, ToolCallCompleted(tool_call_id="c1", input_hash=_HASH, tool_name="bash",
                                                      sandbox=SandboxSummary(kind="subprocess", time_limit_s=2.5),
                                                      policy_snapshot={"mode": "ask"}, duration_ms=3.25)),
    (EventType.USAGE_REPORTED, UsageReported(input_tokens=12, output_tokens=7, cost_usd=0.01)),
    (EventType.TASK_FAILED, TaskFailed(code="RATE_LIMITED", message="429", retryable=True, details={"status": 429})),
]


def line_of(event_type: EventType, payload: BaseModel, raw: Any = None) -> bytes:
    event = WorkerEvent(type=event_type, time=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC), runtime=_RUNTIME,
                        payload=payload, raw=raw)
    return encode_event_notification(RuntimeEventParams(task_id="t1", n=7, event=event)).rstrip(b"\n")


DELTA = line_of(EventType.MODEL_OUTPUT_DELTA, ModelOutputDelta(block_id="b", delta="d"))


def with_raw(raw: bytes) -> bytes:
    """DELTA with ``raw`` written into its event (the line ends with payload, event, params, envelope)."""
    assert DELTA.endswith(b"}}}}")
    return DELTA[:-3] + b',"raw":' + raw + b"}}}"


def models_under(model: type[BaseModel], seen: set[type[BaseModel]]) -> set[type[BaseModel]]:
    if model in seen:
        return seen
    seen.add(model)
    for info in model.model_fields.values():
        for sub in _classes_in(info.annotation):
            models_under(sub, seen)
    return seen


def _classes_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [cls for arg in get_args(annotation) for cls in _classes_in(arg)]
