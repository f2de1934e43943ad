"""Drive any worker command over its pipes, as the supervisor does: for adapter tests, runtime upgrades, and
workers written in other languages.

The driver is the supervisor's own worker client (``supervisor.workers``: spawn in a session of its own,
handshake, strict reading, teardown that reaps the whole tree) with what a test needs on top: every event kept per
task, waits that fail with what was seen instead of hanging, tool calls answered by hand or by a policy, and a log
of every line on the wire in arrival order.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from codesdk.protocol import (
    DEFAULT_MAX_FRAME_BYTES,
    PROTOCOL_VERSION,
    TERMINAL_EVENT_TYPES,
    ErrorResponse,
    EventType,
    ExitStatus,
    InitializeResult,
    Method,
    PermissionMode,
    Response,
    RuntimeEventParams,
    ToolCallRequested,
)
from codesdk.worker.client import ProtocolViolation, WorkerBroken, WorkerProcess, WorkerSpec, worker_argv

from ._wire import WireLog

#: Seconds a wait of the driver gives the worker by default before it fails with what it saw.
DEFAULT_TIMEOUT_S = 30.0
#: How the supervisor's connection files a response to no request of its own: after ``send_raw``, the answers to
#: the test's own lines.
_ANSWERS_TO_RAW_LINES = frozenset({"unmatched_response", "error_without_id"})


class DriverError(AssertionError):
    """The worker under test did not do what the test waited for (an AssertionError, so pytest reports it as a
    failed expectation with the driver's account of what happened)."""


class WorkerTimedOut(DriverError):
    """Nothing the test waited for arrived in time."""


class WorkerOutputEnded(DriverError):
    """The worker's output ended (it exited or crashed) before what the test waited for."""


@dataclass(frozen=True)
class ToolAnswer:
    """How to answer one ``tool.call.requested``: a result, a denial, or (for a call the runtime executes itself)
    an approval. Build with ``ToolAnswer.result(...)``, ``.deny(...)``, ``.approve(...)``."""

    kind: str
    value: Any = None
    is_error: bool = False
    reason: str = ""

    @classmethod
    def result(cls, value: Any, *, is_error: bool = False) -> ToolAnswer:
        return cls("result", value=value, is_error=is_error)

    @classmethod
    def deny(cls, reason: str = "denied") -> ToolAnswer:
        return cls("deny", reason=reason)

    @classmethod
    def approve(cls, reason: str = "approved") -> ToolAnswer:
        return cls("approve", reason=reason)


#: Decides the answer to each tool call a task requests (``DrivenTask.until_terminal(answer=...)``).
ToolPolicy = Callable[[ToolCallRequested], ToolAnswer | Awaitable[ToolAnswer]]


def namespace_env(home: Path, *, scripted_test_steps: bool = True, extra: Mapping[str, str] | None = None,
                  ) -> dict[str, str]:
    """A worker environment built from scratch, as the supervisor builds a namespace's: ``HOME``, the XDG
    directories and ``TMPDIR`` under ``home`` (made here), ``PATH`` and a UTF-8 locale; with
    ``scripted_test_steps``, the scripted runtime's fault-injection steps are allowed."""
    dirs = {"XDG_CONFIG_HOME": ".config", "XDG_STATE_HOME": ".local/state", "XDG_CACHE_HOME": ".cache",
            "XDG_DATA_HOME": ".local/share", "TMPDIR": "tmp"}
    env = {"HOME": str(home), "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
           "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
    for name, relative in dirs.items():
        path = home / relative
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        env[name] = str(path)
    if scripted_test_steps:
        env["CODESDK_SCRIPTED_TEST_STEPS"] = "1"
    env.update(extra or {})
    return env


class DrivenTask:
    """One task started through a ``WorkerDriver``: its events as they arrive, and what a test does to it."""

    def __init__(self, driver: WorkerDriver, task_id: str, session_id: str, accepted: Any) -> None:
        self.driver = driver
        self.task_id = task_id
        self.session_id = session_id
        #: The ``runtime.startTask`` result as the worker sent it.
        self.accepted = accepted
        self._cursor = 0  # the first event ``next_event`` has not looked at

    @property
    def events(self) -> list[RuntimeEventParams]:
        """Every event of the task received so far, in arrival order."""
        return list(self.driver._by_task[self.task_id])

    @property
    def terminal(self) -> RuntimeEventParams | None:
        """The task's terminal event, once it arrived."""
        return self.driver._terminals.get(self.task_id)

    async def next_event(self, *types: EventType, timeout: float = DEFAULT_TIMEOUT_S) -> RuntimeEventParams:
        """The next event of the task (of one of ``types``, if given) after those this method returned before."""
        wanted = " or ".join(t.value for t in types) or "event"
        with trio.move_on_after(timeout):
            while True:
                events = self.driver._by_task[self.task_id]
                while self._cursor < len(events):
                    event = events[self._cursor]
                    self._cursor += 1
                    if not types or event.event.type in types:
                        return event
                if self.driver._output_ended:
                    raise WorkerOutputEnded(self.driver.account(f"the worker's output ended before a {wanted} of "
                                                                f"task {self.task_id!r}", self.task_id))
                await self.driver._wait_for_events()
        raise WorkerTimedOut(self.driver.account(f"no {wanted} of task {self.task_id!r} within {timeout:g} s",
                                                 self.task_id))

    async def until_terminal(self, answer: ToolPolicy | None = None,
                             timeout: float = DEFAULT_TIMEOUT_S) -> list[RuntimeEventParams]:
        """Wait for the terminal event and return all the task's events. With ``answer``, every tool call the task
        requests meanwhile is answered as the policy decides; without, the test answers them itself (a call left
        unanswered makes this time out, and the failure names it)."""
        scanned = 0  # events already looked at for tool calls to answer
        with trio.move_on_after(timeout):
            while self.terminal is None:
                if answer is not None:
                    events = self.driver._by_task[self.task_id]
                    while scanned < len(events):  # also what arrives while an answer is being sent
                        payload = events[scanned].event.payload
                        scanned += 1
                        if isinstance(payload, ToolCallRequested) \
                                and payload.tool_call_id not in self.driver._answered[self.task_id]:
                            decided = answer(payload)
                            if isinstance(decided, Awaitable):
                                decided = await decided
                            if not isinstance(decided, ToolAnswer):
                                raise TypeError(f"the policy answered tool call {payload.tool_call_id!r} with "
                                                f"{decided!r}: return a ToolAnswer (ToolAnswer.result(...), "
                                                ".deny(reason) or .approve())")
                            await self.answer(payload.tool_call_id, decided)
                if self.terminal is not None:
                    break
                if self.driver._output_ended:
                    raise WorkerOutputEnded(self.driver.account(
                        f"the worker's output ended before task {self.task_id!r} ended", self.task_id))
                await self.driver._wait_for_events()
            return self.events
        pending = self.pending_tool_calls()
        hint = f"; tool calls still unanswered: {', '.join(pending)}" if pending else ""
        raise WorkerTimedOut(self.driver.account(f"task {self.task_id!r} did not end within {timeout:g} s{hint}",
                                                 self.task_id))

    def pending_tool_calls(self) -> list[str]:
        """Ids of the tool calls requested and not yet answered through this driver."""
        requested = [e.event.payload.tool_call_id for e in self.driver._by_task[self.task_id]
                     if isinstance(e.event.payload, ToolCallRequested)]
        return [call for call in requested if call not in self.driver._answered[self.task_id]]

    async def answer(self, tool_call_id: str, answer: ToolAnswer) -> Any:
        """Send ``answer`` for one pending call; the worker's acknowledgement (``RpcError`` if it refused)."""
        params: dict[str, Any] = {"task_id": self.task_id, "tool_call_id": tool_call_id}
        if answer.kind == "result":
            method, params = Method.SEND_TOOL_RESULT, {**params, "result": answer.value, "is_error": answer.is_error}
        elif answer.kind == "deny":
            method, params = Method.SEND_TOOL_DENIED, {**params, "reason": answer.reason}
        else:
            method, params = Method.SEND_TOOL_APPROVED, {**params, "reason": answer.reason}
        acknowledged = await self.driver.request(method, params)
        self.driver._answered[self.task_id].add(tool_call_id)
        return acknowledged

    async def send_result(self, tool_call_id: str, value: Any, *, is_error: bool = False) -> Any:
        return await self.answer(tool_call_id, ToolAnswer.result(value, is_error=is_error))

    async def deny(self, tool_call_id: str, reason: str = "denied") -> Any:
        return await self.answer(tool_call_id, ToolAnswer.deny(reason))

    async def approve(self, tool_call_id: str, reason: str = "approved") -> Any:
        return await self.answer(tool_call_id, ToolAnswer.approve(reason))

    async def send_input(self, text: Any, input_id: str = "in-1") -> Any:
        """``runtime.sendInput``: a user's input into the running task; answered with how it will be delivered."""
        return await self.driver.request(Method.SEND_INPUT, {"task_id": self.task_id, "input_id": input_id,
                                                             "input": text})

    async def stop(self, reason: str | None = None) -> Any:
        """``runtime.stop``: the acknowledgement means the stop was requested; wait with ``until_terminal``."""
        params: dict[str, Any] = {"task_id": self.task_id}
        if reason is not None:
            params["reason"] = reason
        return await self.driver.request(Method.STOP, params)


class WorkerDriver:
    """A worker process and everything it sent. Get one with ``open_worker``; its events are collected all
    along, as the supervisor's pool does (a worker whose output is not read stalls)."""

    def __init__(self, process: WorkerProcess, wire: WireLog) -> None:
        self.process = process
        #: Every line the worker wrote, in arrival order.
        self.wire = wire
        #: Every event the worker sent, in arrival order.
        self.received: list[RuntimeEventParams] = []
        self._by_task: defaultdict[str, list[RuntimeEventParams]] = defaultdict(list)
        # Each task's first terminal event, noted as it arrives: ``until_terminal`` asks after every wakeup, and a
        # scan of the task's events per ask made a flood of 20,000 events take ~40 s instead of ~1.5 s.
        self._terminals: dict[str, RuntimeEventParams] = {}
        self._answered: defaultdict[str, set[str]] = defaultdict(set)
        self._sent_raw = False
        self._arrived = trio.Event()
        self._output_ended = False
        self._tasks = 0

    @property
    def info(self) -> InitializeResult:
        """The worker's ``runtime.initialize`` result."""
        if self.process.info is None:
            raise DriverError("no handshake yet: call initialize() (the worker was opened with handshake=False)")
        return self.process.info

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def stderr(self) -> str:
        """The last 64 KiB the worker wrote on stderr."""
        return self.process.stderr.text()

    @property
    def violations(self) -> list[ProtocolViolation]:
        """What the worker wrote that breaks the protocol (bad lines, invalid events, stray messages). Once the test
        sent lines of its own (``send_raw``), responses the driver cannot match to a request of its own are the
        answers to those (read them with ``answer_to``), not violations: they are left out."""
        found = list(self.process.connection.stats.recent_violations)
        if self._sent_raw:
            found = [v for v in found if v.kind not in _ANSWERS_TO_RAW_LINES]
        return found

    async def initialize(self, protocol_version: str = PROTOCOL_VERSION, **params: Any) -> Any:
        """Send ``runtime.initialize`` (for a worker opened with ``handshake=False``); its raw result."""
        return await self.request(Method.INITIALIZE, {"protocol_version": protocol_version, **params})

    async def request(self, method: str, params: Mapping[str, Any] | None = None, *,
                      timeout: float = DEFAULT_TIMEOUT_S) -> Any:
        """Send one request and return the worker's raw result (``RpcError`` when it answers with an error)."""
        with trio.move_on_after(timeout):
            try:
                return await self.process.connection.request(str(method),
                                                             dict(params) if params is not None else None)
            except WorkerBroken as exc:
                raise WorkerOutputEnded(self.account(f"the worker's output ended before it answered {method}")) \
                    from exc
        raise WorkerTimedOut(self.account(f"no answer to {method} within {timeout:g} s"))

    async def send_raw(self, data: bytes) -> None:
        """Write bytes to the worker's stdin as they are: a hostile line, a torn frame."""
        self._sent_raw = True
        await self.process.connection.send_raw(data)

    async def answer_to(self, request_id: int | str | None, timeout: float = DEFAULT_TIMEOUT_S,
                        ) -> Response | ErrorResponse:
        """The response with ``request_id`` to a line sent with ``send_raw`` (``None``: an error about a line whose
        id could not be read)."""
        with trio.move_on_after(timeout):
            try:
                return await self.process.connection.wait_unmatched(request_id)
            except WorkerBroken as exc:  # as ``request``: the driver's account, not the connection's bare error
                raise WorkerOutputEnded(self.account(f"the worker's output ended before a response with id "
                                                     f"{request_id!r}")) from exc
        raise WorkerTimedOut(self.account(f"no response with id {request_id!r} within {timeout:g} s"))

    async def start_task(self, prompt: str = "hello", *, runtime: str = "scripted", scenario: str | None = None,
                         task_id: str | None = None, session_id: str | None = None,
                         runtime_session_id: str | None = None, workspace: str | Path | None = None,
                         tools: Sequence[Mapping[str, Any]] = (), runtime_config: Mapping[str, Any] | None = None,
                         permission_mode: PermissionMode = PermissionMode.ASK,
                         messages: Sequence[Mapping[str, Any]] | None = None,
                         timeout: float = DEFAULT_TIMEOUT_S) -> DrivenTask:
        """``runtime.startTask`` with what a test usually means (a prompt; a scenario of the scripted runtime);
        returns the task once the worker accepted it (``RpcError`` when it refused)."""
        self._tasks += 1
        task_id = task_id or f"task-{self._tasks}"
        session_id = session_id or f"session-{task_id}"
        config = dict(runtime_config or {})
        if scenario is not None:
            config["scenario"] = scenario
        session: dict[str, Any] = {"session_id": session_id}
        if runtime_session_id is not None:
            session["runtime_session_id"] = runtime_session_id
        params: dict[str, Any] = {
            "runtime": runtime, "session": session, "task_id": task_id, "runtime_config": config,
            "messages": list(messages) if messages is not None else [
                {"role": "user", "blocks": [{"type": "text", "text": prompt}]}],
            "tool_manifest": {"tools": [dict(tool) for tool in tools]},
            "permission_mode": permission_mode.value,
        }
        if workspace is not None:
            params["workspace"] = str(workspace)
        accepted = await self.request(Method.START_TASK, params, timeout=timeout)
        return DrivenTask(self, task_id, session_id, accepted)

    def task(self, task_id: str, session_id: str = "") -> DrivenTask:
        """The events of a task started some other way (a raw ``request`` or ``send_raw``)."""
        return DrivenTask(self, task_id, session_id, None)

    async def shutdown(self, grace_s: float = 5.0) -> ExitStatus:
        """``runtime.shutdown``, then close stdin, then SIGTERM and SIGKILL as needed; the worker's whole process
        tree is gone and reaped on return."""
        return await self.process.shutdown(grace_s=grace_s)

    async def close_input(self) -> None:
        """Close the worker's stdin (a worker treats EOF as a shutdown request)."""
        await self.process.connection.close_input()

    async def wait_exit(self, timeout: float = DEFAULT_TIMEOUT_S) -> ExitStatus:
        """The worker's exit status, once it exited by itself."""
        with trio.move_on_after(timeout):
            return await self.process.wait_exit()
        raise WorkerTimedOut(self.account(f"the worker did not exit within {timeout:g} s"))

    async def until_output_ends(self, timeout: float = DEFAULT_TIMEOUT_S) -> list[RuntimeEventParams]:
        """Wait until the worker's output ended (it closed its stdout: it exited, crashed or was killed) and every
        event it sent was collected; return them all, in arrival order. For a test that ends a worker and asserts
        on everything it sent: after ``wait_exit`` alone, events read just before the end may not be collected
        yet."""
        with trio.move_on_after(timeout):
            while not self._output_ended:
                await self._wait_for_events()
            return list(self.received)
        raise WorkerTimedOut(self.account(f"the worker's output did not end within {timeout:g} s"))

    def account(self, what: str, task_id: str | None = None) -> str:
        """``what`` went wrong, with what the worker did: the task's events, protocol violations, stderr tail."""
        lines = [what]
        if task_id is not None:
            events = self._by_task[task_id]
            lines.append(f"events of {task_id!r} so far ({len(events)}): "
                         + (", ".join(f"{e.n}:{e.event.type.value}" for e in events[-30:]) or "none"))
        if violations := self.violations:
            lines.append("protocol violations: " + "; ".join(f"{v.kind}: {v.detail}" for v in violations[-5:]))
        if tail := self.stderr.strip():
            lines.append("stderr (last lines): " + " | ".join(tail.splitlines()[-8:]))
        return "\n  ".join(lines)

    async def _collect(self) -> None:
        try:
            async for wire in self.process.connection.events:
                params = wire.model()  # the kit hands its users the protocol's models
                self.received.append(params)
                self._by_task[params.task_id].append(params)
                if params.event.type in TERMINAL_EVENT_TYPES:
                    self._terminals.setdefault(params.task_id, params)
                # Wake every waiter, then arm a fresh event: the waiters of two tasks awaited at once both wake
                # (a waiter that armed its own event would orphan the other's, which then slept to its timeout).
                self._arrived.set()
                self._arrived = trio.Event()
        finally:
            self._output_ended = True
            self._arrived.set()  # left set: a wait after the end returns at once (its caller sees _output_ended)

    async def _wait_for_events(self) -> None:
        """Until more events arrive or the output ends. Callers check what they wait for first, with no checkpoint
        in between, so nothing that arrives can be missed."""
        await self._arrived.wait()


@asynccontextmanager
async def open_worker(command: Sequence[str] | None = None, *, env: Mapping[str, str] | None = None,
                      home: Path | None = None, cwd: str | Path | None = None, handshake: bool = True,
                      handshake_timeout_s: float = DEFAULT_TIMEOUT_S,
                      max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES, scripted_test_steps: bool = True,
                      name: str = "worker under test") -> AsyncIterator[WorkerDriver]:
    """Start ``command`` (default: CodeSDK's own ``codesdk-worker``) as a worker and drive it; on leaving the
    block it is shut down and its whole process tree reaped, however the block ends.

    ``env`` is the worker's whole environment (nothing is inherited); without it, ``namespace_env(home)`` — a
    scratch HOME (made and removed here when ``home`` is None). ``handshake=False`` leaves ``runtime.initialize``
    to the test. A worker that fails its handshake raises ``WorkerStartError`` with its stderr tail."""
    scratch = None
    if env is None and home is None:
        home = scratch = Path(tempfile.mkdtemp(prefix="codesdk-worker-home-"))
    wire = WireLog()
    try:
        if env is None:
            assert home is not None
            env = namespace_env(home, scripted_test_steps=scripted_test_steps)
        argv = tuple(command) if command else worker_argv()
        if os.sep in argv[0]:  # a path relative to where the test runs, not to the worker's directory
            argv = (os.path.abspath(argv[0]), *argv[1:])
        spec = WorkerSpec(argv=argv, env=dict(env),
                          cwd=str(cwd if cwd is not None else home or "/"), name=name,
                          max_frame_bytes=max_frame_bytes, wire_tap=wire.record)
        try:
            async with trio.open_nursery() as nursery:
                process = await WorkerProcess.start(nursery, spec, handshake_timeout_s, handshake=handshake)
                driver = WorkerDriver(process, wire)
                nursery.start_soon(driver._collect)
                try:
                    yield driver
                finally:
                    await driver.shutdown()
                    nursery.cancel_scope.cancel()
        except BaseExceptionGroup as group:  # the test's own exception (or the start's), not a group of one
            if len(group.exceptions) != 1 or isinstance(group.exceptions[0], BaseExceptionGroup):
                raise
            leaf = group.exceptions[0]
            leaf.__suppress_context__ = True
            raise leaf
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
