"""A task's whole conversation with a runtime that speaks JSON-RPC on its stdio (Codex's app-server, ACP agents),
and how it ends: the same for every such adapter.

The peer's reader, the adapter's own background tasks (a stop watcher, a notification follower) and the adapter's
``converse`` run together. Once ``converse`` has the task's outcome, stdin is closed and the runtime gets
``exit_grace_s`` to exit by itself. Then: a line that broke the protocol is a ``PROTOCOL_ERROR`` with the stderr
tail; an outcome is the outcome; a stop is a stop; a runtime whose output ended without one crashed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

import trio

from codesdk.protocol import TaskFailureCode

from .runtime_process import RuntimeProcess
from ._rpc_peer import PeerProtocolError, RpcPeer
from .base import TaskOutcome


async def hold_conversation(process: RuntimeProcess, peer: RpcPeer,
                            converse: Callable[[], Awaitable[TaskOutcome | None]], *,
                            alongside: Sequence[Callable[[], Awaitable[None]]], exit_grace_s: float,
                            term_grace_s: float, broke: str, stopped: Callable[[], TaskOutcome | None],
                            ) -> TaskOutcome:
    """Run ``converse`` (None: the runtime's output ended first) with the peer's reader and ``alongside``; the
    task's outcome. ``broke`` says whose protocol a bad line broke; ``stopped`` is the outcome of a stop, if one
    was asked for. Raises ``RuntimeCrashed`` when the runtime ended without an outcome."""
    broken: list[PeerProtocolError] = []
    outcome: TaskOutcome | None = None

    async def read(scope: trio.CancelScope) -> None:
        try:
            await peer.run()
        except PeerProtocolError as exc:  # the whole conversation ends
            broken.append(exc)
            scope.cancel()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read, nursery.cancel_scope)
        for task in alongside:
            nursery.start_soon(task)
        outcome = await converse()
        if outcome is not None:
            await process.close_stdin()  # the turn is over: it may exit by itself
        with trio.move_on_after(exit_grace_s):
            await process.wait()
        nursery.cancel_scope.cancel()
    if broken:
        return TaskOutcome.failure(TaskFailureCode.PROTOCOL_ERROR, f"{broke}: {broken[0]}",
                                   stderr_tail=process.stderr.text()[-2000:])
    if outcome is not None:
        return outcome
    stop = stopped()
    if stop is not None:
        return stop
    if process.returncode is None:  # its output ended but it lives on: end it, then report
        await process.end(term_grace_s)
    raise process.crashed()
