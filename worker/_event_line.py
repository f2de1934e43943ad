"""The ``runtime.event`` line of an event a worker emits, built from its parts: the worker's hot path.

``protocol.encode_event`` writes a ``WorkerEvent``; building that object validates again what is already valid (a
payload model of the type's own class, the task's ``RuntimeInfo``, a UTC time just taken) and costs as much as
writing it. Here the line is joined from the same serializers' output — the payload's own class's serializer, the
time's, the runtime's (kept while the runtime does not change) — in the envelope's field order, so the bytes are
exactly ``encode_event``'s (``tests/worker/test_emit_path.py`` compares them). Only for what is proven the same:
a worker event type given as an ``EventType``, its payload of exactly that type's class, no ``raw``; everything else
takes the general path.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from pydantic_core import to_json

from codesdk.protocol import PAYLOAD_MODELS, WORKER_EVENT_MODELS, EventType, Method, Model, RuntimeInfo

_HEAD = b'{"jsonrpc":"2.0","method":"' + str(Method.EVENT.value).encode() + b'","params":{"task_id":'

#: The payload class of each type a worker may send: the fast path's only payloads.
FAST_PAYLOADS: Mapping[EventType, type[Model]] = {event_type: PAYLOAD_MODELS[event_type]
                                                  for event_type in WORKER_EVENT_MODELS}


def task_json(task_id: str) -> bytes:
    return to_json(task_id)


def runtime_json(runtime: RuntimeInfo) -> bytes:
    return runtime.__pydantic_serializer__.to_json(runtime, exclude_none=True)


def event_line(task: bytes, n: int, event_type: EventType, time: datetime, runtime: bytes, payload: Model) -> bytes:
    """The line of the task's ``n``-th event (``task`` and ``runtime`` already JSON). Raises ``ValueError`` when the
    payload cannot be serialized (the general path then says why)."""
    body = payload.__pydantic_serializer__.to_json(payload, exclude_none=True)
    return b"".join((_HEAD, task, b',"n":', str(n).encode(), b',"event":{"type":"', str(event_type).encode(),
                     b'","time":', to_json(time), b',"runtime":', runtime, b',"payload":', body, b"}}}\n"))
