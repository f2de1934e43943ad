"""Resource exhaustion: out of descriptors at spawn, and a disk that fails under the store.

Each must end in a typed, actionable error — never a hang, a leaked descriptor, or an event reported as
stored that is not.
"""

from __future__ import annotations

import gc
import os
import resource

import trio

from codesdk.protocol import EventType
from codesdk.supervisor.store import TaskState
from tests.conftest import MakeEngine
from tests.e2e.conftest import of_type, run_task


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


async def test_descriptor_limit_at_spawn_is_a_typed_error_and_leaks_nothing(make_engine: MakeEngine) -> None:
    with trio.fail_after(60):
        async with make_engine() as engine:
            session = await engine.create_session()
            await trio.sleep(0.1)  # let the store's threads settle their descriptors
            gc.collect()  # and earlier tests' garbage close its own, not in the middle of this test
            before = _open_fds()
            soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            # Room for what is open now and a little more, but not for a worker's three pipes.
            resource.setrlimit(resource.RLIMIT_NOFILE, (len(before) + 3, hard))
            try:
                for _ in range(3):  # repeatable: not counted as crashes, never quarantined
                    task = await engine.start_task(session.session_id, "x", runtime_config={"scenario": "echo"})
                    record = await engine.wait_task(task.task_id)
                    assert record.state == TaskState.FAILED and record.error is not None
                    assert record.error["code"] == "WORKER_UNAVAILABLE"
                    assert "run out of file descriptors" in record.error["message"]
                    assert "LimitNOFILE" in record.error["message"]
            finally:
                resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
            assert not _open_fds() - before, "descriptors leaked"
            status = {s["namespace"]: s for s in engine.pool.status()}["default"]
            assert status["recent_crashes"] == 0 and status["quarantined_until"] is None
            _, record, events = await run_task(engine, session_id=session.session_id,
                                               runtime_config={"scenario": "echo"})
            assert record.state == TaskState.COMPLETED
            assert len(of_type(events, EventType.TASK_COMPLETED)) == 1
