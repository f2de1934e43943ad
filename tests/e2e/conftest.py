from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from codesdk.testing.invariants import check_session
from codesdk.protocol import EventType, ModelInput, NormalizedEvent
from codesdk.supervisor.engine import Engine, session_events
from codesdk.supervisor.store import TaskRecord
from codesdk.worker.client import WorkerProcess


async def run_task(engine: Engine, prompt: str = "hello", *, session_id: str | None = None,
                   namespace: str = "default", workspace: Path | None = None,
                   **kwargs: Any) -> tuple[str, TaskRecord, list[NormalizedEvent]]:
    """Start a task (new session unless given), wait for its end; return (session_id, task record, events)."""
    if session_id is None:
        session = await engine.create_session(namespace=namespace, workspace=workspace)
        session_id = session.session_id
    task = await engine.start_task(session_id, prompt, **kwargs)
    record = await engine.wait_task(task.task_id)
    events = await session_events(engine.store, session_id)
    check_session(events)
    return session_id, record, [e for e in events if e.trace.task_id == task.task_id]


async def wait_for_event(event_type: EventType, engine: Engine, session_id: str) -> None:
    """Until an event of this type is stored in the session (already, or from now on)."""
    async with engine.store.subscribe(session_id) as sub:
        async for event in sub:
            if event.type == event_type:
                return


def of_type(events: Iterable[NormalizedEvent], event_type: EventType) -> list[Any]:
    """The payloads of the events of this type (each a ``PAYLOAD_MODELS[event_type]``)."""
    return [e.payload for e in events if e.type == event_type]


def the_model_input(events: Iterable[NormalizedEvent]) -> ModelInput:
    """The one ``model.input`` among these events (a task's)."""
    (model_input,) = of_type(events, EventType.MODEL_INPUT)
    assert isinstance(model_input, ModelInput)
    return model_input


def said(events: Iterable[NormalizedEvent]) -> str:
    """The text of every completed output block, joined."""
    return "".join(p.text for p in of_type(events, EventType.MODEL_OUTPUT_COMPLETED))


def worker_of(engine: Engine, namespace: str = "default") -> WorkerProcess:
    """The namespace's worker, which the test knows to be there."""
    worker = engine.pool.worker_of(namespace)
    assert worker is not None, f"no worker for {namespace}"
    return worker
