"""The compiled decoder (``decode_event_fast``, msgspec) against the general path as its oracle.

Every test of the former pydantic fast path is kept here, on its line generator (``tests/protocol/event_lines``):
a line the compiled decoder accepts must be one the general path accepts,
with an equal model, and the bytes it hands on (``event_json``, ``payload_json``, ``runtime_json``) must be the
bytes pydantic serializes from that model. Plus: the Struct generator mirrors the models or refuses them.
"""

from __future__ import annotations

import json
import pickle
import re
import sys
from datetime import UTC, datetime
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, currently_in_test_context, given, note, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field, field_validator, model_validator

from codesdk.protocol import (
    FAST_EVENT_TYPES,
    SLOW_EVENT_TYPES,
    WORKER_EVENT_MODELS,
    WORKER_EVENT_TYPES,
    EventType,
    ModelOutputDelta,
    RuntimeEventParams,
    RuntimeInfo,
    Unmirrorable,
    UsageReported,
    WireEvent,
    WorkerEvent,
    decode_event_fast,
    encode_event_notification,
)
from codesdk.protocol._base import Model
from codesdk.protocol._framing import MAX_INTEGER_DIGITS, MAX_NESTING_DEPTH
from codesdk.protocol._wire import FLOAT_LIMIT, struct_for
from tests.protocol.event_lines import (
    DELTA,
    EXAMPLES,
    event_lines,
    general_path,
    line_of,
    models_under,
    with_raw,
    worker_events,
)


def _pydantic_json(model: BaseModel) -> bytes:
    return model.__pydantic_serializer__.to_json(model, exclude_none=True)


def _assert_same(wire: WireEvent, expected: RuntimeEventParams) -> None:
    """``wire`` carries exactly what the general path's model says, as the bytes pydantic writes."""
    event = expected.event
    assert wire.model() == expected
    assert wire.event_json == _pydantic_json(event)
    assert wire.payload_json == _pydantic_json(event.payload)
    assert wire.runtime_json == _pydantic_json(event.runtime)
    assert (wire.task_id, wire.n, wire.type) == (expected.task_id, expected.n, event.type)
    assert (wire.runtime_name, wire.runtime_model, wire.runtime_session_id) == (
        event.runtime.name, event.runtime.model, event.runtime.runtime_session_id)
    assert wire.tool_call_id == getattr(event.payload, "tool_call_id", None)
    assert wire.has_raw == (event.raw is not None)
    assert datetime.fromisoformat(wire.time) == event.time


def _check(line: bytes) -> WireEvent | None:
    if currently_in_test_context():
        note(f"line: {line!r}")
    fast = decode_event_fast(line)
    if fast is not None:
        expected = general_path(line)
        assert expected is not None
        _assert_same(fast, expected)
        general = WireEvent.from_params(expected)  # the general path yields the same type, the same bytes
        assert general.struct is None and general.model() is expected
        assert (general.event_json, general.payload_json, general.runtime_json, general.time) == (
            fast.event_json, fast.payload_json, fast.runtime_json, fast.time)
    return fast


# --- properties ------------------------------------------------------------------------------------


@settings(max_examples=600, deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow])
@given(event_lines())
def test_an_accepted_line_is_one_the_general_path_accepts_with_equal_bytes(line: bytes) -> None:
    _check(line)


@settings(max_examples=150, deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=400))
def test_any_bytes_are_declined_or_agree(line: bytes) -> None:
    _check(line)


@settings(max_examples=300, deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow])
@given(worker_events())
def test_what_a_worker_writes_takes_the_fast_path(obj: dict[str, Any]) -> None:
    """The worker's own compact lines are proven valid unless their text holds one of the few shapes left to the
    general path: a slow event type, whitespace or a string start before a colon, a float beyond ±1e16."""
    expected = general_path(json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode())
    if expected is None:
        return
    line = encode_event_notification(expected).rstrip(b"\n")
    fast = _check(line)
    if fast is None:
        slow_type = expected.event.type not in FAST_EVENT_TYPES
        whitespace_before_a_colon = re.search(rb"[ \t\r]:", line) is not None
        a_string_starting_with_a_colon = re.search(rb'[,:\[{]":', line) is not None  # adds one to the key bound
        a_large_float = re.search(rb"[0-9]e\+", line) is not None
        assert slow_type or whitespace_before_a_colon or a_string_starting_with_a_colon or a_large_float, line
    else:
        assert fast.model() == expected


_PIECES = [b'"', b":", b'":', b"\\", b",", b"{", b"}", b" ", b'"n":1,', b'"index":1,', b'"raw":null,', b"e+1",
           b"1e999", b"\\u0064", b"-", b"0"]


@st.composite
def damaged_worker_lines(draw: st.DrawFn) -> bytes:
    """A line as the worker writes it (``encode_event`` of a valid event), then damaged: a key repeated, a piece
    inserted, bytes cut or replaced — lines next to valid ones, where a wrong proof would show."""
    expected = general_path(json.dumps(draw(worker_events()), separators=(",", ":"), ensure_ascii=False).encode())
    if expected is None:
        return b""
    line = encode_event_notification(expected).rstrip(b"\n")
    for _ in range(draw(st.integers(1, 2))):
        keys = [m.start() for m in re.finditer(rb'[{,]"[a-z_]+":', line)]
        if draw(st.booleans()) and keys:  # repeat one "key":value pair (or a prefix of it) somewhere else
            start = draw(st.sampled_from(keys)) + 1
            end = min(len(line), start + draw(st.integers(4, 40)))
            at = draw(st.sampled_from(keys)) + 1
            line = line[:at] + line[start:end] + b"," + line[at:]
        else:
            at = draw(st.integers(0, len(line)))
            piece = draw(st.binary(max_size=2) | st.sampled_from(_PIECES))
            line = line[:at] + piece + line[at + draw(st.integers(0, 2)):]
    return line


@settings(max_examples=800, deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow])
@given(damaged_worker_lines())
def test_a_damaged_worker_line_is_declined_or_agrees(line: bytes) -> None:
    _check(line)


@settings(max_examples=300, deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.floats(allow_nan=False, allow_infinity=False), st.integers(-(2**70), 2**70))
def test_numbers_in_free_form_json_come_out_as_pydantic_writes_them(number: float, integer: int) -> None:
    line = with_raw(json.dumps({"f": number, "i": integer, "l": [number, -number]}).encode().replace(b" ", b""))
    fast = _check(line)
    assert (fast is not None) == (abs(number) < FLOAT_LIMIT)


# --- examples --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("event_type", "payload"), EXAMPLES, ids=[t.value for t, _ in EXAMPLES])
def test_typical_events_take_the_fast_path_unless_their_type_is_slow(event_type: EventType,
                                                                      payload: BaseModel) -> None:
    line = line_of(event_type, payload, raw={"id": "msg_1", "content": [{"type": "text", "text": "hi"}]})
    wire = _check(line)
    if event_type in SLOW_EVENT_TYPES:
        assert wire is None
        return
    assert wire is not None and wire.has_raw and wire.type is event_type
    params = wire.model()
    assert type(params.event) is WORKER_EVENT_MODELS[event_type] and params.event.payload == payload


@pytest.mark.parametrize("line", [
    DELTA.replace(b'"delta":"d"', b'"delta":"d","delta":"e"'),  # a duplicate in a payload
    DELTA.replace(b'"n":7', b'"n":7,"n":7'),  # ... with the same value
    DELTA.replace(b'"delta":"d"', b'"delta":"d","\\u0064elta":"e"'),  # ... spelt with an escape
    DELTA.replace(b'"jsonrpc":"2.0"', b'"jsonrpc":"2.0","jsonrpc":"2.0"'),  # in the envelope
    DELTA.replace(b'"delta":"d"', b'"delta":"d" ,"delta" :"e"'),  # behind whitespace
    DELTA.replace(b'"type":"model.output.delta"', b'"type":"model.output.delta","type":"model.output.delta"'),
    with_raw(b'{"a":{"k":1,"k":2}}'),  # in free-form JSON
    with_raw(b'[{"k":1,"k":1}]'),
    with_raw(b"NaN"),  # not JSON numbers
    with_raw(b"[1,-Infinity]"),
    with_raw(b'{"x":1e400}'),
    line_of(EventType.USAGE_REPORTED, UsageReported(cost_usd=1.0)).replace(b'"cost_usd":1.0', b'"cost_usd":1e999'),
    line_of(EventType.USAGE_REPORTED, UsageReported(cost_usd=1.0)).replace(b'"cost_usd":1.0', b'"cost_usd":NaN'),
    with_raw(b"7" * (MAX_INTEGER_DIGITS + 1)),  # too many digits
    with_raw(b"[" * MAX_NESTING_DEPTH + b"]" * MAX_NESTING_DEPTH),  # too deep
    DELTA.replace(b'"delta":"d"', b'"delta":"\\ud800"'),  # a lone surrogate
    DELTA.replace(b'"delta":"d"', b'"delta":"\xff"'),  # not UTF-8
    b"\xef\xbb\xbf" + DELTA,  # a byte-order mark
    DELTA + b" x",  # trailing garbage
    DELTA.replace(b'"n":7', b'"n":0'),  # an ordinal below 1
    DELTA.replace(b'"n":7', b'"n":"7"'),  # coercions pydantic allows: left to the general path
    DELTA.replace(b'"n":7', b'"n":true'),
    DELTA.replace(b'"n":7', b'"n":7.0'),
    DELTA.replace(b'"index":0', b'"index":-1'),
    DELTA.replace(b',"index":0', b""),  # a default left out: the re-encoded event would differ
    DELTA.replace(b'05Z"', b'05"'),  # a naive time
    DELTA.replace(b'05Z"', b'05+02:00"'),  # another offset: the general path normalizes it
    DELTA.replace(b'05Z"', b'05.000000Z"'),  # a spelling pydantic does not write
    DELTA.replace(b'2026-01-02', b"2026-02-30"),  # not a date
    DELTA.replace(b'"delta":"d"', b'"delta":"d","extra":1'),  # an unknown field
    DELTA.replace(b"model.output.delta", b"session.created"),  # a supervisor-only type
    DELTA.replace(b'"name":"scripted"', b'"name":null'),
    with_raw(b"null"),  # an explicit null raw: pydantic drops it
    line_of(EventType.USAGE_REPORTED, UsageReported(cost_usd=1.0)).replace(b'"cost_usd":1.0', b'"cost_usd":null'),
])
def test_what_the_strict_decoder_refuses_or_the_mirror_cannot_prove_never_takes_the_fast_path(line: bytes) -> None:
    assert decode_event_fast(line) is None
    _check(line)


def test_the_refusal_list_lines_start_from_one_the_fast_path_takes() -> None:
    assert _check(DELTA) is not None
    assert _check(with_raw(b'{"a":{"k":1,"j":2}}')) is not None
    assert _check(with_raw(b"[" * 150 + b"]" * 150)) is not None  # deep, within the limit


def test_duplicate_counting_sees_through_escaped_quotes_and_backslashes() -> None:
    tricky = ModelOutputDelta(block_id="b", delta='say \\":" and \\\\": {"k": 1}')
    wire = _check(line_of(EventType.MODEL_OUTPUT_DELTA, tricky, raw={"q\\": '\\"', 'a"': ":x"}))
    assert wire is None or wire.model().event.payload == tricky  # declined (a string starts with ":") or equal
    assert _check(line_of(EventType.MODEL_OUTPUT_DELTA, tricky, raw={"q\\": '\\"'})) is not None


def test_the_parser_refuses_integers_beyond_the_protocol_digit_limit_whatever_the_interpreter_allows() -> None:
    """msgspec refuses integers over MAX_INTEGER_DIGITS digits by itself, at any interpreter setting (its own
    cap is one digit lower: a 4300-digit integer is declined, and the general path takes it)."""
    def with_digits(digits: int) -> bytes:
        return with_raw(b"-" + b"7" * digits)

    saved = sys.get_int_max_str_digits()
    try:
        sys.set_int_max_str_digits(0)
        assert decode_event_fast(with_digits(MAX_INTEGER_DIGITS + 1)) is None
        assert decode_event_fast(with_digits(MAX_INTEGER_DIGITS)) is None
        accepted = decode_event_fast(with_digits(MAX_INTEGER_DIGITS - 1))
    finally:
        sys.set_int_max_str_digits(saved)
    assert general_path(with_digits(MAX_INTEGER_DIGITS)) is not None
    assert accepted is not None and accepted.model() == general_path(with_digits(MAX_INTEGER_DIGITS - 1))


def test_a_recursion_error_is_declined_not_raised() -> None:
    deep = with_raw(b"[" * 180 + b"]" * 180)
    limit = sys.getrecursionlimit()

    def nested(depth: int) -> WireEvent | None:
        return nested(depth - 1) if depth else decode_event_fast(deep)

    sys.setrecursionlimit(200)
    try:  # msgspec recurses through the interpreter's limit: near it, the decode raises RecursionError
        outcome = nested(150)
    finally:
        sys.setrecursionlimit(limit)
    assert outcome is None or outcome.model() == general_path(deep)


def test_floats_within_the_range_take_the_fast_path_and_beyond_it_the_general_one() -> None:
    def usage(cost: bytes) -> bytes:
        return line_of(EventType.USAGE_REPORTED, UsageReported(cost_usd=1.0)).replace(b'"cost_usd":1.0',
                                                                                   b'"cost_usd":' + cost)

    assert _check(usage(b"9999999999999998.0")) is not None
    assert _check(with_raw(b"[1.5e15,-2.5e-300]")) is not None
    for beyond in (usage(b"1e308"), with_raw(b"[1.5e308]"), with_raw(b"[-1e16]")):
        assert decode_event_fast(beyond) is None and general_path(beyond) is not None


# --- the generator ---------------------------------------------------------------------------------


def test_every_worker_event_type_is_fast_but_those_the_generator_refused() -> None:
    """Which types take the compiled decoder: all but task.failed, whose ``code`` has a validator (the member
    of TaskFailureCode, else the runtime's own string) that a Struct cannot mirror, and question.requested (rare:
    a schema whose camelCase keys are read too)."""
    assert FAST_EVENT_TYPES | SLOW_EVENT_TYPES.keys() == WORKER_EVENT_TYPES
    assert not FAST_EVENT_TYPES & SLOW_EVENT_TYPES.keys()
    assert set(SLOW_EVENT_TYPES) == {EventType.TASK_FAILED, EventType.QUESTION_REQUESTED}
    assert "field validator" in SLOW_EVENT_TYPES[EventType.TASK_FAILED]


def test_the_structs_mirror_the_models_field_by_field() -> None:
    """Same fields in the same order; forbid unknown fields; UNSET where the model defaults to None (absent
    stays absent, as exclude_none writes it); required where the model has another default (the worker writes
    it, so the re-encoded event carries the keys the line carried)."""
    models = [m for m in models_under(RuntimeEventParams, set())
              if m is not RuntimeEventParams and not issubclass(m, WorkerEvent)]
    mirrored = 0
    for model in models:
        try:
            struct = struct_for(model)
        except Unmirrorable:
            continue
        mirrored += 1
        info = msgspec.structs.fields(struct)
        assert [f.name for f in info] == list(model.model_fields), model
        assert struct.__struct_config__.forbid_unknown_fields and struct.__struct_config__.frozen, model
        for field in info:
            default = model.model_fields[field.name]
            if default.is_required() or default.default_factory is not None or default.default is not None:
                assert field.required, (model, field.name)
            else:
                assert field.default is msgspec.UNSET, (model, field.name)
    assert mirrored >= 12


def test_the_generator_refuses_what_it_cannot_mirror_exactly() -> None:
    class WithAlias(Model):
        x: str = Field(alias="y")

    class WithModelValidator(Model):
        x: str

        @model_validator(mode="after")
        def _check(self) -> WithModelValidator:
            return self

    class WithFieldValidator(Model):
        x: str

        @field_validator("x")
        @classmethod
        def _strip(cls, value: str) -> str:
            return value.strip()

    class WithPattern(Model):
        x: str = Field(pattern="^a")

    class WithUnion(Model):
        x: int | str

    class WithDatetime(Model):
        x: datetime

    class WithBoundedFloat(Model):
        x: float = Field(le=3)

    class Nested(Model):
        inner: WithAlias

    cases: list[tuple[type[BaseModel], str]] = [
                         (WithAlias, "alias"), (WithModelValidator, "model validator"),
                          (WithFieldValidator, "field validator"), (WithPattern, "constraint"),
                          (WithUnion, "union"), (WithDatetime, "datetime"), (WithBoundedFloat, "upper bound"),
                          (Nested, "alias")]
    for model, reason in cases:
        with pytest.raises(Unmirrorable, match=reason):
            struct_for(model)


def test_the_general_path_yields_the_same_type() -> None:
    event = WorkerEvent(type=EventType.MODEL_OUTPUT_DELTA, time=datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC),
                        runtime=RuntimeInfo(name="r", runtime_session_id="s"),
                        payload=ModelOutputDelta(block_id="b", delta="d"), raw=[1])
    params = RuntimeEventParams(task_id="t", n=3, event=event)
    general = WireEvent.from_params(params)
    fast = decode_event_fast(encode_event_notification(params).rstrip(b"\n"))
    assert fast is not None and fast.struct is not None
    for wire in (general, fast):
        assert (wire.task_id, wire.n, wire.type, wire.time, wire.runtime_name, wire.runtime_model,
                wire.runtime_session_id, wire.tool_call_id, wire.has_raw) == (
            "t", 3, EventType.MODEL_OUTPUT_DELTA, "2026-01-02T03:04:05.000006Z", "r", None, "s", None, True)
        assert wire.event_json == _pydantic_json(event) and wire.model() == params
    with pytest.raises(AttributeError):
        fast.n = 4  # type: ignore[misc]


@pytest.mark.parametrize(("event_type", "payload"), EXAMPLES, ids=[t.value for t, _ in EXAMPLES])
def test_from_params_reads_every_field_from_the_model(event_type: EventType, payload: BaseModel) -> None:
    line = line_of(event_type, payload)
    params = general_path(line)
    assert params is not None
    general = WireEvent.from_params(params)
    _assert_same(general, params)
    assert general.time == "2026-01-02T03:04:05Z"
    fast = decode_event_fast(line)
    assert fast is None or (fast == general and hash(fast) == hash(general))
    assert pickle.loads(pickle.dumps(general)) == general
    if fast is not None:
        assert pickle.loads(pickle.dumps(fast)) == fast
