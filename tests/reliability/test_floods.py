"""Floods and backpressure: one tenant's flood, and readers that stop reading, hold up no one else.

Every buffer between a worker and a reader is bounded: the worker's write queue, the connection's event
channel, the pool's batches, each subscriber's feed (which falls back to re-reading the store when it
overflows), and the HTTP stream (a client that does not read blocks only its own response). Memory is
measured as RSS of this process, which is the supervisor here.
"""

from __future__ import annotations

import psutil
import trio

from codesdk.protocol import TERMINAL_EVENT_TYPES, EventType
from codesdk.supervisor.store import TaskState
from tests.api.conftest import Api

FLOOD = 80_000
MIB = 1024 * 1024


def _flood(n: int) -> dict[str, object]:
    return {"scenario_inline": {"name": "flood", "steps": [{"flood": n, "delta": "f" * 24}, {"complete": {}}]}}


async def _sample_rss(peak: list[int]) -> None:
    me = psutil.Process()
    while True:
        peak[0] = max(peak[0], me.memory_info().rss)
        await trio.sleep(0.05)


async def test_a_flood_slows_only_its_own_tenant_and_stalled_readers_cost_no_memory(api: Api) -> None:
    engine = api.engine
    flooder = await api.create_session(api.alice, "user:alice")
    other = await api.create_session(api.bob, "user:bob")
    # Warm both workers so spawn time is not what is being compared.
    for token, session in ((api.alice, flooder), (api.bob, other)):
        task = await api.run_task(token, session["session_id"])
        await engine.wait_task(task["task_id"])
    baseline = psutil.Process().memory_info().rss
    peak = [baseline]
    with trio.fail_after(180):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_sample_rss, peak)
            # Readers that stop reading: a subscriber that never iterates, and an SSE client that never reads.
            async with engine.store.subscribe(flooder["session_id"]) as stalled:
                stream = await trio.open_unix_socket(str(api.socket))
                await stream.send_all(
                    f"GET /v1/sessions/{flooder['session_id']}/events/stream HTTP/1.1\r\nHost: codesdk\r\n"
                    f"Authorization: Bearer {api.alice}\r\n\r\n".encode())
                r = await api.client.post(f"/v1/sessions/{flooder['session_id']}/tasks", headers=api.auth(api.alice),
                                          json={"prompt": "flood", "runtime_config": _flood(FLOOD)})
                flood_task = r.json()["task_id"]
                # Meanwhile the other tenant's tasks start and end, one after another, while the flood runs.
                for _ in range(3):
                    task = await api.run_task(api.bob, other["session_id"])
                    record = await engine.wait_task(task["task_id"])
                    assert record.state == TaskState.COMPLETED
                flood_state = (await engine.store.get_task(flood_task)).state
                assert flood_state == TaskState.RUNNING, "the flood ended before the other tenant was served"
                record = await engine.wait_task(flood_task)
                assert record.state == TaskState.COMPLETED  # the stalled readers did not hold the writer up
                await stream.aclose()
                # The stalled subscriber wakes up and still gets every event, in order, without gaps.
                seqs = []
                async for event in stalled:
                    seqs.append(event.seq)
                    if event.type in TERMINAL_EVENT_TYPES and event.trace.task_id == flood_task:
                        break
            nursery.cancel_scope.cancel()
    assert seqs == list(range(1, len(seqs) + 1)) and len(seqs) > FLOOD
    growth = peak[0] - baseline
    # Holding the flood's events for the stalled readers would take hundreds of MiB.
    assert growth < 96 * MIB, f"RSS grew by {growth / MIB:.0f} MiB during a {FLOOD}-event flood"


async def test_a_client_that_stops_reading_sse_resumes_without_gaps(api: Api) -> None:
    session = await api.create_session(api.alice, "user:alice")
    sid = session["session_id"]
    with trio.fail_after(120):
        async with api.client.stream("GET", f"/v1/sessions/{sid}/events/stream?until_terminal=true",
                                     headers=api.auth(api.alice), timeout=None) as response:
            r = await api.client.post(f"/v1/sessions/{sid}/tasks", headers=api.auth(api.alice),
                                      json={"prompt": "flood", "runtime_config": _flood(20_000)})
            record = await api.engine.wait_task(r.json()["task_id"])  # stored while nobody reads the stream
            assert record.state == TaskState.COMPLETED
            seqs: list[int] = []
            last = ""
            async for line in response.aiter_lines():  # to the end: the server closes after the terminal event
                if line.startswith("id: "):
                    seqs.append(int(line[4:]))
                elif line.startswith("event: "):
                    last = line[7:]
    assert seqs == list(range(1, len(seqs) + 1)) and len(seqs) > 20_000
    assert last == EventType.TASK_COMPLETED
