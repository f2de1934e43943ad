"""Frames, sans-IO: every trap is a value, never an exception, and no bad line costs a good one.

The framer and decoder are shared by the supervisor (reading workers) and the worker (reading the
supervisor), so totality here is what keeps either process alive whatever its peer writes.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import pairwise
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from codesdk.protocol import (
    BadFrame,
    ErrorCode,
    ErrorResponse,
    FrameProblem,
    JsonRpcMessage,
    LineFramer,
    MessageReader,
    Method,
    Notification,
    Request,
    Response,
    RuntimeEventParams,
    decode_json,
    decode_message,
    encode_message,
)
from codesdk.protocol._framing import MAX_INTEGER_DIGITS, MAX_NESTING_DEPTH
from tests.reliability.hostile_traps import TRAPS, VALID_STOP, Trap

Item = JsonRpcMessage | BadFrame


def _event(n: int, delta: str = "x") -> Notification:
    params = {"task_id": "t1", "n": n, "event": {"type": "model.output.delta", "time": "2026-01-01T00:00:00Z",
                                                  "runtime": {"name": "scripted"},
                                                  "payload": {"block_id": "t1:b1", "delta": delta, "index": n - 1}}}
    return Notification(method=Method.EVENT, params=params)


def _feed_all(reader: MessageReader, pieces: list[bytes]) -> list[Item]:
    out: list[Item] = []
    for piece in pieces:
        out += reader.feed(piece)
    return out + reader.close()


def _normalized(items: list[Item]) -> list[Any]:
    """Items comparable across chunkings: an over-long line's ``size`` is how much had arrived when it was cut."""
    return [(i.problem, i.detail, i.id) if isinstance(i, BadFrame) else i for i in items]


def _cut(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in pairwise(points)]


# -- the traps, one by one ---------------------------------------------------------------------------


@pytest.mark.parametrize("trap", TRAPS, ids=str)
def test_each_trap_decodes_to_a_bad_frame_with_its_json_rpc_code(trap: Trap) -> None:
    result = decode_message(trap.line)
    assert isinstance(result, BadFrame), result
    assert (result.problem, result.error_code) == (trap.problem, trap.code), result.detail
    # The id is kept exactly when the line is a JSON object with a readable one (the answer carries it).
    assert result.id == ("r7" if trap.echoes_id else None), result


@pytest.mark.parametrize("trap", TRAPS, ids=str)
def test_each_trap_costs_only_its_own_line(trap: Trap) -> None:
    """Valid frames on both sides of a trap come through, whatever the chunking."""
    stream = encode_message(_event(1)) + trap.line + b"\n" + encode_message(_event(2))
    whole = _feed_all(MessageReader(), [stream])
    bytewise = _feed_all(MessageReader(), [stream[i:i + 1] for i in range(len(stream))])
    assert whole[0] == _event(1) and whole[2] == _event(2)
    assert isinstance(whole[1], BadFrame) and whole[1].problem == trap.problem
    assert _normalized(bytewise) == _normalized(whole)


def test_a_trap_at_the_end_of_the_stream_without_newline_is_still_a_bad_frame() -> None:
    for trap in TRAPS:
        reader = MessageReader()
        assert reader.feed(trap.line) == []
        [result] = reader.close()
        assert isinstance(result, BadFrame) and result.problem == trap.problem, trap.name


# -- nesting, integers, ids: limits that do not depend on the interpreter ----------------------------


def _nested_event(depth_of_raw: int) -> bytes:
    raw = "[" * depth_of_raw + "]" * depth_of_raw
    return (b'{"jsonrpc":"2.0","method":"runtime.event","params":{"task_id":"t1","n":1,"event":{"type":'
            b'"model.output.delta","runtime":{"name":"x"},"payload":{"block_id":"b","delta":"x","index":0},"raw":'
            + raw.encode() + b"}}}")


def test_the_deepest_accepted_message_still_serializes_through_the_models() -> None:
    """The nesting limit exists so that whatever decodes can be stored: pydantic can't serialize ~255 levels."""
    envelope = 3  # message object, params, event
    line = _nested_event(MAX_NESTING_DEPTH - envelope)
    message = decode_message(line)
    assert isinstance(message, Notification)
    assert isinstance(message.params, dict)
    params = RuntimeEventParams.model_validate(message.params)
    event = message.params["event"]
    assert isinstance(event, dict)
    assert params.to_json_obj()["event"]["raw"] == event["raw"]
    too_deep = decode_message(_nested_event(MAX_NESTING_DEPTH - envelope + 1))
    assert isinstance(too_deep, BadFrame) and "nesting too deep" in too_deep.detail


@contextmanager
def _recursion_headroom(frames_left: int) -> Iterator[None]:
    """Run as if called from deep inside a busy stack: only ``frames_left`` frames to spare."""
    depth = len(inspect.stack(0))
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(depth + frames_left)
    try:
        yield
    finally:
        sys.setrecursionlimit(old)


@pytest.mark.parametrize("depth", [MAX_NESTING_DEPTH + 1, 900, 990, 5_000, 100_000])
def test_deep_nesting_is_refused_the_same_way_whatever_the_stack_depth(depth: int) -> None:
    line = b"[" * depth + b"]" * depth
    for headroom in (None, 400):
        if headroom is None:
            result = decode_json(line)
        else:
            with _recursion_headroom(headroom):
                result = decode_json(line)
        assert isinstance(result, BadFrame), (depth, headroom)
        assert result.problem == FrameProblem.INVALID_JSON and "nesting too deep" in result.detail


def test_lone_surrogates_are_found_at_any_depth_without_recursion() -> None:
    """Used to raise RecursionError (the surrogate check recursed): one line could kill the worker."""
    for depth in (1, MAX_NESTING_DEPTH - 1, 900):
        line = b'{"k":' + b"[" * depth + b'"\\udc00"' + b"]" * depth + b"}"
        with _recursion_headroom(250):
            result = decode_json(line)
        assert isinstance(result, BadFrame) and result.problem == FrameProblem.INVALID_JSON, depth


def test_integer_digit_limit_holds_even_when_the_interpreter_lifts_its_own() -> None:
    old = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)  # what PYTHONINTMAXSTRDIGITS=0 does in a peer's environment
    try:
        assert decode_json(b"7" * MAX_INTEGER_DIGITS) == int("7" * MAX_INTEGER_DIGITS)
        refused = decode_json(b"[" + b"7" * (MAX_INTEGER_DIGITS + 1) + b"]")
    finally:
        sys.set_int_max_str_digits(old)
    assert isinstance(refused, BadFrame) and "exceeds the limit" in refused.detail


def test_a_boolean_id_cannot_pose_as_request_one() -> None:
    """pydantic reads ``true`` as 1: a response with ``"id": true`` would answer the driver's first request."""
    result = decode_message(b'{"jsonrpc":"2.0","id":true,"result":{"ok":true}}')
    assert isinstance(result, BadFrame) and result.error_code == ErrorCode.INVALID_REQUEST
    assert decode_message(b'{"jsonrpc":"2.0","id":1,"result":{"ok":true}}') == Response(id=1, result={"ok": True})


# -- splits, chunks, over-long lines, torn frames -----------------------------------------------------


def test_a_frame_split_at_every_byte_position_decodes_the_same() -> None:
    stream = b"".join(encode_message(m) for m in (_event(1, "héllo ✓"), Request(id=7, method="m"), _event(2)))
    expected = [_event(1, "héllo ✓"), Request(id=7, method="m"), _event(2)]
    for cut in range(len(stream) + 1):
        assert _feed_all(MessageReader(), [stream[:cut], stream[cut:]]) == expected, cut
    assert _feed_all(MessageReader(), [stream[i:i + 1] for i in range(len(stream))]) == expected


def test_many_frames_in_one_chunk_come_out_in_order() -> None:
    events = [_event(n) for n in range(1, 2001)]
    reader = MessageReader()
    assert reader.feed(b"".join(encode_message(e) for e in events)) == events
    assert reader.close() == []


def test_oversized_line_with_newline_is_reported_once_and_the_next_line_is_read() -> None:
    reader = MessageReader(max_frame_bytes=256)
    stream = encode_message(_event(1)) + b'{"pad":"' + b"x" * 10_000 + b'"}\n' + encode_message(_event(2))
    items = _feed_all(reader, _cut(stream, [100, 300, 301, 5000, 10_100]))
    assert items[0] == _event(1) and items[2] == _event(2) and len(items) == 3
    assert isinstance(items[1], BadFrame) and items[1].error_code == ErrorCode.FRAME_TOO_LARGE


def test_oversized_line_without_newline_is_reported_before_it_ends_and_at_eof_nothing_more() -> None:
    framer = LineFramer(max_frame_bytes=256)
    assert framer.feed(b"y" * 256) == []  # exactly the limit: still a candidate frame
    [too_large] = framer.feed(b"y")
    assert isinstance(too_large, BadFrame) and too_large.problem == FrameProblem.TOO_LARGE
    for _ in range(100):
        assert framer.feed(b"y" * 1000) == [] and framer.buffered == 0  # memory stays bounded
    assert framer.close() == []  # the same line is not reported twice at EOF


def test_a_valid_frame_before_an_oversized_one_in_the_same_chunk_is_kept() -> None:
    reader = MessageReader(max_frame_bytes=256)
    items = reader.feed(encode_message(_event(1)) + b"z" * 1000)
    assert items[0] == _event(1)
    assert isinstance(items[1], BadFrame) and items[1].problem == FrameProblem.TOO_LARGE
    assert reader.feed(b"zzz\n" + encode_message(_event(2))) == [_event(2)]


def test_a_torn_frame_at_eof_is_one_bad_frame_and_everything_before_it_survives() -> None:
    whole = encode_message(_event(2))
    for cut in range(1, len(whole) - 1):  # every way a killed writer can tear a line (short of its newline)
        reader = MessageReader()
        assert reader.feed(encode_message(_event(1)) + whole[:cut]) == [_event(1)]
        [torn] = reader.close()
        assert isinstance(torn, BadFrame), cut


# -- properties --------------------------------------------------------------------------------------

_garbage_line = st.one_of(
    st.binary(max_size=80).map(lambda b: b.replace(b"\n", b"")),
    st.sampled_from([t.line for t in TRAPS if len(t.line) < 2000]),
    st.builds(lambda a, b: VALID_STOP[:a] + b + VALID_STOP[a:], st.integers(0, len(VALID_STOP)),
              st.binary(min_size=1, max_size=4).map(lambda b: b.replace(b"\n", b""))),
)
_line = st.one_of(st.integers(1, 10_000).map(lambda n: encode_message(_event(n))), _garbage_line.map(lambda b: b + b"\n"))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=400), st.lists(st.integers(0, 500), max_size=12), st.sampled_from([16, 64, 8 * 1024 * 1024]))
def test_any_bytes_in_any_split_give_only_messages_or_bad_frames(data: bytes, cuts: list[int], limit: int) -> None:
    """Totality: no byte string makes the reader raise, and chunking never changes what it reads."""
    items = _feed_all(MessageReader(limit), _cut(data, cuts))
    assert all(isinstance(i, (BadFrame, Request, Notification, Response, ErrorResponse)) for i in items)
    assert _normalized(items) == _normalized(_feed_all(MessageReader(limit), [data]))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_line, min_size=1, max_size=12), st.lists(st.integers(0, 5000), max_size=12))
def test_lines_are_independent_no_bad_line_corrupts_a_neighbour(lines: list[bytes], cuts: list[int]) -> None:
    """A stream reads exactly as its lines read one by one: garbage costs only its own line."""
    expected: list[Item] = []
    for line in lines:
        expected += _feed_all(MessageReader(1024), [line])
    assert _normalized(_feed_all(MessageReader(1024), _cut(b"".join(lines), cuts))) == _normalized(expected)


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 3000), st.sampled_from([b"1", b'"\\udc00"', b'"\\ud83d\\ude00"', b"NaN", b"{}", b'{"a":1,"a":1}']),
       st.sampled_from([b"[", b'{"k":']))
def test_decode_json_is_total_for_any_nesting(depth: int, leaf: bytes, opener: bytes) -> None:
    closer = b"]" if opener == b"[" else b"}"
    result = decode_json(opener * depth + leaf + closer * depth)
    if not isinstance(result, BadFrame):
        assert depth <= MAX_NESTING_DEPTH
