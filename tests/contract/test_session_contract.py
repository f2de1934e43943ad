"""A session moves between any two runtimes: each is given the transcript of the turns held elsewhere. (That an
adapter takes up its runtime's own session while it has it, and rebuilds it from the transcript once it lost it:
``test_adapter_contract.test_the_next_task_carries_the_sessions_history``.)"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
import trio

from codesdk.testing.invariants import check_session
from fixtures.fake_anthropic import FakeAnthropic
from codesdk.protocol import NormalizedEvent, ResumeMode
from codesdk.supervisor.engine import Engine, session_events
from codesdk.supervisor.store import TaskState

from tests.conftest import MakeEngine
from tests.e2e.conftest import said, the_model_input
from tests.contract.cases import ScriptedCase, Turn, workspace
from tests.contract.conftest import RUNTIMES, make_case, unavailable

#: The scripted runtime, asked to say what it was given of the earlier turns.
RECALL = {"scenario_inline": {"name": "recall", "steps": [{"text": "I recall: {{history}}"}]}}


async def _run(engine: Engine, session_id: str, turn: Turn, **kwargs: Any) -> list[NormalizedEvent]:
    task = await engine.start_task(session_id, turn.prompt, runtime_config=turn.runtime_config, **kwargs)
    record = await engine.wait_task(task.task_id)
    events = [e for e in await session_events(engine.store, session_id) if e.trace.task_id == task.task_id]
    assert record.state == TaskState.COMPLETED, f"{record.runtime}: {record.error}"
    return events




def _walk(names: list[str]) -> list[str]:
    """An order of runtimes in which every two of them follow one another at least once (a walk over every edge
    of the complete graph, greedy: few repeats)."""
    left = {frozenset(pair) for pair in itertools.combinations(names, 2)}
    walk = [names[0]]
    while left:
        here = walk[-1]
        nexts = [n for n in names if frozenset((here, n)) in left]
        step = nexts[0] if nexts else next(n for n in names if any(n in pair for pair in left))
        left.discard(frozenset((here, step)))
        walk.append(step)
    return walk


@pytest.mark.runtime
async def test_a_session_moves_between_every_two_runtimes_available(make_engine: MakeEngine, tmp_path: Path) -> None:
    """One session walks through every runtime available here so that each two follow one another: each task
    moves the session by reconstruction, and is given the turns of the runtimes before it."""
    names = [n for n in RUNTIMES if unavailable(n) is None]
    if len(names) < 2:
        pytest.skip("only the scripted runtime is available here: "
                    + "; ".join(f"{n}: {unavailable(n)}" for n in RUNTIMES[1:]))
    walk = _walk(names)
    with FakeAnthropic.start(tmp_path / "api.jsonl") as fake, trio.fail_after(60 + 20 * len(walk)):
        cases = {name: make_case(name, fake) for name in names}
        env: dict[str, str] = {}
        for case in cases.values():
            env |= case.worker_env()
        async with make_engine(worker_env={"*": env}) as engine:
            session = await engine.create_session(runtime=walk[0], workspace=workspace(tmp_path))
            previous: str | None = None
            for step, name in enumerate(walk):
                case = cases[name]
                turn = Turn(f"step {step} marker-{step}x", RECALL) if isinstance(case, ScriptedCase) else \
                    case.stream(f"step {step} marker-{step}x")
                requests = len(fake.requests())
                events = await _run(engine, session.session_id, turn, runtime=name)
                given = the_model_input(events)
                where = f"step {step}: {previous} -> {name}"
                assert given.switched_from == (previous if previous != name else None), where
                assert given.resume == (ResumeMode.NEW if step == 0 else ResumeMode.RECONSTRUCTED), where
                assert {e.runtime.name for e in events} == {name}, where
                if step:
                    seen = said(events) if isinstance(case, ScriptedCase) else \
                        json.dumps([r["body"] for r in fake.requests()[requests:]])
                    assert f"marker-{step - 1}x" in seen, f"{where}: the turn before was not given"
                assert (await engine.store.get_session(session.session_id)).runtime == name, where
                previous = name
            events = await session_events(engine.store, session.session_id)
    check_session(events)
