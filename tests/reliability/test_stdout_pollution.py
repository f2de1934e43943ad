"""Stdout pollution: a runtime or library printing to the worker's stdout cannot corrupt the protocol.

The worker moves fd 1 to stderr at start-up and speaks the protocol on a private, non-inheritable dup.
The ``stdout-pollution`` scenario prints by every route (``print``, ``sys.__stdout__``, ``os.write(1)``
including half a JSON-RPC line without newline, and a child process inheriting stdout) between two
text blocks; the protocol stream must not notice and the output must land on stderr.
"""

from __future__ import annotations

from pathlib import Path

import trio

from codesdk.protocol import EventType, ModelOutputCompleted
from codesdk.supervisor.engine import session_events
from codesdk.supervisor.store import TaskState
from codesdk.testing import open_worker
from codesdk.testing.invariants import check_session
from tests.conftest import MakeEngine

ROUTES = ("(print)", "(sys.__stdout__)", "(fd 1)", "(child process)")


async def test_stdout_pollution_never_reaches_the_protocol_stream_and_lands_on_stderr(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with open_worker(home=tmp_path) as worker:
            events = await (await worker.start_task(scenario="stdout-pollution")).until_terminal()
            assert worker.violations == []  # not one stray byte was read as (part of) a frame
            # A second task after the pollution: the stream is still framed correctly.
            clean = await worker.start_task("clean", scenario="echo")
            assert (await clean.until_terminal())[-1].event.type == EventType.TASK_COMPLETED
            assert worker.violations == []
        stderr = worker.stderr  # complete now: the worker has exited and its stderr was drained
    assert [e.n for e in events] == list(range(1, len(events) + 1))
    assert events[-1].event.type == EventType.TASK_COMPLETED
    texts = [e.event.payload.text for e in events if isinstance(e.event.payload, ModelOutputCompleted)]
    assert texts == ["before", "after"]
    for route in ROUTES:
        assert f"STRAY-STDOUT {route}" in stderr, route
    assert '{"jsonrpc":"2.0","method":' in stderr  # the would-be torn frame went to the log, not the wire


async def test_a_polluting_task_streams_intact_through_the_engine(make_engine: MakeEngine) -> None:
    with trio.fail_after(60):
        async with make_engine() as engine:
            session = await engine.create_session()
            task = await engine.start_task(session.session_id, "x", runtime_config={"scenario": "stdout-pollution"})
            record = await engine.wait_task(task.task_id)
            worker = engine.pool.worker_of("default")
            assert worker is not None and worker.connection.stats.violations == 0
            events = await session_events(engine.store, session.session_id)
    check_session(events)
    assert record.state == TaskState.COMPLETED
    texts = [e.payload.text for e in events if isinstance(e.payload, ModelOutputCompleted)]
    assert texts == ["before", "after"]
    deltas = [e for e in events if e.type == EventType.MODEL_OUTPUT_DELTA]
    assert "".join(e.payload.delta for e in deltas) == "beforeafter"  # type: ignore[attr-defined]
    assert [e.type for e in events][-3:] == [EventType.USAGE_REPORTED, EventType.RUNTIME_REQUEST_COMPLETED,
                                            EventType.TASK_COMPLETED]
