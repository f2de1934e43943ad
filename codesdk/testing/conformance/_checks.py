"""The behaviours the worker protocol requires (docs/protocol.md), each a check run against a fresh worker.

A check gets a ``Target`` (how to start the worker under test), starts it through the test kit's driver, and
raises ``CheckFailed`` saying what it saw when the worker departs from the document. Anything else that goes
wrong (an error answer where a result was due, a wait that timed out, a worker that would not start) fails the
check the same way, with the driver's account of what happened.
"""

from __future__ import annotations

import enum
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import trio

from codesdk.protocol import (
    DEFAULT_MAX_FRAME_BYTES,
    ErrorCode,
    ErrorResponse,
    EventType,
    Method,
    ModelOutputCompleted,
)
from codesdk.worker.client import RpcError, WorkerStartError

from .._driver import (
    DrivenTask,
    DriverError,
    WorkerDriver,
    WorkerOutputEnded,
    WorkerTimedOut,
    namespace_env,
    open_worker,
)
from ..invariants import InvariantError, check_worker_events


class CheckFailed(AssertionError):
    """The worker under test departs from the protocol; the message says how."""


@dataclass(frozen=True)
class Target:
    """The worker under test: its command, the runtime that plays the conformance scenarios, the time a wait
    gives it, and a scratch directory for the namespace HOMEs of its runs."""

    command: Sequence[str]
    runtime: str = "scripted"
    timeout_s: float = 30.0
    scratch: Path = field(default_factory=lambda: Path("/tmp"))
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    cwd: Path | None = None  # None: the run's scratch HOME

    @asynccontextmanager
    async def worker(self, *, handshake: bool = True) -> AsyncIterator[WorkerDriver]:
        """A fresh worker in a scratch HOME of its own; shut down and reaped on leaving."""
        home = Path(tempfile.mkdtemp(prefix="home-", dir=self.scratch))
        # CODESDK_SCRIPTED_TEST_STEPS: CodeSDK's own worker plays `hang` only with its test steps on
        async with open_worker(self.command, env=namespace_env(home, scripted_test_steps=True),
                               cwd=self.cwd or home,
                               handshake=handshake, handshake_timeout_s=self.timeout_s,
                               name="worker under test") as driver:
            yield driver

    async def start(self, driver: WorkerDriver, scenario: str, prompt: str = "conformance", **options: Any,
                    ) -> DrivenTask:
        return await driver.start_task(prompt, runtime=self.runtime, scenario=scenario, timeout=self.timeout_s,
                                       **options)


@dataclass(frozen=True)
class Check:
    """One required behaviour: its name, the sections of docs/protocol.md it comes from, and the test."""

    name: str
    sections: str
    behaviour: str
    run: Callable[[Target], Awaitable[None]]
    #: Waits whose running out breaks this check's own rule (a FAIL), not only keeps it from being judged (an
    #: ERROR): e.g. a task that never ends, for the check of how tasks end.
    judged_by: tuple[type[Exception], ...] = ()


def _line(index: int | None) -> str:
    """A wire log index as people count lines (from 1)."""
    return "none" if index is None else str(index + 1)


def _expect(condition: bool, detail: str) -> None:
    if not condition:
        raise CheckFailed(detail)


async def _expect_error(driver: WorkerDriver, code: ErrorCode, method: str, params: dict[str, Any] | None,
                        timeout: float) -> Any:
    """Send a request the worker must refuse with ``code``; the error's ``data``."""
    try:
        result = await driver.request(method, params, timeout=timeout)
    except RpcError as exc:
        _expect(exc.code == code, f"{method} was refused with {exc.code} ({exc.message}); expected {int(code)} "
                                  f"{code.name}")
        return exc.data
    raise CheckFailed(f"{method} was accepted ({_short(result)}); expected error {int(code)} {code.name}")


async def _raw_answer(driver: WorkerDriver, line: bytes, request_id: int | str | None, code: ErrorCode,
                      timeout: float, what: str) -> None:
    """Send ``line`` as it is; the worker must answer it with error ``code`` carrying ``request_id``."""
    await driver.send_raw(line)
    answer = await driver.answer_to(request_id, timeout)
    _expect(isinstance(answer, ErrorResponse), f"{what}: answered with a result ({_short(answer)}); expected error "
                                               f"{int(code)} {code.name} with id {request_id!r}")
    assert isinstance(answer, ErrorResponse)
    _expect(answer.error.code == code, f"{what}: answered {answer.error.code} ({answer.error.message}); expected "
                                       f"{int(code)} {code.name} with id {request_id!r}")


def _answers_start_of(task_id: str, message: dict[str, Any]) -> bool:
    """Whether ``message`` is the success response to the ``runtime.startTask`` of ``task_id``."""
    result = message.get("result")
    return "method" not in message and isinstance(result, dict) and result.get("task_id") == task_id


def _texts(task: DrivenTask) -> list[str]:
    return [e.event.payload.text for e in task.events if isinstance(e.event.payload, ModelOutputCompleted)]


def _terminal_type(task: DrivenTask) -> str:
    terminal = task.terminal
    return terminal.event.type.value if terminal is not None else "none"


def _short(value: object, limit: int = 160) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


# --- the checks ---------------------------------------------------------------------------------------------


async def handshake(target: Target) -> None:
    async with target.worker() as driver:
        info = driver.info
        _expect(info.protocol_version.split(".")[0] == "1", f"protocol_version {info.protocol_version!r}: major 1 "
                                                            "expected")
        _expect(info.pid == driver.pid, f"pid {info.pid} in the result, but the process is {driver.pid}")
        offered = {runtime.name: runtime for runtime in info.runtimes}
        _expect(target.runtime in offered, f"runtime {target.runtime!r} not offered (offered: {sorted(offered)})")
        _expect(offered[target.runtime].available, f"runtime {target.runtime!r} is offered but not available")


async def before_initialize(target: Target) -> None:
    async with target.worker(handshake=False) as driver:
        await _expect_error(driver, ErrorCode.NOT_INITIALIZED, Method.START_TASK, {
            "runtime": target.runtime, "session": {"session_id": "s"}, "task_id": "t"}, target.timeout_s)
        await driver.initialize()


async def version_mismatch(target: Target) -> None:
    async with target.worker(handshake=False) as driver:
        data = await _expect_error(driver, ErrorCode.PROTOCOL_VERSION_MISMATCH, Method.INITIALIZE,
                                   {"protocol_version": "2.0"}, target.timeout_s)
        _expect(isinstance(data, dict) and isinstance(data.get("supported"), list) and data["supported"],
                f"-32003 must carry data.supported (the versions it speaks); got {_short(data)}")
        result = await driver.initialize()
        _expect(isinstance(result, dict) and str(result.get("protocol_version", "")).split(".")[0] == "1",
                f"initialize with 1.0 after a refused 2.0: {_short(result)}")


async def stdout_clean(target: Target) -> None:
    async with target.worker() as driver:
        for scenario in ("echo", "hang"):
            task = await target.start(driver, scenario)
            if scenario == "hang":
                await task.next_event(timeout=target.timeout_s)
                await task.stop("enough")
            await task.until_terminal(timeout=target.timeout_s)
        await driver.shutdown()
        bad = driver.wire.bad_lines()
        _expect(not bad, f"{len(bad)} line(s) on stdout that are not JSON-RPC 2.0 messages, e.g. line "
                         f"{bad[0].index + 1}: {bad[0].text()!r}" if bad else "")
        wrong = driver.violations  # answers to lines of our own are not among them (none are sent here)
        _expect(not wrong, f"{len(wrong)} protocol violation(s), e.g. {wrong[0].kind}: {wrong[0].detail}"
                if wrong else "")


async def response_before_events(target: Target) -> None:
    async with target.worker() as driver:
        for _ in range(3):
            task = await target.start(driver, "echo")
            await task.until_terminal(timeout=target.timeout_s)
            answered = driver.wire.first_index(partial(_answers_start_of, task.task_id))
            first = driver.wire.first_event_index(task.task_id)
            _expect(answered is not None and first is not None and answered < first,
                    f"task {task.task_id!r}: its first event is line {_line(first)} of stdout, the startTask "
                    f"response line {_line(answered)}: the response must come first")


async def event_stream(target: Target) -> None:
    async with target.worker() as driver:
        tasks = [await target.start(driver, "echo", prompt=f"conformance prompt {i}") for i in range(3)]
        for task in tasks:
            await task.until_terminal(timeout=target.timeout_s)
        try:
            check_worker_events(driver.received)
        except InvariantError as exc:
            raise CheckFailed("; ".join(exc.problems)) from None
        invalid = [v for v in driver.violations if v.kind == "invalid_event"]
        _expect(not invalid, f"{len(invalid)} event(s) refused as invalid, e.g. {invalid[0].detail}"
                if invalid else "")
        for i, task in enumerate(tasks):
            _expect(_terminal_type(task) == "task.completed", f"task {task.task_id!r} ended {_terminal_type(task)}")
            _expect(any(f"conformance prompt {i}" in text for text in _texts(task)),
                    f"task {task.task_id!r} (echo): no model.output.completed holds the prompt; texts: "
                    f"{_short(_texts(task))}")
            names = {e.event.runtime.name for e in task.events}
            _expect(names == {target.runtime}, f"task {task.task_id!r}: runtime.name {sorted(names)}, expected "
                                               f"{target.runtime!r}")


async def parallel_tool_calls(target: Target) -> None:
    async with target.worker() as driver:
        task = await target.start(driver, "parallel-tools")
        first = await task.next_event(EventType.TOOL_CALL_REQUESTED, timeout=target.timeout_s)
        second = await task.next_event(EventType.TOOL_CALL_REQUESTED, timeout=target.timeout_s)
        ids = [getattr(event.event.payload, "tool_call_id", None) for event in (first, second)]
        _expect(sorted(map(str, ids)) == ["call_a", "call_b"], f"tool calls {ids}; expected call_a and call_b")
        await task.send_result("call_b", {"text": "BEE-42"})
        await _expect_error(driver, ErrorCode.UNKNOWN_TOOL_CALL, Method.SEND_TOOL_RESULT,
                            {"task_id": task.task_id, "tool_call_id": "call_b", "result": {"text": "again"}},
                            target.timeout_s)
        await _expect_error(driver, ErrorCode.UNKNOWN_TOOL_CALL, Method.SEND_TOOL_RESULT,
                            {"task_id": task.task_id, "tool_call_id": "call_zzz", "result": None}, target.timeout_s)
        await task.send_result("call_a", {"text": "AYE-17"})
        await task.until_terminal(timeout=target.timeout_s)
        _expect(_terminal_type(task) == "task.completed", f"ended {_terminal_type(task)}, expected task.completed")
        _expect(any("AYE-17" in text and "BEE-42" in text for text in _texts(task)),
                f"no model.output.completed quotes both results; texts: {_short(_texts(task))}")
        await _expect_error(driver, ErrorCode.UNKNOWN_TASK, Method.SEND_TOOL_RESULT,
                            {"task_id": task.task_id, "tool_call_id": "call_a", "result": None}, target.timeout_s)


async def denial(target: Target) -> None:
    async with target.worker() as driver:
        task = await target.start(driver, "write-or-deny")
        requested = await task.next_event(EventType.TOOL_CALL_REQUESTED, timeout=target.timeout_s)
        call = getattr(requested.event.payload, "tool_call_id", "")
        _expect(call == "call_write", f"tool call {call!r}; expected call_write")
        await task.deny(call, "conformance says no")
        await task.until_terminal(timeout=target.timeout_s)
        _expect(_terminal_type(task) == "task.completed", f"ended {_terminal_type(task)} after a denial, expected "
                                                          "task.completed")
        _expect(any("conformance says no" in text for text in _texts(task)),
                f"the denial's reason reached no model output; texts: {_short(_texts(task))}")


async def stop(target: Target) -> None:
    async with target.worker() as driver:
        task = await target.start(driver, "hang")
        await task.next_event(timeout=target.timeout_s)
        acknowledged = await task.stop("conformance stop")
        _expect(acknowledged == {"ok": True}, f"runtime.stop answered {_short(acknowledged)}; expected {{'ok': true}}")
        await task.until_terminal(timeout=target.timeout_s)
        terminal = task.terminal
        assert terminal is not None
        _expect(terminal.event.type == EventType.TASK_STOPPED, f"ended {terminal.event.type.value}, expected "
                                                               "task.stopped")
        reason = getattr(terminal.event.payload, "reason", None)
        _expect(reason == "conformance stop", f"task.stopped reason {reason!r}, expected 'conformance stop'")
        await _expect_error(driver, ErrorCode.UNKNOWN_TASK, Method.STOP, {"task_id": task.task_id},
                            target.timeout_s)


async def steering(target: Target) -> None:
    async with target.worker() as driver:
        task = await target.start(driver, "hang")
        await task.next_event(timeout=target.timeout_s)
        answer = await driver.request(Method.SEND_INPUT, {"task_id": task.task_id, "input_id": "in-1",
                                                          "input": "conformance input"}, timeout=target.timeout_s)
        _expect(isinstance(answer, dict) and answer.get("input_id") == "in-1"
                and answer.get("delivery") in ("mid_turn", "queued"),
                f"runtime.sendInput answered {_short(answer)}; expected {{'input_id': 'in-1', 'delivery': "
                "'mid_turn' or 'queued'}")
        for params in ({"task_id": task.task_id, "input_id": "in-1", "input": "again"},
                       {"task_id": task.task_id, "input_id": "in-2", "input": "  "}):
            await _expect_error(driver, ErrorCode.INVALID_PARAMS, Method.SEND_INPUT, params, target.timeout_s)
        await task.stop()
        await task.until_terminal(timeout=target.timeout_s)
        await _expect_error(driver, ErrorCode.UNKNOWN_TASK, Method.SEND_INPUT,
                            {"task_id": task.task_id, "input_id": "in-3", "input": "late"}, target.timeout_s)
    appended = [e.event.payload for e in task.events if e.event.type == EventType.MODEL_INPUT_APPENDED]
    _expect(all(getattr(p, "input_id", None) == "in-1" for p in appended) and len(appended) <= 1,
            f"model.input.appended must report the input sent, once; got {_short([p.to_json_obj() for p in appended])}")


async def refusals(target: Target) -> None:
    async with target.worker() as driver:
        task = await target.start(driver, "hang", task_id="busy", session_id="busy-session")
        await task.next_event(timeout=target.timeout_s)
        start = {"runtime": target.runtime, "runtime_config": {"scenario": "echo"}}
        await _expect_error(driver, ErrorCode.DUPLICATE_TASK, Method.START_TASK,
                            {**start, "session": {"session_id": "other"}, "task_id": "busy"}, target.timeout_s)
        data = await _expect_error(driver, ErrorCode.SESSION_BUSY, Method.START_TASK,
                                   {**start, "session": {"session_id": "busy-session"}, "task_id": "second"},
                                   target.timeout_s)
        _expect(isinstance(data, dict) and data.get("active_task_id") == "busy",
                f"-32007 must name the active task in data.active_task_id; got {_short(data)}")
        data = await _expect_error(driver, ErrorCode.UNKNOWN_RUNTIME, Method.START_TASK,
                                   {**start, "runtime": "no-such-runtime", "session": {"session_id": "x"},
                                    "task_id": "x"}, target.timeout_s)
        _expect(isinstance(data, dict) and target.runtime in (data.get("known") or []),
                f"-32004 must list the known runtimes in data.known; got {_short(data)}")
        await _expect_error(driver, ErrorCode.INVALID_PARAMS, Method.START_TASK,
                            {**start, "session": {"session_id": "y"}, "task_id": "y", "surprise": 1},
                            target.timeout_s)
        await task.stop()
        await task.until_terminal(timeout=target.timeout_s)


async def hostile_frames(target: Target) -> None:
    async with target.worker() as driver:
        timeout = target.timeout_s
        await _raw_answer(driver, b"this is not json\n", None, ErrorCode.PARSE_ERROR, timeout, "a line of text")
        await _raw_answer(driver, b'{"jsonrpc":"2.0","id":7,"id":8,"method":"runtime.stop"}\n', None,
                          ErrorCode.PARSE_ERROR, timeout, "a duplicate key")
        await _raw_answer(driver, b'{"jsonrpc":"2.0","id":9,"method":"runtime.stop","params":{"task_id":NaN}}\n',
                          None, ErrorCode.PARSE_ERROR, timeout, "NaN")
        await _raw_answer(driver, b"\xff\xfe not utf-8\n", None, ErrorCode.PARSE_ERROR, timeout, "bytes that are "
                                                                                                   "not UTF-8")
        await _raw_answer(driver, b"[]\n", None, ErrorCode.INVALID_REQUEST, timeout, "a batch")
        await _raw_answer(driver, b"5\n", None, ErrorCode.INVALID_REQUEST, timeout, "a number")
        await _raw_answer(driver, b'{"jsonrpc":"2.0","id":"m1","method":"runtime.noSuchMethod"}\n', "m1",
                          ErrorCode.METHOD_NOT_FOUND, timeout, "an unknown method")
        await _raw_answer(driver, b'{"jsonrpc":"2.0","id":"p1","method":"runtime.stop","params":{"task_id":1}}\n',
                          "p1", ErrorCode.INVALID_PARAMS, timeout, "params of the wrong type")
        await _raw_answer(driver, b'{"jsonrpc":"2.0","id":"p2","method":"runtime.stop","params":{"task_id":"t",'
                                  b'"extra":1}}\n', "p2", ErrorCode.INVALID_PARAMS, timeout, "an unknown field")
        oversized = b'{"jsonrpc":"2.0","id":"big","method":"runtime.stop","params":{"task_id":"' \
            + b"x" * (target.max_frame_bytes + 1024) + b'"}}\n'
        await _raw_answer(driver, oversized, None, ErrorCode.FRAME_TOO_LARGE, timeout,
                          f"a line over the frame limit ({target.max_frame_bytes} bytes)")
        await driver.send_raw(b"   \t \n")  # whitespace only: skipped, never answered
        await _raw_answer(driver, b'{"jsonrpc":"2.0","id":"crlf","method":"runtime.noSuchMethod"}\r\n', "crlf",
                          ErrorCode.METHOD_NOT_FOUND, timeout, "a request ended by CRLF")
        task = await target.start(driver, "echo", prompt="still serving")
        await task.until_terminal(timeout=timeout)
        _expect(_terminal_type(task) == "task.completed", f"after the hostile lines, an echo task ended "
                                                          f"{_terminal_type(task)}")
        stray = [r for r in driver.process.connection.unmatched]
        _expect(not stray, f"answers nobody asked for (the whitespace line must be skipped): {_short(stray)}")


async def shutdown(target: Target) -> None:
    async with target.worker() as driver:
        task = await target.start(driver, "hang")
        await task.next_event(timeout=target.timeout_s)
        acknowledged = await driver.request(Method.SHUTDOWN, None, timeout=target.timeout_s)
        _expect(acknowledged == {"ok": True}, f"runtime.shutdown answered {_short(acknowledged)}")
        await _stopped_by_shutdown(task, target)
        status = await driver.wait_exit(target.timeout_s)
        _expect(status.exit_code == 0, f"after runtime.shutdown the worker {status.describe()}; expected exit 0")


async def stdin_eof(target: Target) -> None:
    async with target.worker() as driver:
        task = await target.start(driver, "hang")
        await task.next_event(timeout=target.timeout_s)
        await driver.close_input()
        await _stopped_by_shutdown(task, target)
        status = await driver.wait_exit(target.timeout_s)
        _expect(status.exit_code == 0, f"after stdin closed the worker {status.describe()}; expected exit 0")


async def _stopped_by_shutdown(task: DrivenTask, target: Target) -> None:
    await task.until_terminal(timeout=target.timeout_s)
    terminal = task.terminal
    assert terminal is not None
    reason = getattr(terminal.event.payload, "reason", None)
    _expect(terminal.event.type == EventType.TASK_STOPPED and reason == "worker shutting down",
            f"the task in flight ended {terminal.event.type.value} (reason {reason!r}); expected task.stopped "
            "'worker shutting down'")


CHECKS: tuple[Check, ...] = (
    Check("handshake", "§2.2 §3.1", "runtime.initialize answers its own version, its pid and the runtime", handshake,
          judged_by=(WorkerStartError, DriverError)),
    Check("before-initialize", "§2.2", "requests before runtime.initialize are refused -32002", before_initialize),
    Check("version-mismatch", "§2.2", "another major version is refused -32003 with data.supported",
          version_mismatch),
    Check("stdout-clean", "§1.1 §2.1 §10.W1", "stdout carries JSON-RPC messages only", stdout_clean),
    Check("response-before-events", "§3.3 §5.2", "the startTask response precedes the task's events",
          response_before_events),
    Check("event-stream", "§4 §5.3 §5.4", "n from 1 without gaps, valid events, one terminal event, last",
          event_stream, judged_by=(WorkerTimedOut,)),
    Check("parallel-tool-calls", "§3.4 §7", "two calls answered out of order; a second answer -32009",
          parallel_tool_calls),
    Check("denial", "§3.5 §7", "a denied call takes the denied branch and the task completes", denial),
    Check("stop", "§3.6 §8", "runtime.stop is acknowledged; the task ends task.stopped with its reason", stop,
          judged_by=(WorkerTimedOut,)),
    Check("steering", "§3.5b", "runtime.sendInput says how a running task takes an input; a repeated id or an empty "
                               "input -32602, an ended task -32008", steering, judged_by=(WorkerTimedOut,)),
    Check("refusals", "§3.3 §6.2", "duplicate task -32006, busy session -32007, unknown runtime -32004, "
                                   "unknown field -32602", refusals),
    Check("hostile-frames", "§1.2 §1.3 §1.4 §6.2", "bad lines get the right error and the worker keeps serving",
          hostile_frames),
    Check("shutdown", "§2.4 §3.7", "runtime.shutdown stops tasks in flight and exits 0", shutdown,
          judged_by=(WorkerOutputEnded, WorkerTimedOut)),
    Check("stdin-eof", "§2.4", "stdin EOF stops tasks in flight and exits 0", stdin_eof,
          judged_by=(WorkerOutputEnded, WorkerTimedOut)),
)


class Verdict(enum.Enum):
    PASS = "PASS"
    FAIL = "FAIL"  # the worker broke the check's rule
    ERROR = "ERROR"  # the worker did not get far enough for the rule to be judged (it timed out, ended, died)
    SKIP = "SKIP"  # not run: the worker cannot complete a handshake, which every check begins with


async def run_check(check: Check, target: Target) -> tuple[Verdict, str | None]:
    """The verdict on ``check``, and what the worker did wrong (None when it passed)."""
    try:
        with trio.fail_after(target.timeout_s * 6):  # each wait is bounded; this bounds the whole check
            await check.run(target)
    except CheckFailed as exc:
        return Verdict.FAIL, str(exc)
    except trio.TooSlowError:
        return Verdict.ERROR, f"the check did not finish within {target.timeout_s * 6:g} s"
    except Exception as exc:  # noqa: BLE001 - any other failure is the worker's, reported with what happened
        while isinstance(exc, ExceptionGroup) and len(exc.exceptions) == 1:
            exc = exc.exceptions[0]
        if isinstance(exc, WorkerStartError | DriverError) and not isinstance(exc, check.judged_by):
            return Verdict.ERROR, f"could not judge it: {type(exc).__name__}: {exc}"
        return Verdict.FAIL, f"{type(exc).__name__}: {exc}"
    return Verdict.PASS, None
