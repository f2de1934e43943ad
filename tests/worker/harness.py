"""Drive a real ``codesdk-worker`` process over its pipes, as a supervisor would."""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from protocol import TERMINAL_EVENT_TYPES, Method, RuntimeEventParams
from supervisor.workers import WorkerProcess, WorkerSpec, worker_argv

REPO = Path(__file__).resolve().parents[2]


def minimal_env(home: Path) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "CODESDK_SCENARIO_DIR": str(REPO / "fixtures" / "scenarios"),
        "CODESDK_SCRIPTED_TEST_STEPS": "1",  # the protocol tests drive faults through the scripted runtime
    }


class WorkerHarness:
    """A worker and everything it has sent. Its events are drained into ``received`` all along, as the
    supervisor's pool does: a driver that waits for an answer while a task floods must not leave the events
    unread, or the connection's bounded event buffer fills, its reader stops, and the answer never arrives."""

    def __init__(self, worker: WorkerProcess) -> None:
        self.worker = worker
        self.conn = worker.connection
        self.by_task: dict[str, list[RuntimeEventParams]] = defaultdict(list)
        self.received: list[RuntimeEventParams] = []
        self._next = 0  # the first event of ``received`` that next_event has not looked at
        self._arrived = trio.Event()
        self._ended = False

    @classmethod
    def draining(cls, nursery: trio.Nursery, worker: WorkerProcess) -> WorkerHarness:
        """A harness whose events are collected from now on by a task of ``nursery``; the only way to get one,
        so no driver can forget to drain."""
        harness = cls(worker)
        nursery.start_soon(harness.collect)
        return harness

    async def collect(self) -> None:
        """Move every event of the worker into ``received``/``by_task`` until its output ends."""
        try:
            async for params in self.conn.events:
                self.received.append(params)
                self.by_task[params.task_id].append(params)
                self._arrived.set()
        finally:
            self._ended = True
            self._arrived.set()

    async def request(self, method: str, params: dict[str, Any] | None = None) -> Any:
        return await self.conn.request(method, params)

    async def start_task(self, task_id: str, scenario: str | None = None, *, session_id: str | None = None,
                         prompt: str = "hello", **config: Any) -> Any:
        runtime_config: dict[str, Any] = dict(config)
        if scenario is not None:
            runtime_config["scenario"] = scenario
        return await self.request(Method.START_TASK, {
            "runtime": "scripted",
            "session": {"session_id": session_id or f"s-{task_id}"},
            "task_id": task_id,
            "messages": [{"role": "user", "blocks": [{"type": "text", "text": prompt}]}],
            "runtime_config": runtime_config,
        })

    async def next_event(self, task_id: str | None = None,
                         where: Callable[[RuntimeEventParams], bool] = lambda e: True) -> RuntimeEventParams:
        """The next event (after those already looked at) for ``task_id`` that matches."""
        while True:
            while self._next < len(self.received):
                params = self.received[self._next]
                self._next += 1
                if (task_id is None or params.task_id == task_id) and where(params):
                    return params
            if self._ended:
                raise AssertionError("worker output ended before the expected event")
            self._arrived = trio.Event()
            await self._arrived.wait()

    async def until_terminal(self, task_id: str) -> list[RuntimeEventParams]:
        if not any(e.event.type in TERMINAL_EVENT_TYPES for e in self.by_task[task_id]):
            await self.next_event(task_id, lambda e: e.event.type in TERMINAL_EVENT_TYPES)
        return self.by_task[task_id]


@asynccontextmanager
async def running_worker(tmp_path: Path, *args: str) -> AsyncIterator[WorkerHarness]:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    spec = WorkerSpec(argv=worker_argv(*args), env=minimal_env(home), cwd=str(tmp_path), name="test-worker")
    async with trio.open_nursery() as nursery:
        worker = await WorkerProcess.start(nursery, spec)
        harness = WorkerHarness.draining(nursery, worker)
        try:
            yield harness
        finally:
            await worker.shutdown(grace_s=5)
