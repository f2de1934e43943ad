from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from supervisor.app import SupervisorOptions, open_engine
from supervisor.engine import Engine
from supervisor.engine._transcript import session_events

from ..worker.harness import REPO
from .invariants import check_session

SCENARIOS = str(REPO / "fixtures" / "scenarios")


@pytest.fixture
def make_engine(tmp_path: Path) -> Callable[..., Any]:
    @asynccontextmanager
    async def make(**options: Any) -> AsyncIterator[Engine]:
        env = options.pop("worker_env", {})
        env = {"*": {"CODESDK_SCENARIO_DIR": SCENARIOS, **env.get("*", {})}, **{k: v for k, v in env.items()
                                                                                 if k != "*"}}
        opts = SupervisorOptions(data_dir=options.pop("data_dir", tmp_path / "data"), worker_env=env, **options)
        async with open_engine(opts) as engine:
            yield engine

    return make


async def run_task(engine: Engine, prompt: str = "hello", *, session_id: str | None = None,
                   namespace: str = "default", workspace: Path | None = None, **kwargs: Any):
    """Start a task (new session unless given), wait for its end; return (session_id, task record, events)."""
    if session_id is None:
        session = await engine.create_session(namespace=namespace, workspace=workspace)
        session_id = session.session_id
    task = await engine.start_task(session_id, prompt, **kwargs)
    record = await engine.wait_task(task.task_id)
    events = await session_events(engine.store, session_id)
    check_session(events)
    return session_id, record, [e for e in events if e.trace.task_id == task.task_id]


def of_type(events, event_type) -> list:
    return [e.payload for e in events if e.type == event_type]
