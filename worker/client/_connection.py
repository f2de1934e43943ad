"""JSON-RPC client side of the worker protocol, over any pair of byte streams.

One reader task owns the receive stream: responses resolve their pending request by id, and
``runtime.event`` notifications go into a bounded channel (a slow consumer slows the reader, never
grows a queue). Bad frames are counted and kept as values; they never stop the reader.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, overload

import trio
from pydantic import ValidationError

from codesdk.protocol import (
    DEFAULT_MAX_FRAME_BYTES,
    BadFrame,
    ErrorResponse,
    LineFramer,
    Method,
    MethodSpec,
    Model,
    Notification,
    Request,
    Response,
    RuntimeEventParams,
    WireEvent,
    decode_event_fast,
    decode_json,
    decode_message,
    encode_message,
)

log = logging.getLogger("codesdk.supervisor.worker")

#: The keys of a ``runtime.event`` notification line (anything else takes the general path).
_EVENT_KEYS = frozenset({"jsonrpc", "method", "params"})

#: Notifications buffered between the reader and the consumer.
EVENT_BUFFER = 1024
#: Events queued without letting other tasks run: one chunk of a fast worker holds ~150 events (~2 ms of
#: decoding); yielding every this many keeps other tenants' latency under ~1 ms while batches stay large.
EVENTS_PER_YIELD = 64
#: Protocol violations kept for diagnostics (the count is exact; the list is the most recent).
VIOLATIONS_KEPT = 100
#: Violations logged one by one per worker and window; the rest are counted and logged as one line per window,
#: so a worker writing thousands of bad lines cannot flood the supervisor's log.
VIOLATION_LOGS_PER_WINDOW = 10
VIOLATION_LOG_WINDOW_S = 60.0


class WorkerError(Exception):
    """Base of errors talking to a worker."""


class RpcError(WorkerError):
    """The worker answered a request with a JSON-RPC error."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(f"worker error {code}: {message}")
        self.code = code
        self.message = message
        self.data = data


class InvalidResult(WorkerError):
    """The worker answered a request with a result its method's model refuses (a protocol violation)."""


class WorkerClosed(WorkerError):
    """We closed the connection (shutdown); no more requests can be sent."""


class WorkerBroken(WorkerError):
    """The worker's output ended or broke: it exited or crashed. ``__cause__`` may hold details."""


P = TypeVar("P", bound=Model)
R = TypeVar("R", bound=Model)


@dataclass(frozen=True)
class ProtocolViolation:
    """Something the worker sent that breaks the protocol (kept and counted, never fatal)."""

    kind: str
    detail: str


@dataclass
class ConnectionStats:
    requests: int = 0
    responses: int = 0
    notifications: int = 0
    violations: int = 0
    recent_violations: deque[ProtocolViolation] = field(default_factory=lambda: deque(maxlen=VIOLATIONS_KEPT))


class _Pending:
    def __init__(self) -> None:
        self.done = trio.Event()
        self.response: Response | ErrorResponse | None = None
        self.error: WorkerError | None = None


class WorkerConnection:
    def __init__(self, send: trio.abc.SendStream, receive: trio.abc.ReceiveStream,
                 max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES, name: str = "worker",
                 wire_tap: Callable[[bytes | BadFrame], None] | None = None) -> None:
        self.name = name
        #: Called with every line read, in arrival order, before it is handled (the test kit's wire log).
        self._wire_tap = wire_tap
        self._send = send
        self._receive = receive
        self._max_frame_bytes = max_frame_bytes
        self._ids = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self._write_lock = trio.Lock()
        self._log_window_started = -VIOLATION_LOG_WINDOW_S  # the first violation opens a window
        self._logged = 0
        self._suppressed = 0
        self._closed = False
        self._broken: WorkerBroken | None = None
        self.stats = ConnectionStats()
        self.eof = trio.Event()
        #: Responses that matched no pending request (kept for diagnostics and protocol tests).
        self.unmatched: deque[Response | ErrorResponse] = deque(maxlen=VIOLATIONS_KEPT)
        self._unmatched_changed = trio.Event()
        self._events_send, self.events = trio.open_memory_channel[WireEvent](EVENT_BUFFER)
        self._unyielded = 0  # events queued since the reader last let others run

    # -- reader ---------------------------------------------------------------------------------

    async def run_reader(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Read until EOF. Then every pending request fails with WorkerBroken and ``events`` ends."""
        framer = LineFramer(self._max_frame_bytes)
        task_status.started()
        try:
            async with self._events_send:
                while True:
                    try:
                        chunk = await self._receive.receive_some(64 * 1024)
                    except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                        log.info("%s: output stream ended: %s", self.name, exc)
                        chunk = b""
                    for line in framer.feed(chunk) if chunk else framer.close():
                        if self._wire_tap is not None:
                            self._wire_tap(line)
                        await self._handle_line(line)
                    if not chunk:
                        return
        finally:
            self._log_suppressed()
            self._broken = WorkerBroken(f"{self.name}: worker output ended (process exited or crashed)")
            for pending in self._pending.values():
                pending.error = self._broken
                pending.done.set()
            self._pending.clear()
            self.eof.set()

    async def _handle_line(self, line: bytes | BadFrame) -> None:
        """One framed line. ``runtime.event`` notifications, nearly all of the traffic, are validated from their
        bytes once, by the compiled decoder (``decode_event_fast``), and handed on as ``WireEvent``s (bytes and the
        fields the engine routes on; no model); a line it cannot prove valid, and everything else, goes the general
        way — strict decoding, then the models — which decides what the line is."""
        if isinstance(line, BadFrame):
            await self._handle(line)
            return
        event = decode_event_fast(line)
        if event is not None:
            self.stats.notifications += 1
            try:  # no scheduling round per event: the consumer takes what queued up in one batch
                self._events_send.send_nowait(event)
            except trio.WouldBlock:  # the consumer is behind: wait for room (backpressure, as ever)
                await self._events_send.send(event)
                self._unyielded = 0
            else:
                self._unyielded += 1
                if self._unyielded >= EVENTS_PER_YIELD:
                    self._unyielded = 0
                    await trio.lowlevel.checkpoint()
            return
        value = decode_json(line)
        if (isinstance(value, dict) and value.keys() == _EVENT_KEYS and value["method"] == Method.EVENT
                and value["jsonrpc"] == "2.0" and isinstance(value["params"], dict)):
            self.stats.notifications += 1
            await self._handle_event(value["params"])
            return
        if isinstance(value, BadFrame):  # what the line began with tells who wrote it (a stray print, a log line)
            self._violation("bad_frame", f"{value.problem}: {value.detail}; the line began {line[:80]!r}")
            return
        # anything else (responses): the full decode_message checks; decoding twice is rare
        await self._handle(decode_message(line))

    async def _handle_event(self, params: Any) -> None:
        try:
            event = RuntimeEventParams.model_validate(params)
        except ValidationError as exc:
            self._violation("invalid_event", _summarize(exc))
            return
        except (ValueError, TypeError, ArithmeticError) as exc:
            # A validator that tripped on hostile input instead of refusing it (e.g. OverflowError
            # normalizing a time at the edge of the calendar to UTC): still only this event is lost.
            self._violation("invalid_event", f"{type(exc).__name__}: {exc}")
            return
        await self._events_send.send(WireEvent.from_params(event))

    async def _handle(self, item: Any) -> None:
        if isinstance(item, BadFrame):
            self._violation("bad_frame", f"{item.problem}: {item.detail}")
        elif isinstance(item, (Response, ErrorResponse)):
            self.stats.responses += 1
            pending = self._pending.pop(item.id, None) if isinstance(item.id, int) else None
            if pending is None:
                self.unmatched.append(item)
                self._unmatched_changed.set()
                self._unmatched_changed = trio.Event()
                if isinstance(item, ErrorResponse) and item.id is None:
                    self._violation("error_without_id", f"{item.error.code}: {item.error.message}")
                else:
                    self._violation("unmatched_response", f"response to unknown request id {item.id!r}")
                return
            pending.response = item
            pending.done.set()
        elif isinstance(item, Notification):
            self.stats.notifications += 1
            if item.method != Method.EVENT:
                self._violation("unknown_notification", f"unexpected notification {item.method!r}")
                return
            await self._handle_event(item.params)
        elif isinstance(item, Request):
            self._violation("unexpected_request", f"worker sent a request {item.method!r}; none are defined")

    def _violation(self, kind: str, detail: str) -> None:
        self.stats.violations += 1
        self.stats.recent_violations.append(ProtocolViolation(kind, detail))
        now = time.monotonic()
        if now - self._log_window_started >= VIOLATION_LOG_WINDOW_S:
            self._log_suppressed()
            self._log_window_started, self._logged = now, 0
        if self._logged < VIOLATION_LOGS_PER_WINDOW:
            self._logged += 1
            log.warning("%s: protocol violation (%s): %s", self.name, kind, detail)
        else:
            self._suppressed += 1

    def _log_suppressed(self) -> None:
        if self._suppressed:
            log.warning("%s: %d more protocol violations not logged one by one (%d in all; the last %d are kept)",
                        self.name, self._suppressed, self.stats.violations, VIOLATIONS_KEPT)
            self._suppressed = 0

    async def wait_unmatched(self, request_id: int | str | None) -> Response | ErrorResponse:
        """Wait for an unmatched response with this id (e.g. the answer to a line sent with send_raw)."""
        while True:
            for item in self.unmatched:
                if item.id == request_id:
                    self.unmatched.remove(item)
                    return item
            if self.eof.is_set():
                raise WorkerBroken(f"{self.name}: output ended before a response to {request_id!r}")
            await self._unmatched_changed.wait()

    # -- requests -------------------------------------------------------------------------------

    @overload
    async def request(self, method: MethodSpec[P, R], params: P) -> R: ...

    @overload
    async def request(self, method: str, params: dict[str, Any] | None = None) -> Any: ...

    async def request(self, method: MethodSpec[Model, Model] | str,
                      params: Model | dict[str, Any] | None = None) -> Any:
        """Send a request and wait for its answer. Callers bound the wait (``trio.fail_after``).

        The answer is read after every event the worker sent before it, so something must be taking ``events``
        meanwhile (the pool always is): with nobody reading them, the bounded event buffer fills, the reader
        waits for room, and the answer is never read.

        Typed: ``request(Rpc.START_TASK, StartTaskParams(...))`` returns a ``StartTaskResult`` (InvalidResult when
        the worker answers something else). Untyped: a method name and JSON params give the JSON result."""
        if isinstance(method, MethodSpec):
            if not isinstance(params, method.params):
                raise TypeError(f"{method.method} takes {method.params.__name__}, not {type(params).__name__}")
            raw = await self._call(method.method, params.to_json_obj() if method.takes_params else None)
            try:
                return method.parse_result(raw)
            except ValidationError as exc:
                self._violation("invalid_result", f"{method.method}: {_summarize(exc)}")
                raise InvalidResult(f"{self.name}: the answer to {method.method} is invalid: "
                                    f"{_summarize(exc)}") from exc
        assert not isinstance(params, Model), "JSON params go with a method name; a params model with its MethodSpec"
        return await self._call(method, params)

    async def _call(self, method: str, params: dict[str, Any] | None) -> Any:
        if self._closed:
            raise WorkerClosed(f"{self.name}: connection closed")
        if self._broken is not None:
            raise self._broken
        request_id = next(self._ids)
        pending = _Pending()
        self._pending[request_id] = pending
        self.stats.requests += 1
        try:
            await self.send_raw(encode_message(Request(id=request_id, method=method, params=params)))
            await pending.done.wait()
        finally:
            self._pending.pop(request_id, None)
        if pending.error is not None:
            raise pending.error
        response = pending.response
        if isinstance(response, ErrorResponse):
            raise RpcError(response.error.code, response.error.message, response.error.data)
        assert response is not None
        return response.result

    async def send_raw(self, data: bytes) -> None:
        """Write bytes as they are (one writer at a time). Tests use it to send malformed lines."""
        async with self._write_lock:
            try:
                await self._send.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                why = str(exc) or str(exc.__cause__ or "") or "its stdin is closed (it exited, or closed it)"
                raise WorkerBroken(f"{self.name}: cannot write to the worker: {why}") from exc

    async def close_input(self) -> None:
        """Close the worker's stdin: the worker treats EOF as a shutdown request."""
        self._closed = True
        async with self._write_lock:
            await self._send.aclose()


def _summarize(exc: ValidationError) -> str:
    err = exc.errors()[0]
    return f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']} ({exc.error_count()} error(s))"
