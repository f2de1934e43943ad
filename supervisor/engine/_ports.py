"""What the engine needs of workers, as narrow interfaces: the seam where a test puts a double.

The engine never spawns a process itself. It borrows a namespace's worker (``Workers.borrow``), sends it
requests and hears its events and its exit through the two callbacks it gave the ``WorkersFactory``. In
production that is the pool of real worker processes (``pool_workers``); a test that has no use for a real
process passes a factory of doubles to ``Engine.open``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Protocol, TypeVar

import trio

from codesdk.protocol import ExitStatus, InitializeResult, MethodSpec, Model, StderrTail, WireEvent

from ..workers.launch import Placement, PoolConfig
from codesdk.worker.client import WorkerProcess, WorkerSpec
from ..workers.pool import NamespaceFailing, WorkerPool
from ._errors import NamespaceUnavailable

P = TypeVar("P", bound=Model)
R = TypeVar("R", bound=Model)


class RequestChannel(Protocol):
    """Requests to a worker, typed by the protocol's method table (``Rpc``)."""

    async def request(self, method: MethodSpec[P, R], params: P) -> R: ...


class WorkerLink(Protocol):
    """One running worker as the engine uses it: requests to it, its offer, its end, its name for logs."""

    @property
    def spec(self) -> WorkerSpec: ...
    @property
    def pid(self) -> int: ...
    @property
    def connection(self) -> RequestChannel: ...
    @property
    def info(self) -> InitializeResult | None: ...
    @property
    def exited(self) -> trio.Event: ...
    @property
    def stderr(self) -> StderrTail: ...


class Workers(Protocol):
    """Where the engine gets a namespace's worker."""

    def borrow(self, namespace: str, placement: Placement | None = None) -> AbstractAsyncContextManager[WorkerLink]:
        """The namespace's worker (started if needed) while the block runs — or, with a ``placement``, that
        placement's own (a session's ephemeral worker, the shared one); ``NamespaceUnavailable`` if none can be
        had."""
        ...

    async def session_ended(self, placement: Placement) -> None:
        """The session with this placement is gone: a worker of its own (ephemeral) is shut down now."""

    async def let_go(self, namespace: str) -> None:
        """End the namespace's worker now (its lease was lost: another supervisor may run the namespace)."""

    async def hung(self, namespace: str, worker: WorkerLink, why: str) -> None:
        """The worker did not answer (``why``): treat it as crashed — kill its process tree now; its exit fails
        its tasks once and counts toward the namespace's quarantine; the namespace's next task gets a new one."""

    async def aclose(self) -> None: ...


#: Called with a batch of one worker's events, in the order it sent them.
WorkerEvents = Callable[[WorkerLink, Sequence[WireEvent]], Awaitable[None]]
#: Called once a worker has exited and its output is drained: (namespace, worker, how it ended).
WorkerExit = Callable[[str, WorkerLink, ExitStatus], Awaitable[None]]
#: Makes the engine's ``Workers``: (pool configuration, the engine's nursery, its two callbacks).
WorkersFactory = Callable[[PoolConfig, trio.Nursery, WorkerEvents, WorkerExit], Workers]


class PoolWorkers:
    """The real thing: the pool of worker processes, one per namespace."""

    def __init__(self, pool: WorkerPool) -> None:
        self.pool = pool

    @asynccontextmanager
    async def borrow(self, namespace: str, placement: Placement | None = None) -> AsyncIterator[WorkerProcess]:
        placement = placement or Placement(namespace)
        try:
            worker = await self.pool.acquire(namespace, placement)
        except NamespaceFailing as exc:
            raise NamespaceUnavailable(str(exc)) from exc
        try:
            yield worker
        finally:
            self.pool.release(placement.key, worker)

    async def session_ended(self, placement: Placement) -> None:
        await self.pool.session_ended(placement)

    async def let_go(self, namespace: str) -> None:
        await self.pool.let_go(namespace)

    async def hung(self, namespace: str, worker: WorkerLink, why: str) -> None:
        if isinstance(worker, WorkerProcess):
            await self.pool.kill_hung(namespace, worker, why)

    async def aclose(self) -> None:
        await self.pool.aclose()


def pool_workers(config: PoolConfig, nursery: trio.Nursery, on_events: WorkerEvents,
                 on_exit: WorkerExit) -> PoolWorkers:
    return PoolWorkers(WorkerPool(config, nursery, on_events, on_exit))
