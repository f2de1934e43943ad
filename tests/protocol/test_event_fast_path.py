"""The supervisor's event fast path (``decode_event_line``) against the general path as its oracle.

The general path is what a line meant before the fast path existed: the strict decoder (``decode_json``), the
envelope check, then ``RuntimeEventParams.model_validate``. The fast path may decline any line (None: the general
path then decides), but a line it accepts must be one the general path accepts, with an equal result. Lines are
rendered by a small JSON writer that can repeat keys, escape key characters, add whitespace, write NaN,
Infinity, overflowing floats and long integers, and the bytes are then mutated at random.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, currently_in_test_context, given, note, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from codesdk.protocol import (
    PAYLOAD_MODELS,
    WORKER_EVENT_MODELS,
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
    decode_event_line,
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


def _check(line: bytes) -> RuntimeEventParams | None:
    if currently_in_test_context():
        note(f"line: {line!r}")
    fast = decode_event_line(line)
    if fast is not None:
        expected = general_path(line)
        assert expected is not None
        if "time" not in fast.event.model_fields_set:  # both took "now" for the missing time
            same_time = expected.event.model_copy(update={"time": fast.event.time})
            expected = expected.model_copy(update={"event": same_time})
        assert expected == fast
    return fast


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


# --- properties ------------------------------------------------------------------------------------


@settings(max_examples=600, deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow])
@given(event_lines())
def test_an_accepted_line_is_one_the_general_path_accepts_with_an_equal_result(line: bytes) -> None:
    _check(line)


@settings(max_examples=150, deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=400))
def test_any_bytes_are_declined_or_agree(line: bytes) -> None:
    _check(line)


@settings(max_examples=200, deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow])
@given(worker_events())
def test_what_a_worker_writes_takes_the_fast_path(obj: dict[str, Any]) -> None:
    """The worker's own compact lines are proven valid unless their text holds one of the few shapes the
    fast path leaves to the general one (NaN-like floats cannot occur: the models refuse them)."""
    expected = general_path(json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode())
    if expected is None:
        return
    line = encode_event_notification(expected).rstrip(b"\n")
    fast = _check(line)
    whitespace_before_a_colon = re.search(rb"[ \t\r]:", line) is not None
    a_string_starting_with_a_colon = re.search(rb'[,:\[{]":', line) is not None  # it adds one to the key bound
    assert fast is not None or whitespace_before_a_colon or a_string_starting_with_a_colon, line
    if fast is not None:
        assert fast == expected


# --- examples --------------------------------------------------------------------------------------

_RUNTIME = RuntimeInfo(name="scripted", model="scripted-1", runtime_session_id="scripted-s1")
_HASH = canonical_hash({"path": "a.txt"})
_EXAMPLES = [
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


def _line(event_type: EventType, payload: BaseModel, raw: Any = None) -> bytes:
    event = WorkerEvent(type=event_type, time=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC), runtime=_RUNTIME,
                        payload=payload, raw=raw)
    return encode_event_notification(RuntimeEventParams(task_id="t1", n=7, event=event)).rstrip(b"\n")


@pytest.mark.parametrize(("event_type", "payload"), _EXAMPLES, ids=[t.value for t, _ in _EXAMPLES])
def test_typical_events_take_the_fast_path_with_their_class(event_type: EventType, payload: BaseModel) -> None:
    line = _line(event_type, payload, raw={"id": "msg_1", "content": [{"type": "text", "text": "hi"}]})
    params = _check(line)
    assert params is not None and type(params.event) is WORKER_EVENT_MODELS[event_type]
    assert params.event.payload == payload


_DELTA = _line(EventType.MODEL_OUTPUT_DELTA, ModelOutputDelta(block_id="b", delta="d"))


def _with_raw(raw: bytes) -> bytes:
    """_DELTA with ``raw`` written into its event (the line ends with payload, event, params, envelope)."""
    assert _DELTA.endswith(b"}}}}")
    return _DELTA[:-3] + b',"raw":' + raw + b"}}}"


@pytest.mark.parametrize("line", [
    _DELTA.replace(b'"delta":"d"', b'"delta":"d","delta":"e"'),  # a duplicate in a payload
    _DELTA.replace(b'"n":7', b'"n":7,"n":7'),  # ... with the same value
    _DELTA.replace(b'"delta":"d"', b'"delta":"d","\\u0064elta":"e"'),  # ... spelt with an escape
    _DELTA.replace(b'"jsonrpc":"2.0"', b'"jsonrpc":"2.0","jsonrpc":"2.0"'),  # in the envelope
    _DELTA.replace(b'"delta":"d"', b'"delta":"d" ,"delta" :"e"'),  # behind whitespace
    _with_raw(b'{"a":{"k":1,"k":2}}'),  # in free-form JSON
    _with_raw(b'[{"k":1,"k":1}]'),
    _with_raw(b"NaN"),  # not JSON numbers
    _with_raw(b"[1,-Infinity]"),
    _with_raw(b'{"x":1e400}'),
    _line(EventType.USAGE_REPORTED, UsageReported(cost_usd=1.0)).replace(b'"cost_usd":1.0', b'"cost_usd":1e999'),
    _line(EventType.USAGE_REPORTED, UsageReported(cost_usd=1.0)).replace(b'"cost_usd":1.0', b'"cost_usd":NaN'),
    _with_raw(b"7" * (MAX_INTEGER_DIGITS + 1)),  # too many digits
    _with_raw(b"[" * MAX_NESTING_DEPTH + b"]" * MAX_NESTING_DEPTH),  # too deep
    _DELTA.replace(b'"delta":"d"', b'"delta":"\\ud800"'),  # a lone surrogate
    b"\xef\xbb\xbf" + _DELTA,  # a byte-order mark
    _DELTA + b" x",  # trailing garbage
])
def test_what_the_strict_decoder_refuses_never_takes_the_fast_path(line: bytes) -> None:
    assert decode_event_line(line) is None


def test_duplicate_counting_sees_through_escaped_quotes_and_backslashes() -> None:
    tricky = ModelOutputDelta(block_id="b", delta='say \\":" and \\\\": {"k": 1}')
    params = _check(_line(EventType.MODEL_OUTPUT_DELTA, tricky, raw={"q\\": '\\"', 'a"': ":x"}))
    assert params is None or params.event.payload == tricky  # declined (a string starts with ":") or equal
    assert _check(_line(EventType.MODEL_OUTPUT_DELTA, tricky, raw={"q\\": '\\"'})) is not None


def test_the_parser_refuses_integers_beyond_the_protocol_digit_limit_whatever_the_interpreter_allows() -> None:
    """decode_event_line leans on pydantic-core refusing integers over MAX_INTEGER_DIGITS digits by itself."""
    import sys

    def with_raw(digits: int) -> bytes:
        return _with_raw(b"-" + b"7" * digits)

    saved = sys.get_int_max_str_digits()
    try:
        sys.set_int_max_str_digits(0)
        assert decode_event_line(with_raw(MAX_INTEGER_DIGITS + 1)) is None
        accepted = decode_event_line(with_raw(MAX_INTEGER_DIGITS))
    finally:
        sys.set_int_max_str_digits(saved)
    assert accepted is not None and accepted == general_path(with_raw(MAX_INTEGER_DIGITS))


def _models_under(model: type[BaseModel], seen: set[type[BaseModel]]) -> set[type[BaseModel]]:
    if model in seen:
        return seen
    seen.add(model)
    for info in model.model_fields.values():
        for sub in _classes_in(info.annotation):
            _models_under(sub, seen)
    return seen


def _classes_in(annotation: Any) -> list[type[BaseModel]]:
    from typing import get_args

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [cls for arg in get_args(annotation) for cls in _classes_in(arg)]


def test_the_key_count_rests_on_models_that_map_keys_to_fields_one_to_one() -> None:
    """The duplicate-key proof counts a model's keys as its ``fields_set``. That holds while every model a worker
    event is validated into forbids extra keys, has no aliases and no model validator that could add or drop
    keys; a change that breaks it fails here, not silently in the proof."""
    models = _models_under(RuntimeEventParams, set())
    assert set(WORKER_EVENT_MODELS.values()) <= models
    for model in models:
        assert model.model_config.get("extra") == "forbid", model
        assert not model.__pydantic_decorators__.model_validators, model
        for name, info in model.model_fields.items():
            assert info.alias in (None, name) and info.validation_alias in (None, name), (model, name)


def test_large_finite_floats_take_the_fast_path() -> None:
    line = _line(EventType.USAGE_REPORTED, UsageReported(cost_usd=1.0)).replace(b'"cost_usd":1.0', b'"cost_usd":1e308')
    assert _check(line) is not None
    assert _check(_with_raw(b"[1.5e308,-2.5e-300]")) is not None
