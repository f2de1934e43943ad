"""Requests sent to a runtime and not yet answered, by id: whoever waits is woken by the answer, or by the end of
the runtime's output. Shared by every adapter that speaks request/response with its runtime (Claude Code's control
protocol, JSON-RPC runtimes)."""

from __future__ import annotations

from typing import Any

import trio


class AwaitedAnswers:
    """One slot per request id. ``expect`` before sending (or name ids sent before this existed); ``wait`` for
    the answer; ``resolve`` from the reader; ``fail_all`` when the output ends."""

    def __init__(self, sent: tuple[str, ...] = ()) -> None:
        self._pending: dict[str, tuple[trio.Event, list[Any]]] = {}
        for request_id in sent:
            self.expect(request_id)

    def expect(self, request_id: str) -> None:
        self._pending[request_id] = (trio.Event(), [])

    def forget(self, request_id: str) -> None:
        """The request could not be sent: nobody will wait for it."""
        self._pending.pop(request_id, None)

    def resolve(self, request_id: str, answer: Any) -> bool:
        """Hand over an answer (an exception is raised to the waiter); False if no such request is awaited."""
        waiting = self._pending.get(request_id)
        if waiting is None:
            return False
        event, slot = waiting
        if not event.is_set():
            slot.append(answer)
            event.set()
        return True

    def fail_all(self, error: BaseException) -> None:
        for request_id in list(self._pending):
            self.resolve(request_id, error)

    async def wait(self, request_id: str) -> Any:
        event, slot = self._pending[request_id]
        try:
            await event.wait()
        finally:
            del self._pending[request_id]
        answer = slot[0]
        if isinstance(answer, BaseException):
            raise answer
        return answer
