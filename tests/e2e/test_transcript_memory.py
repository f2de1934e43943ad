"""Deriving a transcript (for the API, and for every task start) costs memory for the transcript, not the session."""

from __future__ import annotations

import tracemalloc

import trio

from codesdk.supervisor.engine import derive_transcript
from codesdk.supervisor.store import TaskState

from tests.conftest import MakeEngine

#: Deltas in the long session: decoded as events they would take tens of MB.
DELTAS = 20_000
#: What deriving its (tiny) transcript may allocate at its peak.
PEAK_LIMIT_BYTES = 4 * 1024 * 1024


async def test_a_transcript_of_a_long_session_reads_no_deltas(make_engine: MakeEngine) -> None:
    flood = {"name": "long", "steps": [{"flood": DELTAS, "delta": "token "}, {"complete": {}}]}
    with trio.fail_after(120):
        async with make_engine() as engine:
            session = await engine.create_session()
            task = await engine.start_task(session.session_id, "go", runtime_config={"scenario_inline": flood})
            assert (await engine.wait_task(task.task_id)).state == TaskState.COMPLETED
            assert await engine.store.last_seq(session.session_id) > DELTAS
            tracemalloc.start()
            try:
                messages = await derive_transcript(engine.store, session.session_id)
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
    assert [m.role.value for m in messages] == ["user", "assistant"]
    assert messages[1].blocks[0].text == "token " * DELTAS  # type: ignore[union-attr]
    assert peak < PEAK_LIMIT_BYTES, f"deriving the transcript allocated {peak / 1e6:.1f} MB at its peak"
