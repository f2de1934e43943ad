"""Inputs a user sent into a running task (``runtime.sendInput``), waiting for the runtime to take them.

An adapter whose runtime steers (``steering: mid_turn``) keeps them in an ``InputInbox`` and hands them over at
the runtime's next model boundary, then reports each (``delivered``). One that cannot leaves them queued: the
supervisor records what was never delivered when the task ends, and carries it into the session's next task.
"""

from __future__ import annotations

import trio

from codesdk.protocol import EventType, InputDelivery, ModelInputAppended, SendInputParams

from .base import TaskIO


class InputInbox:
    """Inputs received and not yet given to the runtime, in the order they came."""

    def __init__(self) -> None:
        self._waiting: list[SendInputParams] = []
        self._arrived = trio.Event()
        #: How many inputs were ever put (taken or not).
        self.received = 0

    def put(self, params: SendInputParams) -> None:
        self._waiting.append(params)
        self.received += 1
        self._arrived.set()
        self._arrived = trio.Event()

    def take(self) -> list[SendInputParams]:
        """Every input waiting, now handed over (the inbox is empty after)."""
        taken, self._waiting = self._waiting, []
        return taken

    def __bool__(self) -> bool:
        return bool(self._waiting)

    async def wait(self, received: int = 1) -> None:
        """Until at least ``received`` inputs have come in all (taken or not)."""
        while self.received < received:
            await self._arrived.wait()


async def delivered(io: TaskIO, inputs: list[SendInputParams], *, before_request_id: str | None = None,
                    after_tool_call_id: str | None = None) -> None:
    """Report inputs the runtime was just given, in the running turn (``model.input.appended``, ``mid_turn``)."""
    for params in inputs:
        await io.emit(EventType.MODEL_INPUT_APPENDED, ModelInputAppended(
            input_id=params.input_id, text=params.text(), input_hash=params.hash(), delivery=InputDelivery.MID_TURN,
            before_request_id=before_request_id, after_tool_call_id=after_tool_call_id))
