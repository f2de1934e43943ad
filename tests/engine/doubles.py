"""Worker doubles for the engine's seam (``Engine.open(..., workers=...)``): no process, no pipes.

A ``FakeWorker`` answers the engine's requests the way a worker would (``runtime.startTask`` accepted, the rest
acknowledged) and records them; the test speaks for its runtime with ``emit``, which hands events to the engine
exactly as the pool does, and ends it with ``exit``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import trio

from codesdk.protocol import (
    EventType,
    ExitStatus,
    Method,
    MethodSpec,
    Model,
    RuntimeEventParams,
    RuntimeInfo,
    StderrTail,
    TaskStopped,
    WireEvent,
    WorkerEvent,
    decode_event_fast,
    encode_event_notification,
)
from codesdk.supervisor.engine import (
    Engine,
    EngineConfig,
    NamespaceUnavailable,
    WorkerEvents,
    WorkerExit,
    WorkerLink,
)
from codesdk.supervisor.store import Quotas
from codesdk.supervisor.tools import ToolRegistry, ToolsConfig
from codesdk.supervisor.workers.launch import Placement, PoolConfig
from codesdk.worker.client import RpcError, WorkerSpec

P = TypeVar("P", bound=Model)
R = TypeVar("R", bound=Model)

#: What a double answers to a request: a result, or an exception to raise (an ``RpcError``, say).
Answer = Callable[[dict[str, Any]], Any]


class FakeConnection:
    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.answers: dict[str, Answer] = {
            Method.START_TASK: lambda params: {"accepted": True, "task_id": params["task_id"]},
        }
        self._changed = trio.Event()
        #: How the worker ends a task it is asked to stop (unless ``answers`` says otherwise): as a worker does.
        self.stopped: Callable[[dict[str, Any]], Awaitable[None]] | None = None

    async def request(self, method: MethodSpec[P, R], params: P) -> R:
        """Recorded as (method name, JSON params), as they would go on the wire; answered from ``answers``
        (a JSON result, or an exception) and read as the method's result model, as the real connection does."""
        sent = params.to_json_obj()
        self.requests.append((method.method, sent))
        self._changed.set()
        self._changed = trio.Event()
        answer = self.answers.get(method.method)
        result = answer(sent) if answer is not None else {}
        if isinstance(result, Exception):
            raise result
        if method.method == Method.STOP and answer is None and self.stopped is not None:
            await self.stopped(sent)
        return method.parse_result(result)

    async def wait_for(self, method: str, count: int = 1) -> list[dict[str, Any]]:
        """The params of the first ``count`` requests of ``method``, once they have arrived."""
        while len(sent := [params for m, params in self.requests if m == method]) < count:
            await self._changed.wait()
        return sent[:count]


class FakeWorker:
    """One namespace's worker, as the engine sees it."""

    def __init__(self, namespace: str, on_events: WorkerEvents, on_exit: WorkerExit) -> None:
        self.namespace = namespace
        self.spec = WorkerSpec(argv=("double",), env={}, name=f"double:{namespace}")
        self.pid = 4_000_000  # no such process: nothing may signal it
        self.connection = FakeConnection()
        self.info = None
        self.exited = trio.Event()
        self.stderr = StderrTail()
        self._on_events = on_events
        self._on_exit = on_exit
        self._next_n: dict[str, int] = {}
        self.connection.stopped = self._end_stopped_task

    async def _end_stopped_task(self, params: dict[str, Any]) -> None:
        """A worker asked to stop a task ends it with ``task.stopped``."""
        await self.emit(params["task_id"], EventType.TASK_STOPPED, TaskStopped(reason=params.get("reason") or "stop",
                                                                                requested_by="supervisor"))

    def next_n(self, task_id: str) -> int:
        """The ordinal this worker's next event of the task gets."""
        return self._next_n.get(task_id, 1)

    async def emit(self, task_id: str, type_: EventType, payload: Model, *, raw: Any = None,
                   n: int | None = None) -> None:
        """Send one event of the task (next ordinal unless ``n`` is given), as the pool would hand it over."""
        await self.emit_batch([self.event(task_id, type_, payload, raw=raw, n=n)])

    def event(self, task_id: str, type_: EventType, payload: Model, *, raw: Any = None,
              n: int | None = None) -> RuntimeEventParams:
        """The next event of the task as the worker would send it (its ordinal taken)."""
        n = self.next_n(task_id) if n is None else n
        self._next_n[task_id] = max(self.next_n(task_id), n + 1)
        return RuntimeEventParams(task_id=task_id, n=n, event=WorkerEvent(
            type=type_, runtime=RuntimeInfo(name="scripted"), payload=payload, raw=raw))

    async def emit_batch(self, batch: list[RuntimeEventParams]) -> None:
        for params in batch:  # ordinals a test chose are taken too
            self._next_n[params.task_id] = max(self.next_n(params.task_id), params.n + 1)
        # As the connection hands them over: decoded from the line the worker writes (the general path's model
        # where the compiled decoder declines it).
        await self._on_events(self, [decode_event_fast(encode_event_notification(params).rstrip(b"\n"))
                                     or WireEvent.from_params(params) for params in batch])

    async def exit(self, returncode: int = 1, stderr: bytes = b"") -> None:
        """The process died: the pool reports it once its output is drained."""
        self.stderr.add(stderr)
        self.exited.set()
        await self._on_exit(self.namespace, self, ExitStatus.from_returncode(returncode))


class FakeWorkers:
    """The engine's ``Workers``: one ``FakeWorker`` per namespace, made on first use."""

    def __init__(self) -> None:
        self.workers: dict[str, FakeWorker] = {}
        self.unavailable: dict[str, str] = {}  # namespace -> why no worker can be had
        self.hung_workers: list[tuple[str, str]] = []  # (namespace, why) of each worker killed as hung
        self.placements: list[Placement] = []  # each borrow's (every double serves its namespace's one worker)
        self.ended: list[Placement] = []  # sessions whose own worker was let go (``session_ended``)
        self._on_events: WorkerEvents | None = None
        self._on_exit: WorkerExit | None = None

    def factory(self, config: PoolConfig, nursery: trio.Nursery, on_events: WorkerEvents,
                on_exit: WorkerExit) -> FakeWorkers:
        self._on_events, self._on_exit = on_events, on_exit
        return self

    def worker(self, namespace: str = "default") -> FakeWorker:
        assert self._on_events is not None and self._on_exit is not None, "not given to an engine yet"
        if namespace not in self.workers:
            self.workers[namespace] = FakeWorker(namespace, self._on_events, self._on_exit)
        return self.workers[namespace]

    @asynccontextmanager
    async def borrow(self, namespace: str, placement: Placement | None = None) -> AsyncIterator[WorkerLink]:
        if namespace in self.unavailable:
            raise NamespaceUnavailable(self.unavailable[namespace])
        self.placements.append(placement or Placement(namespace))
        yield self.worker(namespace)

    async def session_ended(self, placement: Placement) -> None:
        self.ended.append(placement)

    async def let_go(self, namespace: str) -> None:
        worker = self.workers.get(namespace)
        if worker is not None and not worker.exited.is_set():
            await worker.exit(-9)

    async def hung(self, namespace: str, worker: WorkerLink, why: str) -> None:
        self.hung_workers.append((namespace, why))
        if isinstance(worker, FakeWorker) and not worker.exited.is_set():
            await worker.exit(-9)

    async def aclose(self) -> None:
        pass


def rpc_error(code: int, message: str) -> Answer:
    return lambda params: RpcError(code, message)


@asynccontextmanager
async def engine_with_doubles(data_dir: Path, *, quotas: Quotas | None = None, **config_fields: Any,
                              ) -> AsyncIterator[tuple[Engine, FakeWorkers]]:
    """A real engine and store over worker doubles (``config_fields``: more of its ``EngineConfig``)."""
    workers = FakeWorkers()
    config = EngineConfig(data_dir=data_dir, pool=PoolConfig(data_dir=data_dir), quotas=quotas or Quotas(),
                          **config_fields)
    async with Engine.open(config, ToolRegistry(ToolsConfig()), workers=workers.factory) as engine:
        yield engine, workers


async def running_task(engine: Engine, workers: FakeWorkers, workspace: Path | None = None, *,
                       namespace: str = "default", **start: Any) -> tuple[str, str, FakeWorker]:
    """A new session's task in ``namespace``, handed to its worker: (session_id, task_id, worker). The worker's
    events wait for the engine to have stored ``model.input``, so they may be emitted at once."""
    session = await engine.create_session(workspace=workspace, namespace=namespace)
    task = await engine.start_task(session.session_id, "x", **start)
    worker = workers.worker(session.namespace)
    await worker.connection.wait_for(Method.START_TASK)
    return session.session_id, task.task_id, worker
