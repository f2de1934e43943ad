"""Line framing and total JSON decoding for line-delimited JSON-RPC.

Sans-IO in the h11 style: feed bytes in, take complete frames out. Problems come out as values
(``BadFrame``) so one bad line never kills a reader.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, NoReturn

from pydantic import JsonValue
from pydantic_core import to_json

from ._events import WorkerEvent
from ._jsonrpc import (
    ErrorCode,
    InvalidMessage,
    JsonRpcMessage,
    Method,
    Notification,
    RuntimeEventParams,
    parse_message,
    readable_id,
)

#: Default maximum bytes of one line (without its newline). Large enough for a big tool result or a
#: full transcript inline; small enough that a runaway peer can't make us buffer without bound.
DEFAULT_MAX_FRAME_BYTES = 8 * 1024 * 1024


class FrameProblem(StrEnum):
    TOO_LARGE = "too_large"
    NOT_UTF8 = "not_utf8"
    INVALID_JSON = "invalid_json"
    INVALID_MESSAGE = "invalid_message"


_CODE_FOR = {
    FrameProblem.TOO_LARGE: ErrorCode.FRAME_TOO_LARGE,
    FrameProblem.NOT_UTF8: ErrorCode.PARSE_ERROR,
    FrameProblem.INVALID_JSON: ErrorCode.PARSE_ERROR,
    FrameProblem.INVALID_MESSAGE: ErrorCode.INVALID_REQUEST,
}


@dataclass(frozen=True, slots=True)
class BadFrame:
    """A line that could not become a message. ``size`` counts the bytes seen (capped lines too)."""

    problem: FrameProblem
    detail: str
    size: int
    id: int | str | None = None

    @property
    def error_code(self) -> ErrorCode:
        """The JSON-RPC error code to answer with, where a reply is possible."""
        return _CODE_FOR[self.problem]


class LineFramer:
    """Splits a byte stream into lines, enforcing ``max_frame_bytes`` while a line is still incomplete.

    An over-long line yields one ``BadFrame(TOO_LARGE)`` as soon as the limit is crossed; its remaining
    bytes are discarded up to the next newline. Blank lines are skipped; a trailing ``\\r`` is removed.
    """

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        if max_frame_bytes < 1:
            raise ValueError("max_frame_bytes must be positive")
        self.max_frame_bytes = max_frame_bytes
        self._buffer = bytearray()
        self._discarding = False  # inside an over-long line, dropping bytes until its newline
        self._discarded = 0

    def feed(self, data: bytes | bytearray) -> list[bytes | BadFrame]:
        data = bytes(data)
        out: list[bytes | BadFrame] = []
        start = 0
        while start < len(data):
            newline = data.find(b"\n", start)
            end = len(data) if newline < 0 else newline
            piece = data[start:end]
            if self._discarding:
                self._discarded += len(piece)
            else:
                self._buffer += piece
                if len(self._buffer) - self._buffer.endswith(b"\r") > self.max_frame_bytes:
                    self._discarding = True
                    self._discarded = len(self._buffer)
                    self._buffer.clear()
                    out.append(BadFrame(FrameProblem.TOO_LARGE, self._too_large_detail(), self._discarded))
            if newline < 0:
                break
            self._end_line(out)
            start = newline + 1
        return out

    def _too_large_detail(self) -> str:
        return f"line exceeds the frame limit of {self.max_frame_bytes} bytes; discarded"

    def _end_line(self, out: list[bytes | BadFrame]) -> None:
        if self._discarding:
            self._discarding = False
            self._discarded = 0
            return
        line = bytes(self._buffer)
        self._buffer.clear()
        if line.endswith(b"\r"):
            line = line[:-1]
        if line.strip():
            out.append(line)

    def close(self) -> list[bytes | BadFrame]:
        """End of stream: a final line without newline still counts as a frame."""
        out: list[bytes | BadFrame] = []
        if self._buffer or self._discarding:
            self._end_line(out)
        return out

    @property
    def buffered(self) -> int:
        return len(self._buffer)


class _JsonRejected(ValueError):
    pass


#: Deepest nesting of arrays/objects accepted in one line (a bare message object is depth 1). The models
#: can't serialize values nested much deeper (pydantic-core stops at ~250 levels) and canonical hashing
#: recurses, so deeper input is refused up front — deterministically, whatever the caller's stack depth.
MAX_NESTING_DEPTH = 200
#: Longest integer literal accepted, in digits. Fixed here instead of taken from the interpreter's
#: ``sys.get_int_max_str_digits()`` (which PYTHONINTMAXSTRDIGITS can lift) so both peers agree.
MAX_INTEGER_DIGITS = 4300


def _reject_constant(name: str) -> NoReturn:
    raise _JsonRejected(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise _JsonRejected(f"number {text[:40]} overflows a double")
    return value


def _bounded_int(text: str) -> int:
    digits = len(text) - text.startswith("-")
    if digits > MAX_INTEGER_DIGITS:
        raise _JsonRejected(f"integer of {digits} digits exceeds the limit ({MAX_INTEGER_DIGITS} digits)")
    return int(text)


def _no_duplicate_keys(pairs: list[tuple[str, JsonValue]]) -> dict[str, JsonValue]:
    result = dict(pairs)
    if len(result) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _JsonRejected(f"duplicate key {key!r}")
            seen.add(key)
    return result


_SURROGATE_ESCAPE = re.compile(rb"\\[uU][dD][89a-fA-F]")


def _is_utf8_clean(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _structure_problem(value: object, *, max_depth: int, check_strings: bool) -> str | None:
    """Walk a decoded value without recursion: too deep, or a string holding a lone surrogate."""
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            if check_strings and not _is_utf8_clean(item):
                return "lone UTF-16 surrogate escape"
        elif isinstance(item, (dict, list)):
            depth += 1
            if depth > max_depth:
                return f"nesting too deep (more than {max_depth} levels)"
            if isinstance(item, dict):
                if check_strings and not all(_is_utf8_clean(key) for key in item):
                    return "lone UTF-16 surrogate escape"
                stack.extend((child, depth) for child in item.values())
            else:
                stack.extend((child, depth) for child in item)
    return None


def decode_json(line: bytes, max_depth: int = MAX_NESTING_DEPTH) -> JsonValue | BadFrame:
    """Decode one line as strict JSON. Returns the value or a BadFrame; never raises.

    Stricter than ``json.loads``: NaN/Infinity, overflowing numbers, duplicate keys, lone surrogates,
    integers over ``MAX_INTEGER_DIGITS`` digits and nesting deeper than ``max_depth`` are refused.
    """
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return BadFrame(FrameProblem.NOT_UTF8, f"not UTF-8: {exc.reason} at byte {exc.start}", len(line))
    try:
        value: JsonValue = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float,
                                      parse_int=_bounded_int, object_pairs_hook=_no_duplicate_keys)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, _JsonRejected, nesting past the stack
        detail = "nesting too deep" if isinstance(exc, RecursionError) else str(exc)
        return BadFrame(FrameProblem.INVALID_JSON, f"invalid JSON: {detail}", len(line))
    # Both checks walk the value, so they run only when the line could fail them (cheap byte counts).
    check_depth = line.count(b"[") + line.count(b"{") > max_depth
    check_strings = _SURROGATE_ESCAPE.search(line) is not None
    if check_depth or check_strings:
        problem = _structure_problem(value, max_depth=max_depth if check_depth else sys.maxsize,
                                     check_strings=check_strings)
        if problem is not None:  # the JSON itself parsed: keep the id when it can be read
            return BadFrame(FrameProblem.INVALID_JSON, f"invalid JSON: {problem}", len(line), readable_id(value))
    return value


def decode_message(line: bytes) -> JsonRpcMessage | BadFrame:
    """Decode one line into a JSON-RPC message, or a BadFrame saying why not. Never raises."""
    value = decode_json(line)
    if isinstance(value, BadFrame):
        return value
    if isinstance(value, dict) and isinstance(value.get("id"), bool):  # pydantic would read true as id 1
        return BadFrame(FrameProblem.INVALID_MESSAGE, "id must be a string, an integer or null, not a boolean",
                        len(line))
    message = parse_message(value)
    if isinstance(message, InvalidMessage):
        return BadFrame(FrameProblem.INVALID_MESSAGE, message.reason, len(line), message.id)
    return message


class MessageReader:
    """Bytes in, JSON-RPC messages (or BadFrames) out: a LineFramer plus decode_message."""

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self._framer = LineFramer(max_frame_bytes)

    def feed(self, data: bytes | bytearray) -> list[JsonRpcMessage | BadFrame]:
        return [self._decode(item) for item in self._framer.feed(data)]

    def close(self) -> list[JsonRpcMessage | BadFrame]:
        return [self._decode(item) for item in self._framer.close()]

    @staticmethod
    def _decode(item: bytes | BadFrame) -> JsonRpcMessage | BadFrame:
        return item if isinstance(item, BadFrame) else decode_message(item)


def encode_message(message: JsonRpcMessage | dict[str, Any]) -> bytes:
    """One message as a wire line (compact JSON, UTF-8, trailing newline)."""
    obj = message if isinstance(message, dict) else message.to_json_obj()
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8") + b"\n"


_EVENT_HEAD = b'{"jsonrpc":"2.0","method":"' + Method.EVENT.value.encode() + b'","params":{"task_id":'


def encode_event_notification(params: RuntimeEventParams) -> bytes:
    """The ``runtime.event`` line for ``params``: the same JSON ``encode_message`` would give, serialized by
    pydantic-core instead of model -> dict -> Notification -> dict -> json.dumps (the worker's hot path)."""
    return encode_event(params.task_id, params.n, params.event)


def encode_event(task_id: str, n: int, event: WorkerEvent) -> bytes:
    """The ``runtime.event`` line of the task's ``n``-th event, from parts that are already valid (a task id
    accepted with its startTask, ``n`` >= 1, a WorkerEvent): no RuntimeEventParams is built only to be written.
    The event goes through its own class's serializer, not the union's (which would look the class up again).
    Anything pydantic cannot serialize the same way falls back to ``encode_message``, which raises as before."""
    try:
        body = event.__pydantic_serializer__.to_json(event, exclude_none=True)
        task = to_json(task_id)
    except ValueError:  # PydanticSerializationError: unencodable text or values
        params = {"task_id": task_id, "n": n, "event": event.to_json_obj()}
        return encode_message(Notification(method=Method.EVENT, params=params))
    return b"".join((_EVENT_HEAD, task, b',"n":', str(n).encode(), b',"event":', body, b"}}\n"))
