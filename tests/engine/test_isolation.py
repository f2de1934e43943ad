"""Which worker the engine asks for a session's tasks (its placement), what it tells the workers when an ephemeral
session goes, and the levels it refuses — over worker doubles."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from codesdk.protocol import IsolationLevel
from codesdk.protocol import Method
from codesdk.supervisor.engine import InvalidTaskInput
from codesdk.supervisor.workers.launch import EPHEMERAL, NAMESPACED, SHARED, Placement

from tests.engine.doubles import engine_with_doubles


async def test_each_level_borrows_its_own_placement_and_an_ephemeral_one_is_ended_with_its_session(
        tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with engine_with_doubles(tmp_path) as (engine, workers):
            made = {level: await engine.create_session(isolation=level) for level in IsolationLevel}
            for level, session in made.items():
                assert (await engine.store.get_session(session.session_id)).isolation == level
                task = await engine.start_task(session.session_id, "x")
                await workers.worker("default").connection.wait_for(Method.START_TASK, count=len(workers.placements))
                await engine.stop_task(task.task_id)
            own = made[IsolationLevel.EPHEMERAL].session_id
            assert workers.placements == [Placement("default", "shared"), Placement("default"),
                                          Placement("default", "ephemeral", own)]
            for session in made.values():
                await engine.delete_session(session.session_id, by="test")
            assert workers.ended == [Placement("default", "ephemeral", own)]  # only a session's own worker


async def test_an_unknown_level_is_refused_naming_the_levels(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with engine_with_doubles(tmp_path) as (engine, _):
            bad: dict[str, Any] = {"isolation": "isolated"}
            with pytest.raises(InvalidTaskInput, match="shared, namespaced, ephemeral"):
                await engine.create_session(**bad)
            assert await engine.store.list_sessions() == []


def test_the_pool_knows_the_levels_the_protocol_does() -> None:
    assert {NAMESPACED, EPHEMERAL, SHARED} == {level.value for level in IsolationLevel}
