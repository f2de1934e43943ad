"""Line framer and total decoder: examples and properties."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from codesdk.protocol import (
    BadFrame,
    ErrorCode,
    FrameProblem,
    JsonRpcMessage,
    LineFramer,
    MessageReader,
    Notification,
    Request,
    decode_json,
    decode_message,
    encode_message,
)

json_scalars = st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1) | st.text(max_size=20) | \
    st.floats(allow_nan=False, allow_infinity=False)
json_values = st.recursive(json_scalars, lambda kids: st.lists(kids, max_size=4) |
                           st.dictionaries(st.text(max_size=8), kids, max_size=4), max_leaves=12)
requests = st.builds(
    lambda i, m, p: Request(id=i, method=m, params=p),
    st.integers(0, 2**31) | st.text(min_size=1, max_size=8),
    st.text(min_size=1, max_size=20),
    st.dictionaries(st.text(max_size=8), json_values, max_size=4),
)
notifications = st.builds(lambda m, p: Notification(method=m, params=p), st.text(min_size=1, max_size=20),
                          st.dictionaries(st.text(max_size=8), json_values, max_size=4))


def _splits(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    pieces, last = [], 0
    for point in points:
        pieces.append(data[last:point])
        last = point
    pieces.append(data[last:])
    return pieces


@settings(max_examples=200)
@given(st.lists(requests | notifications, min_size=1, max_size=8), st.lists(st.integers(0, 10_000), max_size=20))
def test_any_split_of_a_stream_yields_the_same_messages(messages: list[Request | Notification],
                                                        cuts: list[int]) -> None:
    stream = b"".join(encode_message(m) for m in messages)
    reader = MessageReader()
    decoded: list[JsonRpcMessage | BadFrame] = []
    for piece in _splits(stream, cuts):
        decoded += reader.feed(piece)
    decoded += reader.close()
    assert decoded == messages


@given(st.lists(requests, min_size=1, max_size=5))
def test_one_byte_at_a_time(messages: list[Request]) -> None:
    stream = b"".join(encode_message(m) for m in messages)
    reader = MessageReader()
    decoded: list[JsonRpcMessage | BadFrame] = []
    for i in range(len(stream)):
        decoded += reader.feed(stream[i:i + 1])
    assert decoded == messages


@given(st.binary(max_size=300), st.lists(st.integers(0, 400), max_size=10))
def test_arbitrary_bytes_never_raise(data: bytes, cuts: list[int]) -> None:
    reader = MessageReader(max_frame_bytes=64)
    for piece in _splits(data, cuts):
        for item in reader.feed(piece):
            assert isinstance(item, (BadFrame, Request, Notification)) or item is not None
    reader.close()


@given(st.binary(max_size=200))
def test_decode_is_total(line: bytes) -> None:
    result = decode_json(line)
    if not isinstance(result, BadFrame):
        json.dumps(result, allow_nan=False).encode("utf-8")  # whatever decodes re-encodes cleanly


@given(st.integers(1, 200), st.integers(1, 3))
def test_frame_limit_is_enforced_before_the_newline(limit: int, extra: int) -> None:
    framer = LineFramer(max_frame_bytes=limit)
    out = framer.feed(b"a" * (limit + extra))  # no newline yet
    assert len(out) == 1 and isinstance(out[0], BadFrame) and out[0].problem == FrameProblem.TOO_LARGE
    assert framer.buffered == 0  # nothing kept while discarding
    assert framer.feed(b"b" * 1000) == []  # still discarding
    assert framer.feed(b"\nz\n") == [b"z"]  # the next line is fine


def test_line_of_exactly_the_limit_is_accepted() -> None:
    framer = LineFramer(max_frame_bytes=4)
    assert framer.feed(b"abcd\r\n\n\nabcd\n") == [b"abcd", b"abcd"]


def test_bad_lines_map_to_json_rpc_codes() -> None:
    cases = {
        b"{": ErrorCode.PARSE_ERROR,
        b"\xc3\x28": ErrorCode.PARSE_ERROR,
        b'{"a":1,"a":2}': ErrorCode.PARSE_ERROR,
        b"Infinity": ErrorCode.PARSE_ERROR,
        b"1" * 5000: ErrorCode.PARSE_ERROR,
        b"[" * 100_000: ErrorCode.PARSE_ERROR,
        b'"\\udc00"': ErrorCode.PARSE_ERROR,
        b'{"jsonrpc":"2.0"}': ErrorCode.INVALID_REQUEST,
        b'{"jsonrpc":"2.0","id":[1],"method":"x"}': ErrorCode.INVALID_REQUEST,
        b'{"id":3,"method":"x"}': ErrorCode.INVALID_REQUEST,
    }
    for line, code in cases.items():
        result = decode_message(line)
        assert isinstance(result, BadFrame), line
        assert result.error_code == code, (line, result)
    kept = decode_message(b'{"id":3,"method":"x"}')
    assert isinstance(kept, BadFrame) and kept.id == 3  # id kept so the reply can name it


def test_overflowing_numbers_are_refused() -> None:
    result = decode_json(b'{"x": 1e400}')
    assert isinstance(result, BadFrame) and "overflows" in result.detail
    assert decode_json(b'{"x": 1.5e300}') == {"x": 1.5e300}
