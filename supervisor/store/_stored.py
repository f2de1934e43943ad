"""A stored event in the form the store holds it: seq, type and wire JSON; the model only when someone asks.

Subscribers that send events on (the SSE stream) need the JSON, not the model; building and re-serialising a
``NormalizedEvent`` per event and per subscriber was most of a live stream's cost. So the writer publishes
``StoredEvent``s whose JSON is the body it just stored with the seq put in (the same bytes the model would give),
shared by every subscriber, and the model is built once, on first ``model()``, for the Python code that wants one.

Rows read back go through the models (``of``): a row an earlier build of the same schema version stored may lack a
field added since with its default, and every endpoint serves the event as this build's model has it.
"""

from __future__ import annotations

from collections.abc import Callable

from codesdk.protocol import TERMINAL_EVENT_TYPES, NormalizedEvent


class StoredEvent:
    """One event of a session as stored: ``seq``, ``type`` and ``body``, its wire JSON (what ``to_json_obj`` gives,
    as compact UTF-8), each fixed for good once stored; ``model()`` and ``frame`` are built on first use and kept, so
    every subscriber handed this object shares them."""

    __slots__ = ("_frame", "_make", "_model", "body", "seq", "type")

    def __init__(self, seq: int, type: str, body: bytes, *, model: NormalizedEvent | None = None,
                 make: Callable[[int], NormalizedEvent] | None = None) -> None:
        self.seq = seq
        self.type = type
        self.body = body
        self._model = model
        self._make = make  # builds the model of the event stored with this seq
        self._frame: bytes | None = None

    @classmethod
    def of(cls, event: NormalizedEvent) -> StoredEvent:
        """The stored form of a model (a row read back, an earlier append returned again)."""
        body = event.__pydantic_serializer__.to_json(event, exclude_none=True)
        return cls(event.seq, event.type.value, body, model=event)

    @property
    def is_terminal(self) -> bool:
        return self.type in TERMINAL_EVENT_TYPES

    def model(self) -> NormalizedEvent:
        """The event as a model, built once."""
        if self._model is None:
            if self._make is None:
                raise TypeError("a StoredEvent needs its model or a way to make it")
            self._model = self._make(self.seq)
            self._make = None
        return self._model

    @property
    def frame(self) -> bytes:
        """The event as one Server-Sent Events message: ``id``, ``event`` and one ``data`` line (JSON escapes every
        line break inside strings, so the compact body is one line)."""
        if self._frame is None:
            self._frame = b"id: %d\nevent: %s\ndata: %s\n\n" % (self.seq, self.type.encode(), self.body)
        return self._frame

    def __repr__(self) -> str:
        return f"StoredEvent(seq={self.seq}, type={self.type!r}, {len(self.body)} bytes)"


def wire_body(body_without_seq: str, seq: int, schema_version: int) -> bytes:
    """The wire JSON of an event this build just stored as ``body_without_seq`` (the model's JSON without ``seq``,
    so it begins with ``schema_version``): ``seq`` goes right after it, where the model puts it."""
    head = '{"schema_version":%d,' % schema_version
    if not body_without_seq.startswith(head):  # prepare() wrote it: never happens unless the models change shape
        raise ValueError(f"an event body must begin with {head!r}, not {body_without_seq[:40]!r}")
    return ('{"schema_version":%d,"seq":%d,' % (schema_version, seq) + body_without_seq[len(head):]).encode()
