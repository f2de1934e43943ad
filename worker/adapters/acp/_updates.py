"""A prompt turn's ``session/update`` notifications as normalized output events.

ACP streams text and thoughts as chunks with no block boundaries: a block is open from its first chunk until
something else arrives (a chunk of the other kind or of another message, a tool call, a permission request, the end
of the turn), and is then completed with the text its deltas carried.
"""

from __future__ import annotations

from typing import Any

from codesdk.protocol import BlockKind, EventType, ModelOutputCompleted, ModelOutputDelta

from ..base import TaskIO

#: ``session/update`` kinds that carry model output, and the block kind each opens.
CHUNK_KINDS = {"agent_message_chunk": BlockKind.TEXT, "agent_thought_chunk": BlockKind.THINKING}


class OutputBlocks:
    """The open block of one task's turn, and the ids of blocks it has had."""

    def __init__(self, io: TaskIO, prefix: str) -> None:
        self.io = io
        self.prefix = prefix
        self._count = 0
        self._open: tuple[str, BlockKind, str | None, list[str]] | None = None
        #: The last completed text block's text (the task's result preview).
        self.last_text = ""

    async def chunk(self, update: dict[str, Any]) -> None:
        kind = CHUNK_KINDS[str(update.get("sessionUpdate"))]
        content = update.get("content")
        text = content.get("text") if isinstance(content, dict) and content.get("type") == "text" else None
        if not isinstance(text, str) or not text:
            return
        message = update.get("messageId")
        message = str(message) if message is not None else None
        if self._open is not None and (self._open[1] != kind or self._open[2] != message):
            await self.close()
        if self._open is None:
            self._count += 1
            self._open = (f"{self.prefix}:{self._count}", kind, message, [])
        block_id, _, _, parts = self._open
        await self.io.emit(EventType.MODEL_OUTPUT_DELTA, ModelOutputDelta(
            block_id=block_id, kind=kind, delta=text, index=len(parts)))
        parts.append(text)

    async def close(self) -> None:
        """Complete the open block, if any (something other than its chunks came)."""
        if self._open is None:
            return
        block_id, kind, _, parts = self._open
        self._open = None
        text = "".join(parts)
        if kind == BlockKind.TEXT:
            self.last_text = text
        await self.io.emit(EventType.MODEL_OUTPUT_COMPLETED, ModelOutputCompleted(block_id=block_id, kind=kind,
                                                                                  text=text))
