"""The decoder's traps, one table shared by the sans-IO, supervisor-side and worker-side tests.

Each trap is one line shaped like a request (id ``"r7"``); none of them is a valid message. Where the line
is still a JSON object with a readable id, the error answers that id; otherwise ``null``.
"""

from __future__ import annotations

from dataclasses import dataclass

from codesdk.protocol import ErrorCode, FrameProblem


@dataclass(frozen=True)
class Trap:
    name: str
    line: bytes  # without its newline
    problem: FrameProblem  # what the decoder makes of it
    code: ErrorCode  # what the worker answers
    #: Whether the answer carries the line's id ("r7"): yes whenever the line is a JSON object with a readable id
    #: (so the peer waiting for it gets its answer), null only when no id can be read.
    echoes_id: bool = False

    def __str__(self) -> str:
        return self.name


def _stop(task_id: bytes) -> bytes:
    return b'{"jsonrpc":"2.0","id":"r7","method":"runtime.stop","params":{"task_id":' + task_id + b"}}"


def _nested(depth: int, leaf: bytes = b"1") -> bytes:
    return b"[" * depth + leaf + b"]" * depth


VALID_STOP = _stop(b'"t1"')

TRAPS: tuple[Trap, ...] = (
    Trap("nesting_past_the_interpreter_stack", _stop(_nested(100_000)), FrameProblem.INVALID_JSON,
         ErrorCode.PARSE_ERROR),
    Trap("nesting_past_the_protocol_limit", _stop(_nested(900)), FrameProblem.INVALID_JSON, ErrorCode.PARSE_ERROR, echoes_id=True),
    Trap("nesting_just_past_the_protocol_limit", _stop(_nested(200)), FrameProblem.INVALID_JSON,
         ErrorCode.PARSE_ERROR, echoes_id=True),
    Trap("deep_nesting_around_a_lone_surrogate", _stop(_nested(900, b'"\\udc00"')), FrameProblem.INVALID_JSON,
         ErrorCode.PARSE_ERROR, echoes_id=True),
    Trap("nan", _stop(b"NaN"), FrameProblem.INVALID_JSON, ErrorCode.PARSE_ERROR),
    Trap("infinity", _stop(b"Infinity"), FrameProblem.INVALID_JSON, ErrorCode.PARSE_ERROR),
    Trap("negative_infinity", _stop(b"-Infinity"), FrameProblem.INVALID_JSON, ErrorCode.PARSE_ERROR),
    Trap("float_overflowing_a_double", _stop(b"1e400"), FrameProblem.INVALID_JSON, ErrorCode.PARSE_ERROR),
    Trap("duplicate_keys", b'{"jsonrpc":"2.0","id":"r7","id":"r8","method":"runtime.stop","params":{"task_id":"t"}}',
         FrameProblem.INVALID_JSON, ErrorCode.PARSE_ERROR),
    Trap("duplicate_keys_nested", _stop(b'"t","task_id":"u"'), FrameProblem.INVALID_JSON, ErrorCode.PARSE_ERROR),
    Trap("five_thousand_digit_integer", _stop(b"7" * 5000), FrameProblem.INVALID_JSON, ErrorCode.PARSE_ERROR),
    Trap("negative_five_thousand_digit_integer", _stop(b"-" + b"7" * 5000), FrameProblem.INVALID_JSON,
         ErrorCode.PARSE_ERROR),
    Trap("lone_high_surrogate", _stop(b'"\\ud800"'), FrameProblem.INVALID_JSON, ErrorCode.PARSE_ERROR, echoes_id=True),
    Trap("lone_low_surrogate_in_a_key", b'{"jsonrpc":"2.0","id":"r7","method":"runtime.stop","params":{"\\udfff":1}}',
         FrameProblem.INVALID_JSON, ErrorCode.PARSE_ERROR, echoes_id=True),
    Trap("surrogates_in_the_wrong_order", _stop(b'"\\ude00\\ud83d"'), FrameProblem.INVALID_JSON,
         ErrorCode.PARSE_ERROR, echoes_id=True),
    Trap("invalid_utf8", _stop(b'"\xff\xfe"'), FrameProblem.NOT_UTF8, ErrorCode.PARSE_ERROR),
    Trap("overlong_utf8_slash", _stop(b'"\xc0\xaf"'), FrameProblem.NOT_UTF8, ErrorCode.PARSE_ERROR),
    Trap("utf8_encoded_surrogate", _stop(b'"\xed\xa0\x80"'), FrameProblem.NOT_UTF8, ErrorCode.PARSE_ERROR),
    Trap("truncated_utf8_sequence", _stop(b'"\xe2\x82"'), FrameProblem.NOT_UTF8, ErrorCode.PARSE_ERROR),
    Trap("byte_order_mark", b"\xef\xbb\xbf" + VALID_STOP, FrameProblem.INVALID_JSON, ErrorCode.PARSE_ERROR),
    Trap("raw_control_character_in_a_string", _stop(b'"a\x00b"'), FrameProblem.INVALID_JSON, ErrorCode.PARSE_ERROR),
    Trap("trailing_garbage", VALID_STOP + b" trailing", FrameProblem.INVALID_JSON, ErrorCode.PARSE_ERROR),
    Trap("truncated_object", VALID_STOP[:-5], FrameProblem.INVALID_JSON, ErrorCode.PARSE_ERROR),
    Trap("not_json_at_all", b"Traceback (most recent call last):", FrameProblem.INVALID_JSON, ErrorCode.PARSE_ERROR),
    Trap("batch_array", b"[" + VALID_STOP + b"," + VALID_STOP + b"]", FrameProblem.INVALID_MESSAGE,
         ErrorCode.INVALID_REQUEST),
    Trap("empty_batch", b"[]", FrameProblem.INVALID_MESSAGE, ErrorCode.INVALID_REQUEST),
    Trap("wrong_jsonrpc_version", VALID_STOP.replace(b'"2.0"', b'"1.0"'), FrameProblem.INVALID_MESSAGE,
         ErrorCode.INVALID_REQUEST, echoes_id=True),
    Trap("jsonrpc_version_as_number", VALID_STOP.replace(b'"2.0"', b"2.0"), FrameProblem.INVALID_MESSAGE,
         ErrorCode.INVALID_REQUEST, echoes_id=True),
    Trap("missing_jsonrpc_member", VALID_STOP.replace(b'"jsonrpc":"2.0",', b""), FrameProblem.INVALID_MESSAGE,
         ErrorCode.INVALID_REQUEST, echoes_id=True),
    Trap("boolean_id", VALID_STOP.replace(b'"r7"', b"true"), FrameProblem.INVALID_MESSAGE, ErrorCode.INVALID_REQUEST),
    Trap("scalar_instead_of_an_object", b"42", FrameProblem.INVALID_MESSAGE, ErrorCode.INVALID_REQUEST),
    Trap("null_instead_of_an_object", b"null", FrameProblem.INVALID_MESSAGE, ErrorCode.INVALID_REQUEST),
)
