"""The driver for code without trio (plain pytest, a script): the worker is driven by a trio loop in a thread of
its own, and every call blocks until that loop has done it."""

from __future__ import annotations

import queue
import threading
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from functools import partial
from typing import Any, TypeVar

import trio

from codesdk.protocol import (
    PROTOCOL_VERSION,
    ErrorResponse,
    EventType,
    ExitStatus,
    InitializeResult,
    Response,
    RuntimeEventParams,
)
from codesdk.worker.client import ProtocolViolation

from ._driver import DEFAULT_TIMEOUT_S, DrivenTask, ToolAnswer, ToolPolicy, WorkerDriver, open_worker
from ._wire import WireLog

_T = TypeVar("_T")


class SyncTask:
    """``DrivenTask`` with blocking methods."""

    def __init__(self, task: DrivenTask, call: Callable[[Callable[[], Awaitable[Any]]], Any]) -> None:
        self._task = task
        self._call = call
        self.task_id = task.task_id
        self.session_id = task.session_id
        self.accepted = task.accepted

    @property
    def events(self) -> list[RuntimeEventParams]:
        return self._task.events

    @property
    def terminal(self) -> RuntimeEventParams | None:
        return self._task.terminal

    def next_event(self, *types: EventType, timeout: float = DEFAULT_TIMEOUT_S) -> RuntimeEventParams:
        result: RuntimeEventParams = self._call(partial(self._task.next_event, *types, timeout=timeout))
        return result

    def until_terminal(self, answer: ToolPolicy | None = None,
                       timeout: float = DEFAULT_TIMEOUT_S) -> list[RuntimeEventParams]:
        result: list[RuntimeEventParams] = self._call(partial(self._task.until_terminal, answer, timeout))
        return result

    def answer(self, tool_call_id: str, answer: ToolAnswer) -> Any:
        return self._call(partial(self._task.answer, tool_call_id, answer))

    def send_result(self, tool_call_id: str, value: Any, *, is_error: bool = False) -> Any:
        return self.answer(tool_call_id, ToolAnswer.result(value, is_error=is_error))

    def deny(self, tool_call_id: str, reason: str = "denied") -> Any:
        return self.answer(tool_call_id, ToolAnswer.deny(reason))

    def approve(self, tool_call_id: str, reason: str = "approved") -> Any:
        return self.answer(tool_call_id, ToolAnswer.approve(reason))

    def stop(self, reason: str | None = None) -> Any:
        return self._call(partial(self._task.stop, reason))


class SyncWorkerDriver:
    """``WorkerDriver`` with blocking methods. Get one with ``run_worker``."""

    def __init__(self, driver: WorkerDriver, token: trio.lowlevel.TrioToken) -> None:
        self._driver = driver
        self._token = token

    def _call(self, function: Callable[[], Awaitable[_T]]) -> _T:
        return trio.from_thread.run(function, trio_token=self._token)

    @property
    def info(self) -> InitializeResult:
        return self._driver.info

    @property
    def pid(self) -> int:
        return self._driver.pid

    @property
    def stderr(self) -> str:
        return self._driver.stderr

    @property
    def wire(self) -> WireLog:
        return self._driver.wire

    @property
    def received(self) -> list[RuntimeEventParams]:
        return list(self._driver.received)

    def request(self, method: str, params: Mapping[str, Any] | None = None, *,
                timeout: float = DEFAULT_TIMEOUT_S) -> Any:
        return self._call(partial(self._driver.request, method, params, timeout=timeout))

    def send_raw(self, data: bytes) -> None:
        self._call(partial(self._driver.send_raw, data))

    def start_task(self, prompt: str = "hello", **options: Any) -> SyncTask:
        """As ``WorkerDriver.start_task`` (same keyword arguments)."""
        task: DrivenTask = self._call(partial(self._driver.start_task, prompt, **options))
        return SyncTask(task, self._call)

    @property
    def violations(self) -> list[ProtocolViolation]:
        return self._driver.violations

    def initialize(self, protocol_version: str = PROTOCOL_VERSION, **params: Any) -> Any:
        return self._call(partial(self._driver.initialize, protocol_version, **params))

    def answer_to(self, request_id: int | str | None, timeout: float = DEFAULT_TIMEOUT_S,
                  ) -> Response | ErrorResponse:
        return self._call(partial(self._driver.answer_to, request_id, timeout))

    def task(self, task_id: str, session_id: str = "") -> SyncTask:
        """A task started with ``request`` or ``send_raw``, followed like one ``start_task`` started."""
        return SyncTask(self._driver.task(task_id, session_id), self._call)

    def shutdown(self, grace_s: float = 5.0) -> ExitStatus:
        return self._call(partial(self._driver.shutdown, grace_s))

    def close_input(self) -> None:
        self._call(self._driver.close_input)

    def wait_exit(self, timeout: float = DEFAULT_TIMEOUT_S) -> ExitStatus:
        return self._call(partial(self._driver.wait_exit, timeout))

    def until_output_ends(self, timeout: float = DEFAULT_TIMEOUT_S) -> list[RuntimeEventParams]:
        return self._call(partial(self._driver.until_output_ends, timeout))


@contextmanager
def run_worker(command: list[str] | tuple[str, ...] | None = None, **options: Any) -> Iterator[SyncWorkerDriver]:
    """``open_worker`` for code without trio (same arguments): the worker runs, is driven, and is shut down and
    reaped with its whole process tree on leaving the block, from a thread that runs trio."""
    handed: queue.Queue[tuple[WorkerDriver, trio.lowlevel.TrioToken, trio.Event] | BaseException] = queue.Queue()
    failure: list[BaseException] = []

    async def hold() -> None:
        async with open_worker(command, **options) as driver:
            release = trio.Event()
            handed.put((driver, trio.lowlevel.current_trio_token(), release))
            await release.wait()

    def loop() -> None:
        try:
            trio.run(hold)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread, which raises it
            failure.append(exc)
            handed.put(exc)

    thread = threading.Thread(target=loop, name="codesdk-worker-driver", daemon=True)
    thread.start()
    item = handed.get()
    if isinstance(item, BaseException):
        thread.join()
        raise item
    driver, token, release = item
    try:
        yield SyncWorkerDriver(driver, token)
    finally:
        trio.from_thread.run_sync(release.set, trio_token=token)
        thread.join()
    if failure:  # the teardown itself failed
        raise failure[0]
