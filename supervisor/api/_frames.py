"""SSE frames of stored events, each built once and shared by every stream that sends it.

A session followed by several clients (an app's tabs, a dashboard and a CLI) sends the same event to each; the
frame is the event's JSON with its ``id``/``event`` lines, and serialising it was the largest part of a stream's
cost. The cache is keyed by (session, seq), which names one stored event for good, and bounded: a stream that
reads far behind the others builds its own frames again, nothing more.
"""

from __future__ import annotations

from codesdk.protocol import NormalizedEvent

#: Frames kept: the recent tail of every busy session, a few MB at most (frames of streamed deltas are ~300 bytes;
#: a big one, a tool result, is built again if it fell out).
FRAMES_KEPT = 4096


def sse_frame(event: NormalizedEvent) -> bytes:
    """``id: <seq>``, ``event: <type>``, ``data: <the event's wire JSON>`` and the blank line that ends it. The JSON
    is compact and has no raw line breaks (JSON escapes them in strings), so it is one ``data`` line."""
    data = event.__pydantic_serializer__.to_json(event, exclude_none=True)
    return b"id: %d\nevent: %s\ndata: %s\n\n" % (event.seq, event.type.value.encode(), data)


class FrameCache:
    """The frames of recently sent events, by (session, seq); oldest first out."""

    def __init__(self, kept: int = FRAMES_KEPT) -> None:
        self._kept = kept
        self._frames: dict[tuple[str, int], bytes] = {}
        self.built = 0  # frames serialised (the rest were shared)

    def __len__(self) -> int:
        return len(self._frames)

    def frame(self, session_id: str, event: NormalizedEvent) -> bytes:
        key = (session_id, event.seq)
        found = self._frames.get(key)
        if found is None:
            found = self._frames[key] = sse_frame(event)
            self.built += 1
            if len(self._frames) > self._kept:
                del self._frames[next(iter(self._frames))]
        return found
