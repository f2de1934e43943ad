"""The worker's stdio JSON-RPC server: one reader, one writer, one owner nursery for running tasks.

Requests are framed and decoded by ``protocol`` (strict JSON, ``parse_request``) and dispatched through
``protocol.METHOD_TABLE``: the table's params model validates each request's params once, then a synchronous
handler takes the typed params, checks, schedules and answers (a value, an ``RpcFailure``, or ``Later`` for
the questions that take time). Responses and ``runtime.event`` notifications share one bounded outgoing
queue (``_outgoing``) drained by a single writer, so lines never interleave and a slow supervisor
backpressures the runtimes instead of growing a queue.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

import trio
from pydantic import ValidationError

from codesdk.protocol import (
    DEFAULT_MAX_FRAME_BYTES,
    INVALID_REQUEST_DATA,
    METHOD_TABLE,
    PROTOCOL_VERSION,
    TERMINAL_EVENT_TYPES,
    Ack,
    BadFrame,
    DescribeEnvParams,
    DescribeEnvResult,
    ErrorCode,
    EventType,
    GetAuthStatusParams,
    ImplicitSource,
    IncomingId,
    IncomingRequest,
    InitializeParams,
    InitializeResult,
    InvalidMessage,
    LineFramer,
    Method,
    Model,
    NoParams,
    PeerInfo,
    ProcessEnd,
    RuntimeInfo,
    RuntimeOffer,
    RuntimeSources,
    SendInputParams,
    SendInputResult,
    SendAnswerParams,
    SendToolApprovedParams,
    SendToolDeniedParams,
    SendToolResultParams,
    StartTaskParams,
    StartTaskResult,
    StopParams,
    StopReceipt,
    TaskFailed,
    TaskFailureCode,
    TaskStopped,
    WorkerEvent,
    decode_json,
    encode_event,
    encode_message,
    error_response,
    invalid_params_data,
    parse_request,
    utc_now,
)

from codesdk._version import __version__
from . import _recording as recording
from ._failure import RpcFailure
from ._event_line import FAST_PAYLOADS, event_line, runtime_json, task_json
from ._outgoing import OutgoingLines
from ._recording import StreamRecorder

from .adapters.runtime_process import ended_processes
from .adapters.base import (
    AdapterRegistry,
    QuestionAnswer,
    RuntimeAdapter,
    RuntimeCrashed,
    TaskHandle,
    TaskOutcome,
    UnknownQuestion,
    UnknownToolCall,
)

log = logging.getLogger("codesdk.worker")

WORKER_NAME = "codesdk-worker"

#: Outgoing lines buffered before emitters wait for the writer. Bounded so a flooding runtime
#: slows down instead of exhausting memory when the supervisor reads slowly.
OUTGOING_BUFFER_LINES = 256

#: Most bytes of queued lines joined into one write to stdout.
WRITE_COALESCE_BYTES = 64 * 1024

#: Bytes per read from stdin.
READ_CHUNK_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class Later:
    """A handler's answer that takes time (it may look at files or run the runtime): the reader goes on, and the
    response is written when ``run`` completes — so later requests can be answered first."""

    run: Callable[[], Awaitable[Model]]


#: What a handler gives back: the result, or an answer to come.
Reply = Model | Later
Handler = Callable[[Any], Reply]


def runtime_sources(adapter: RuntimeAdapter, cwd: str | None) -> RuntimeSources:
    """``adapter``'s implicit sources in this worker's environment; without a ``cwd`` (no session's workspace to
    look in) only the user's own: a project's would be guessed from a folder no task works in."""
    sources = adapter.implicit_sources(Path(cwd) if cwd is not None else Path.home())
    found = [ImplicitSource.model_validate(entry) for entry in sources.get("found", ())
             if cwd is not None or not str(entry.get("kind", "")).startswith("project")]
    return RuntimeSources(runtime=adapter.name, policy=str(sources.get("policy", "")), found=tuple(found))


class EventTooLarge(ValueError):
    """An event would not fit in one frame; the driver would drop it, so it is refused here."""


class TaskEnded(RuntimeError):
    """An adapter tried to emit after its task's terminal event."""


@dataclass
class _RunningTask:
    params: StartTaskParams
    server: WorkerServer
    runtime: RuntimeInfo
    handle: TaskHandle | None = None
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    n: int = 0
    ended: bool = False
    stop_reason: str | None = None
    #: When the first stop was asked for (trio clock), and the grace it got: the receipt's timings.
    stop_asked_at: float | None = None
    stop_grace_s: float | None = None
    #: The task's runtime processes as they were ended (``RuntimeProcess.end`` reports into it).
    processes: list[ProcessEnd] = field(default_factory=list)
    #: Where this task's exchanges with its runtime are recorded (``_recording``), if they are.
    recorder: StreamRecorder | None = None
    #: The emit lock (``_send``): set while an event of this task is being numbered and queued.
    _emitting: bool = False
    _emit_waiters: trio.lowlevel.ParkingLot = field(default_factory=trio.lowlevel.ParkingLot)
    #: This task's id and runtime as JSON, for ``_event_line`` (the runtime's redone when it changes).
    _task_json: bytes = b""
    _runtime_json: bytes = b""
    _runtime_of: RuntimeInfo | None = None
    #: The ids of the inputs sent to this task (``runtime.sendInput``): each once.
    input_ids: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self._task_json = task_json(self.params.task_id)

    @property
    def task_id(self) -> str:
        return self.params.task_id

    # TaskIO -------------------------------------------------------------------------------------

    async def emit(self, event_type: EventType, payload: Model | dict[str, Any], raw: Any = None) -> None:
        if self.ended:
            raise TaskEnded(f"task {self.task_id} already ended; {event_type} not sent")
        if event_type in TERMINAL_EVENT_TYPES:
            raise ValueError(f"{event_type} is the worker's to send: return it from run() as a TaskOutcome")
        await self._send(event_type, payload, raw)

    async def _send(self, event_type: EventType, payload: Model | dict[str, Any], raw: Any = None) -> None:
        fast = (raw is None and self.recorder is None and type(event_type) is EventType
                and type(payload) is FAST_PAYLOADS.get(event_type))
        event: WorkerEvent | None = None
        if fast:  # proven valid as it is (``_event_line``): written without building the envelope
            time = utc_now()
            if self._runtime_of is not self.runtime:
                self._runtime_json, self._runtime_of = runtime_json(self.runtime), self.runtime
        else:  # validated here (a supervisor-only type or a payload of another type is refused), then written
            event = WorkerEvent(type=event_type, runtime=self.runtime, payload=payload, raw=raw)
        # n is used only once its line is queued: no gaps on cancellation. The emit lock is this task's own flag,
        # taken without a schedule point when it is free (a trio Lock yields on every acquire: one yield per
        # event was most of a flood's cost).
        while self._emitting:
            await self._emit_waiters.park()
        self._emitting = True
        try:
            line = None
            if event is None:
                try:
                    line = event_line(self._task_json, self.n + 1, event_type, time, self._runtime_json,
                                      cast(Model, payload))
                except ValueError:  # unencodable text or values: the general path says why
                    event = WorkerEvent(type=event_type, runtime=self.runtime, payload=payload, raw=raw)
            if event is not None:
                line = encode_event(self.task_id, self.n + 1, event)
            assert line is not None
            if len(line) > self.server.max_frame_bytes:
                raise EventTooLarge(f"{event_type} event of {len(line)} bytes exceeds the frame limit of "
                                    f"{self.server.max_frame_bytes} bytes; split it or store it by reference")
            await self.server.send_line(line)
            self.n += 1
            if self.recorder is not None:
                assert event is not None
                self.recorder.write("event", n=self.n, event=event.to_json_obj())
        finally:
            self._emitting = False
            if self._emit_waiters:
                self._emit_waiters.unpark()

    async def flush(self) -> None:
        await self.server.flush()

    async def write_raw(self, data: bytes) -> None:
        await self.server.send_line(data)

    def set_runtime_session_id(self, runtime_session_id: str) -> None:
        self.runtime = self.runtime.model_copy(update={"runtime_session_id": runtime_session_id})

    def set_model(self, model: str) -> None:
        self.runtime = self.runtime.model_copy(update={"model": model})

    def receipt(self, forced: bool) -> StopReceipt:
        """What this worker did to stop the task: the interrupt, whether the runtime honoured it within its grace,
        each runtime process as it was ended."""
        assert self.stop_asked_at is not None
        processes = tuple(self.processes)
        return StopReceipt(interrupt_sent=True, acknowledged=not forced, forced=forced, grace_s=self.stop_grace_s,
                           processes=processes, processes_gone=all(p.gone for p in processes) if processes else None,
                           worker_ms=round((trio.current_time() - self.stop_asked_at) * 1000, 3))

    async def finish(self, outcome: TaskOutcome) -> None:
        """Emit the task's one terminal event."""
        payload: Model
        if outcome.completed is not None:
            event_type, payload = EventType.TASK_COMPLETED, outcome.completed
        elif outcome.failed is not None:
            event_type, payload = EventType.TASK_FAILED, outcome.failed
        else:
            event_type = EventType.TASK_STOPPED
            payload = outcome.stopped or TaskStopped(reason=self.stop_reason or "stopped", requested_by="supervisor")
        self.ended = True
        try:
            await self._send(event_type, payload)
        except EventTooLarge as exc:  # a terminal event must never be lost: send a small one instead
            await self._send(EventType.TASK_FAILED, TaskFailed(code=TaskFailureCode.PROTOCOL_ERROR, message=str(exc)))


@dataclass
class WorkerStats:
    requests: int = 0
    bad_frames: int = 0
    tasks_started: int = 0
    events_sent: int = 0


class WorkerServer:
    def __init__(self, registry: AdapterRegistry, output: trio.abc.SendStream,
                 max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES, record_dir: Path | None = None) -> None:
        self.registry = registry
        #: Where each task's exchanges with its runtime are recorded (``_recording``); None: nowhere.
        self.record_dir = record_dir
        self.output = output
        self.max_frame_bytes = max_frame_bytes
        self.stats = WorkerStats()
        self.initialized = False
        self.shutting_down = False
        self.tasks: dict[str, _RunningTask] = {}
        self._out = OutgoingLines(OUTGOING_BUFFER_LINES)
        self._after_response: list[Callable[[], None]] = []
        self._read_scope = trio.CancelScope()
        self._tasks_nursery: trio.Nursery | None = None
        self._aux_nursery: trio.Nursery | None = None
        # One handler per entry of protocol.METHOD_TABLE, each taking that method's params model.
        self._handlers: dict[str, Handler] = {
            Method.INITIALIZE: self._initialize,
            Method.GET_AUTH_STATUS: self._get_auth_status,
            Method.ENSURE_LOGIN: self._ensure_login,
            Method.START_TASK: self._start_task,
            Method.SEND_TOOL_RESULT: self._answer_tool,
            Method.SEND_TOOL_DENIED: self._answer_tool,
            Method.SEND_TOOL_APPROVED: self._answer_tool,
            Method.SEND_INPUT: self._send_input,
            Method.SEND_ANSWER: self._answer_question,
            Method.STOP: self._stop,
            Method.SHUTDOWN: self._shutdown,
            Method.PING: self._ping,
            Method.DESCRIBE_ENV: self._describe_env,
        }
        assert self._handlers.keys() == METHOD_TABLE.keys()

    # -- lifecycle ------------------------------------------------------------------------------

    async def serve(self, stdin: trio.abc.ReceiveStream) -> None:
        """Serve until stdin closes or runtime.shutdown; end every task; drain output; return."""
        async with trio.open_nursery() as outer:
            outer.start_soon(self._writer, outer.cancel_scope)
            # tasks outside aux: cancelling aux (pending deferred answers) must not cancel the tasks,
            # which still have to emit their terminal events.
            async with trio.open_nursery() as tasks, trio.open_nursery() as aux:
                self._aux_nursery, self._tasks_nursery = aux, tasks
                with self._read_scope:
                    await self._read_loop(stdin)
                self.shutting_down = True
                for task in list(self.tasks.values()):
                    self._request_stop(task, "worker shutting down", grace_s=0.0)
                aux.cancel_scope.cancel()
            self._out.close()  # the writer drains what is queued, then ends
        log.info("worker exiting: %s", self.stats)

    def stop_serving(self) -> None:
        """Stop reading requests and end every task, as on stdin EOF (the supervisor is gone)."""
        self._read_scope.cancel()

    async def _read_loop(self, stdin: trio.abc.ReceiveStream) -> None:
        framer = LineFramer(self.max_frame_bytes)
        while True:
            chunk = await stdin.receive_some(READ_CHUNK_BYTES)
            items = framer.feed(chunk) if chunk else framer.close()
            for item in items:
                await self._handle_frame(item)
            if not chunk:
                log.info("stdin closed; shutting down")
                return

    async def _writer(self, outer_scope: trio.CancelScope) -> None:
        """Write queued lines in order; whatever has queued up meanwhile goes out in one write.

        One ``write`` per line costs a system call here and a wake-up in the supervisor per event; joining
        the backlog (up to WRITE_COALESCE_BYTES) keeps a fast stream cheap and a slow one unchanged (a lone
        line is written as soon as its emitter yields: ``_outgoing``).
        """
        try:
            while True:
                lines, flushed = await self._out.take(WRITE_COALESCE_BYTES)
                if not lines and flushed is None:
                    return
                if lines:
                    await self.output.send_all(lines[0] if len(lines) == 1 else b"".join(lines))
                    self.stats.events_sent += len(lines)
                if flushed is not None:  # set only once the lines before it are written
                    flushed.set()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            log.warning("protocol output closed by the supervisor (%s); exiting", exc)
            outer_scope.cancel()

    async def send_line(self, line: bytes) -> None:
        await self._out.put(line)

    async def flush(self) -> None:
        done = trio.Event()
        await self._out.put(done)
        await done.wait()

    # -- dispatch -------------------------------------------------------------------------------

    async def _handle_frame(self, item: bytes | BadFrame) -> None:
        if isinstance(item, bytes):
            value = decode_json(item)
            if not isinstance(value, BadFrame):
                await self._dispatch(value)
                return
            item = value
        self.stats.bad_frames += 1
        log.warning("bad frame (%s, %d bytes): %s", item.problem, item.size, item.detail)
        await self.send_line(encode_message(error_response(item.id, item.error_code, _frame_message(item),
                                                           {"detail": item.detail})))

    async def _dispatch(self, value: object) -> None:
        self.stats.requests += 1
        if isinstance(value, list):
            msg = "batch requests are not supported by this protocol; send one object per line"
            await self.send_line(encode_message(error_response(None, ErrorCode.INVALID_REQUEST, msg)))
            return
        request = parse_request(value)
        if isinstance(request, InvalidMessage):
            failure = RpcFailure(ErrorCode.INVALID_REQUEST, "Invalid request", INVALID_REQUEST_DATA)
            await self.send_line(failure.line(request.id))
            return
        try:
            answer = self._answer(request)
        except Exception as exc:  # a bug of ours, not the peer's: the request is answered and the worker goes on
            log.exception("request %r (%s) could not be answered", request.id, request.method)
            answer = RpcFailure(ErrorCode.SERVER_ERROR, "Server error", str(exc)).line(request.id)
        if isinstance(answer, Later):
            assert self._aux_nursery is not None
            self._aux_nursery.start_soon(self._answer_later, request.id, answer)
            return
        if answer is not None:
            await self.send_line(answer)
        self._run_after_response()

    def _answer(self, request: IncomingRequest) -> bytes | Later | None:
        """The line answering ``request``, a Later to await, or None for a notification (executed, never
        answered; its Later is never run)."""
        try:
            reply = self._call(request)
            if isinstance(reply, Later):
                return None if request.notification else reply
            result = reply.to_json_obj()
        except RpcFailure as failure:
            refusal = failure
        except Exception as exc:  # the handler failed, or its result would not serialize: a fault of ours
            log.exception("request %r (%s) failed", request.id, request.method)
            refusal = RpcFailure(ErrorCode.INTERNAL_ERROR, "Internal error", str(exc))
        else:
            if request.notification:
                return None
            return encode_message({"jsonrpc": "2.0", "result": result, "id": request.id})
        return None if request.notification else refusal.line(request.id)

    def _call(self, request: IncomingRequest) -> Reply:
        """Route one request through the method table: the method, its params (validated once, by the table's
        model) and its handler. Raises RpcFailure for every refusal; the checks run in the order of §3."""
        spec = METHOD_TABLE.get(request.method)
        if spec is None:
            raise RpcFailure(ErrorCode.METHOD_NOT_FOUND, "Method not found", request.method)
        if isinstance(request.params, list) and request.params:
            raise RpcFailure(ErrorCode.INVALID_PARAMS, "Invalid params", "too many positional arguments")
        raw = request.params if isinstance(request.params, dict) else {}
        self._admit(spec.method)
        if not spec.takes_params:
            if raw:
                raise RpcFailure(ErrorCode.INVALID_PARAMS, "Invalid params",
                                 {"detail": f"{spec.method} takes no params"})
            params: Model = NoParams()
        else:
            try:
                params = spec.params.model_validate(raw)
            except ValidationError as exc:
                raise RpcFailure(ErrorCode.INVALID_PARAMS, "Invalid params", invalid_params_data(exc)) from None
        return self._handlers[spec.method](params)

    def _admit(self, method: Method) -> None:
        """Refuse what this worker's state does not allow yet (before params are looked at)."""
        if method in (Method.INITIALIZE, Method.SHUTDOWN):
            return
        if not self.initialized:
            raise RpcFailure(ErrorCode.NOT_INITIALIZED, "call runtime.initialize first")
        if method == Method.START_TASK and self.shutting_down:
            raise RpcFailure(ErrorCode.SHUTTING_DOWN, "the worker is shutting down; start the task on a new worker")

    def _run_after_response(self) -> None:
        pending, self._after_response = self._after_response, []
        for action in pending:
            action()

    async def _answer_later(self, request_id: IncomingId, later: Later) -> None:
        try:
            result = await later.run()
            line = encode_message({"jsonrpc": "2.0", "id": request_id, "result": result.to_json_obj()})
        except RpcFailure as failure:
            line = failure.line(request_id)
        except Exception as exc:
            log.exception("request %r failed", request_id)
            line = RpcFailure(ErrorCode.INTERNAL_ERROR, "Internal error", str(exc)).line(request_id)
        await self.send_line(line)

    # -- handlers (sync: check, schedule, answer) -------------------------------------------------

    def _initialize(self, params: InitializeParams) -> Reply:
        ours, theirs = PROTOCOL_VERSION.split(".")[0], params.protocol_version.split(".")[0]
        if ours != theirs:
            raise RpcFailure(ErrorCode.PROTOCOL_VERSION_MISMATCH,
                             f"protocol {params.protocol_version} is not supported; this worker speaks "
                             f"{PROTOCOL_VERSION}", {"supported": [PROTOCOL_VERSION]})
        self.initialized = True
        offers = []
        for adapter in self.registry.adapters.values():
            availability = adapter.availability()
            caps = adapter.capabilities()
            offers.append(RuntimeOffer(name=adapter.name, version=caps.version, capabilities=caps,
                                       available=availability.available,
                                       unavailable_reason=availability.reason))
        return InitializeResult(protocol_version=PROTOCOL_VERSION, worker=PeerInfo(name=WORKER_NAME,
                                version=__version__), pid=os.getpid(), runtimes=tuple(offers))

    def _get_auth_status(self, params: GetAuthStatusParams) -> Reply:
        return Later(self._adapter(params.runtime).auth_status)

    def _ensure_login(self, params: GetAuthStatusParams) -> Reply:
        return Later(self._adapter(params.runtime).ensure_login)

    def _describe_env(self, params: DescribeEnvParams) -> Reply:
        if params.cwd is not None and not os.path.isabs(params.cwd):
            raise RpcFailure(ErrorCode.INVALID_PARAMS, f"describeEnv: cwd must be an absolute path, not {params.cwd!r}")
        adapters = list(self.registry.adapters.values())

        async def describe() -> DescribeEnvResult:
            found = await trio.to_thread.run_sync(lambda: [runtime_sources(a, params.cwd) for a in adapters])
            return DescribeEnvResult(runtimes=tuple(found))
        return Later(describe)

    def _adapter(self, name: str) -> RuntimeAdapter:
        adapter = self.registry.get(name)
        if adapter is None:
            raise RpcFailure(ErrorCode.UNKNOWN_RUNTIME, f"unknown runtime {name!r}",
                             {"known": sorted(self.registry.adapters)})
        return adapter

    def _start_task(self, params: StartTaskParams) -> Reply:
        adapter = self._adapter(params.runtime)
        availability = adapter.availability()
        if not availability.available:
            raise RpcFailure(ErrorCode.RUNTIME_UNAVAILABLE, f"runtime {params.runtime!r} is unavailable: "
                             f"{availability.reason}")
        if params.task_id in self.tasks:
            raise RpcFailure(ErrorCode.DUPLICATE_TASK, f"task {params.task_id!r} is already running in this worker")
        busy = next((t for t in self.tasks.values() if t.params.session.session_id == params.session.session_id), None)
        if busy is not None:
            raise RpcFailure(ErrorCode.SESSION_BUSY, f"session {params.session.session_id!r} already has an active "
                             f"task ({busy.task_id}); stop it or wait for it to end", {"active_task_id": busy.task_id})
        task = _RunningTask(params=params, server=self, runtime=RuntimeInfo(name=adapter.name))
        if self.record_dir is not None:
            task.recorder = StreamRecorder.create(self.record_dir, params.task_id)
            if task.recorder is not None:
                task.recorder.start(runtime=adapter.name, version=adapter.capabilities().version,
                                    params=params.to_json_obj())
        task.handle = adapter.start_task(params, task)  # StartTaskRefused is an RpcFailure: answered as it is
        if task.recorder is not None and task.handle.resume is not None:  # a replay's adapter must decide alike
            task.recorder.write("resume", mode=task.handle.resume.value)
        self.tasks[params.task_id] = task
        self.stats.tasks_started += 1
        # Started only after the response is queued, so the supervisor sees "accepted" before any event.
        self._after_response.append(lambda: self._spawn(task))
        return StartTaskResult(task_id=params.task_id, runtime_session_id=task.runtime.runtime_session_id,
                               implicit_sources=task.handle.implicit_sources, resume=task.handle.resume,
                               sent_hash=task.handle.sent_hash)

    def _spawn(self, task: _RunningTask) -> None:
        assert self._tasks_nursery is not None
        self._tasks_nursery.start_soon(self._run_task, task, name=f"task:{task.task_id}")

    async def _run_task(self, task: _RunningTask) -> None:
        assert task.handle is not None
        outcome: TaskOutcome | None = None
        recording.current.set(task.recorder)  # this task's context only: what its runtime's program says
        ended_processes.set(task.processes)
        try:
            with task.scope:
                outcome = await task.handle.run()
        except TaskEnded:
            log.exception("adapter emitted after the end of task %s", task.task_id)
        except Exception as exc:  # noqa: BLE001 - the adapter boundary: every error ends the task, logged there
            outcome = _outcome_of_error(task.task_id, exc)
        forced = outcome is None
        if outcome is None:  # cancelled by force after a stop request's grace period
            outcome = TaskOutcome.stop(task.stop_reason or "stopped")
        if task.stop_asked_at is not None and outcome.stopped is not None:
            outcome = replace(outcome, stopped=outcome.stopped.model_copy(update={"receipt": task.receipt(forced)}))
        try:
            if not task.ended:
                await task.finish(outcome)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            self.tasks.pop(task.task_id, None)
            if task.recorder is not None:
                task.recorder.close()

    def _active_task(self, task_id: str) -> _RunningTask:
        task = self.tasks.get(task_id)
        if task is None or task.ended:
            raise RpcFailure(ErrorCode.UNKNOWN_TASK, f"no active task {task_id!r} in this worker")
        assert task.handle is not None
        return task

    def _answer_tool(self, params: SendToolResultParams | SendToolDeniedParams | SendToolApprovedParams) -> Reply:
        task = self._active_task(params.task_id)
        handle = task.handle
        assert handle is not None
        if task.recorder is not None:
            answer = ("result" if isinstance(params, SendToolResultParams) else
                      "approved" if isinstance(params, SendToolApprovedParams) else "denied")
            task.recorder.write("answer", answer=answer, **params.to_json_obj())
        try:
            if isinstance(params, SendToolResultParams):
                handle.send_tool_result(params.tool_call_id, params.result, params.is_error)
            elif isinstance(params, SendToolApprovedParams):
                handle.send_tool_approved(params.tool_call_id, params.reason, params.scope)
            else:
                handle.send_tool_denied(params.tool_call_id, params.reason)
        except UnknownToolCall:
            raise RpcFailure(ErrorCode.UNKNOWN_TOOL_CALL, f"task {params.task_id!r} has no pending tool call "
                             f"{params.tool_call_id!r} (unknown or already answered)") from None
        return Ack()

    def _send_input(self, params: SendInputParams) -> Reply:
        """A user's input into a running task: the adapter says whether its runtime takes it in this turn."""
        task = self._active_task(params.task_id)
        assert task.handle is not None
        if task.stop_asked_at is not None:
            raise RpcFailure(ErrorCode.UNKNOWN_TASK, f"task {params.task_id!r} is being stopped: it takes no input")
        if params.input_id in task.input_ids:
            raise RpcFailure(ErrorCode.INVALID_PARAMS, f"input {params.input_id!r} was sent to this task already")
        task.input_ids.add(params.input_id)
        return SendInputResult(input_id=params.input_id, delivery=task.handle.send_input(params))
    def _answer_question(self, params: SendAnswerParams) -> Reply:
        task = self._active_task(params.task_id)
        handle = task.handle
        assert handle is not None
        if task.recorder is not None:
            task.recorder.write("answer", answer="question", **params.to_json_obj())
        try:
            handle.send_answer(params.question_id, QuestionAnswer(answers=dict(params.answers),
                                                                  declined=params.declined, reason=params.reason))
        except UnknownQuestion:
            raise RpcFailure(ErrorCode.UNKNOWN_QUESTION, f"task {params.task_id!r} has no pending question "
                             f"{params.question_id!r} (unknown or already answered)") from None
        return Ack()

    def _stop(self, params: StopParams) -> Reply:
        task = self._active_task(params.task_id)
        assert task.handle is not None
        self._request_stop(task, params.reason or "stop requested", grace_s=task.handle.stop_grace_s)
        return Ack()

    def _request_stop(self, task: _RunningTask, reason: str, grace_s: float) -> None:
        """Ask cooperatively; cancel by force once ``grace_s`` has passed (the scope's deadline)."""
        task.stop_reason = task.stop_reason or reason
        if task.stop_asked_at is None:
            task.stop_asked_at, task.stop_grace_s = trio.current_time(), grace_s
        assert task.handle is not None
        if task.recorder is not None:
            task.recorder.write("stop", reason=reason)
        task.handle.stop(reason)
        task.scope.deadline = min(task.scope.deadline, trio.current_time() + grace_s)

    def _ping(self, params: NoParams) -> Reply:
        """Liveness: answered at once, so a supervisor can tell a worker whose loop runs from a frozen one."""
        return Ack()

    def _shutdown(self, params: NoParams) -> Reply:
        self.shutting_down = True
        self._after_response.append(self._read_scope.cancel)
        return Ack()


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def _outcome_of_error(task_id: str, exc: Exception) -> TaskOutcome:
    """What an adapter's exception means for its task: a crashed runtime process, or an adapter error named by
    its real causes (never "Exceptions from Trio nursery")."""
    leaves = _leaves(exc)
    crashed = next((leaf for leaf in leaves if isinstance(leaf, RuntimeCrashed)), None)
    if crashed is not None:
        log.warning("task %s: %s", task_id, crashed)
        return crashed.outcome()
    log.error("task %s: runtime adapter raised", task_id, exc_info=exc)
    text = "; ".join(f"{type(leaf).__name__}: {leaf}" for leaf in leaves)
    return TaskOutcome.failure(TaskFailureCode.RUNTIME_ERROR, f"runtime adapter error: {text}", retryable=False)


def _frame_message(frame: BadFrame) -> str:
    return {
        ErrorCode.PARSE_ERROR: "Parse error",
        ErrorCode.INVALID_REQUEST: "Invalid Request",
        ErrorCode.FRAME_TOO_LARGE: "Frame too large",
    }[frame.error_code]
