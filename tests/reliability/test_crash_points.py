"""SIGKILL at many points of a task — the worker's and the supervisor's — and check what survives.

After every kill: the database passes ``PRAGMA integrity_check``, every event a subscriber was handed is
stored unchanged, each session's seq is gap-free, and every task has exactly one terminal event.
The random rounds are bounded; ``CODESDK_CRASH_ROUNDS=N`` runs them longer locally (default 4). Their seed is
named in any failure; ``CODESDK_CRASH_SEED=N`` replays it.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import apsw
import httpx2 as httpx
import pytest
import trio

from codesdk.protocol import TERMINAL_EVENT_TYPES, EventType, InteractionMode, NormalizedEvent, PermissionMode
from codesdk.supervisor.engine import Engine, session_events
from codesdk.supervisor.store import DB_FILENAME, EventStore, TaskState
from codesdk.supervisor.workers.launch import WorkerPolicy
from codesdk.testing.invariants import check_session
from tests.conftest import MakeEngine
from tests.seeds import Seed
from tests.service.test_service import _client, _start, _wait_socket, kill_and_reap

ROUNDS = int(os.environ.get("CODESDK_CRASH_ROUNDS", "4"))
SEED = Seed.from_env("CODESDK_CRASH_SEED")


def _busy_scenario(calls: int = 6) -> dict[str, Any]:
    """Streams text slowly between sequential tool calls, so a kill can land anywhere."""
    steps: list[dict[str, Any]] = [{"text": "starting the work " * 4, "chunk_size": 8, "delay_s": 0.01}]
    for i in range(calls):
        steps.append({"tool_calls": [{"id": f"w{i}", "name": "workspace.write",
                                      "input": {"path": f"out/{i}.txt", "content": f"file {i}\n"}}]})
        steps.append({"tool_calls": [{"id": f"r{i}", "name": "workspace.read", "input": {"path": f"out/{i}.txt"}}]})
        steps.append({"text": f"wrote {i} ", "chunk_size": 4, "delay_s": 0.005})
    steps.append({"complete": {}})
    return {"name": "busy", "steps": steps}


def integrity_ok(data_dir: Path) -> None:
    connection = apsw.Connection(str(data_dir / DB_FILENAME))
    try:
        assert connection.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    finally:
        connection.close()


async def _kill_worker_when(engine: Engine, session_id: str, should_kill: Any, after_seq: int = 0) -> list[Any]:
    """Follow the session; SIGKILL its worker the moment ``should_kill(event, seen)`` says so (and there is one:
    a task's first events are stored before its worker is started)."""
    seen: list[Any] = []
    killed = False
    async with engine.store.subscribe(session_id, after_seq) as events:
        async for event in events:
            seen.append(event)
            if not killed and should_kill(event, seen):
                session = await engine.store.get_session(session_id)
                worker = engine.pool.worker_of(session.namespace)
                if worker is not None:
                    os.kill(worker.pid, signal.SIGKILL)
                    killed = True
            if event.type in TERMINAL_EVENT_TYPES:
                break
    assert killed, f"the kill point was never reached: {[(e.type.value, getattr(e.payload, 'code', '')) for e in seen]}"
    return seen


async def _check_after(engine: Engine, session_id: str, task_id: str, seen: list[Any]) -> list[Any]:
    record = await engine.wait_task(task_id)
    assert record.state == TaskState.FAILED and record.error is not None
    assert record.error["code"] == "WORKER_CRASHED"
    stored = await session_events(engine.store, session_id)
    check_session(stored)
    first = seen[0].seq - 1 if seen else 0
    assert stored[first: first + len(seen)] == seen, "an event a subscriber was handed is not stored as it was"
    terminals = [e for e in stored if e.trace.task_id == task_id and e.type in TERMINAL_EVENT_TYPES]
    assert [t.type for t in terminals] == [EventType.TASK_FAILED]
    return stored


def _kill_on_nth(type_: EventType, n: int = 1) -> Any:
    def should_kill(event: Any, seen: list[Any]) -> bool:
        return event.type == type_ and sum(1 for e in seen if e.type == type_) == n
    return should_kill


NAMED_POINTS = {
    "mid-stream": _kill_on_nth(EventType.MODEL_OUTPUT_DELTA, 3),
    "tool requested": _kill_on_nth(EventType.TOOL_CALL_REQUESTED, 2),
    "tool approved, result on its way": _kill_on_nth(EventType.TOOL_CALL_STARTED, 3),
    "result delivered": _kill_on_nth(EventType.TOOL_CALL_COMPLETED, 4),
}


@pytest.mark.parametrize("point", list(NAMED_POINTS))
async def test_worker_sigkill_at_a_named_point(make_engine: MakeEngine, tmp_path: Path, point: str) -> None:
    with trio.fail_after(60):
        async with make_engine() as engine:
            session = await engine.create_session(workspace=tmp_path / "ws")
            task = await engine.start_task(session.session_id, "go", permission_mode=PermissionMode.YOLO,
                                           runtime_config={"scenario_inline": _busy_scenario()})
            seen = await _kill_worker_when(engine, session.session_id, NAMED_POINTS[point])
            await _check_after(engine, session.session_id, task.task_id, seen)
            # The namespace serves the next task with a fresh worker.
            nxt = await engine.start_task(session.session_id, "again", runtime_config={"scenario": "echo"})
            assert (await engine.wait_task(nxt.task_id)).state == TaskState.COMPLETED
    integrity_ok(tmp_path / "data")


async def test_worker_sigkill_with_a_call_waiting_for_approval(make_engine: MakeEngine,
                                                               tmp_path: Path) -> None:
    async def never_answers(request: Any) -> Any:
        await trio.sleep_forever()

    with trio.fail_after(60):
        async with make_engine() as engine:
            session = await engine.create_session(workspace=tmp_path / "ws")
            task = await engine.start_task(session.session_id, "go", interaction_mode=InteractionMode.INTERACTIVE,
                                           approver=never_answers, runtime_config={"scenario": "write-or-deny"})
            seen = await _kill_worker_when(engine, session.session_id,
                                           _kill_on_nth(EventType.TOOL_CALL_REQUESTED))
            stored = await _check_after(engine, session.session_id, task.task_id, seen)
            types = [e.type for e in stored]
            assert EventType.TOOL_CALL_STARTED not in types  # never approved, never run
            assert not (tmp_path / "ws" / "notes.txt").exists()
    integrity_ok(tmp_path / "data")


async def test_worker_that_dies_before_initialize_fails_the_task_once(make_engine: MakeEngine,
                                                                      tmp_path: Path) -> None:
    suicide = (sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    with trio.fail_after(60):
        async with make_engine(worker_argv=suicide, worker_policy=WorkerPolicy(max_restarts=100)) as engine:
            session = await engine.create_session()
            for _ in range(2):
                task = await engine.start_task(session.session_id, "go", runtime_config={"scenario": "echo"})
                record = await engine.wait_task(task.task_id)
                assert record.state == TaskState.FAILED and record.error is not None
                assert record.error["code"] == "WORKER_UNAVAILABLE"
                assert "failed its handshake" in record.error["message"]
                assert "killed by signal SIGKILL" in record.error["message"]
            check_session(await session_events(engine.store, session.session_id))
    integrity_ok(tmp_path / "data")


async def test_worker_sigkill_at_random_points(make_engine: MakeEngine, tmp_path: Path) -> None:
    with SEED.rng() as rng, trio.fail_after(30 + 15 * ROUNDS):
        async with make_engine(worker_policy=WorkerPolicy(max_restarts=ROUNDS + 5)) as engine:
            session = await engine.create_session(workspace=tmp_path / "ws")
            for round_ in range(ROUNDS):
                at = rng.randrange(1, 60)  # the busy scenario stores ~100 events per task
                before = await engine.store.last_seq(session.session_id)
                task = await engine.start_task(session.session_id, f"round {round_}",
                                               permission_mode=PermissionMode.YOLO,
                                               runtime_config={"scenario_inline": _busy_scenario()})
                seen = await _kill_worker_when(engine, session.session_id,
                                               lambda e, s, at=at: len(s) >= at, after_seq=before)
                await _check_after(engine, session.session_id, task.task_id, seen)
    integrity_ok(tmp_path / "data")


# -- the supervisor itself, killed during heavy writes -----------------------------------------------

#: Per round, the service is SIGKILLed once its followers together have been handed a number of events drawn
#: from this range: deep into three floods, however fast or slow the machine is.
HANDED_BEFORE_KILL = (1_500, 6_000)
#: Hang guard only (a round that never gets there fails, with the counts); it never decides when to kill.
HANDED_GUARD_S = 180.0


class _Handed:
    """The events the followers were handed, per session; one can wait until they add up to a number."""

    def __init__(self) -> None:
        self.events: dict[str, list[dict[str, Any]]] = {}
        self.terminals: list[dict[str, Any]] = []  # a flood of a million events that ended before the kill failed
        self._grew = threading.Condition()

    def add(self, session_id: str, event: dict[str, Any]) -> None:
        with self._grew:
            self.events.setdefault(session_id, []).append(event)
            if event["type"] in {t.value for t in TERMINAL_EVENT_TYPES}:
                self.terminals.append(event)
            self._grew.notify_all()

    def count(self, session_ids: list[str]) -> int:
        with self._grew:
            return sum(len(self.events.get(sid, [])) for sid in session_ids)

    def wait_for(self, session_ids: list[str], count: int, guard_s: float) -> bool:
        """Until every follower of ``session_ids`` is live (was handed something) and together they were handed
        ``count`` events, or a task ended; False if ``guard_s`` ran out first."""
        def enough() -> bool:
            live = all(self.events.get(sid) for sid in session_ids)
            return (live and self.count(session_ids) >= count) or bool(self.terminals)

        with self._grew:
            return self._grew.wait_for(enough, guard_s)


def _follow(tmp_path: Path, session_id: str, handed: _Handed) -> None:
    """Collect the SSE events a client was handed until the connection breaks."""
    try:
        with _client(tmp_path) as client, client.stream(
                "GET", f"/v1/sessions/{session_id}/events/stream", timeout=None) as response:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    handed.add(session_id, json.loads(line[6:]))
    except (httpx.TransportError, httpx.HTTPError):
        pass


def test_supervisor_sigkill_during_heavy_writes_loses_nothing_it_published(tmp_path: Path) -> None:
    data = tmp_path / "data"
    handed = _Handed()
    with SEED.rng() as rng:
        for round_ in range(max(1, ROUNDS // 4)):  # a fresh seed each run: more rounds with CODESDK_CRASH_ROUNDS
            kill_at = rng.randrange(*HANDED_BEFORE_KILL)
            proc = _start(tmp_path, quiet=True)
            try:
                _wait_socket(tmp_path, HANDED_GUARD_S)
                sessions: list[str] = []
                followers = []
                with _client(tmp_path) as client:
                    for i in range(3):  # three tenants writing at once
                        session = client.post("/v1/sessions", json={"namespace": f"user:t{i}"}).json()
                        sid = session["session_id"]
                        handed.events[sid] = []
                        sessions.append(sid)
                        follower = threading.Thread(target=_follow, args=(tmp_path, sid, handed), daemon=True)
                        follower.start()
                        followers.append(follower)
                        flood = {"name": "flood", "steps": [{"flood": 1_000_000, "delta": "y" * 16}, {"complete": {}}]}
                        client.post(f"/v1/sessions/{sid}/tasks",
                                    json={"prompt": "x", "runtime_config": {"scenario_inline": flood}})
                reached = handed.wait_for(sessions, kill_at, HANDED_GUARD_S)
                assert not handed.terminals, f"round {round_}: a flood ended before the kill: {handed.terminals}"
                if not reached:
                    pytest.fail(f"round {round_}: the followers were handed {handed.count(sessions)} events, not "
                                f"the {kill_at} to kill at, within the {HANDED_GUARD_S:g}s hang guard")
            finally:
                kill_and_reap(proc)
            for follower in followers:
                follower.join(timeout=HANDED_GUARD_S)  # the stream breaks with the service: a hang guard only
                assert not follower.is_alive(), f"round {round_}: a follower still reads from a killed service"
            (data / "api.sock").unlink(missing_ok=True)
            integrity_ok(data)  # before anyone recovers anything
        trio.run(_check_every_session, data, handed.events)


async def _check_every_session(data: Path, published: dict[str, list[dict[str, Any]]]) -> None:
    """Reopen (recovering tasks left running), then compare with what the subscribers were handed."""
    from codesdk.supervisor.service.assembly import SupervisorOptions, open_engine

    async with open_engine(SupervisorOptions(data_dir=data)):
        pass  # recovery: running tasks -> task.failed SUPERVISOR_RESTARTED
    async with EventStore.open(data) as store:
        for session_id, handed in published.items():
            stored = await session_events(store, session_id)
            check_session(stored)
            received = [NormalizedEvent.model_validate(e) for e in handed]
            assert stored[: len(received)] == received, f"session {session_id}: a published event was lost or changed"
            terminals = [e for e in stored if e.type in TERMINAL_EVENT_TYPES]
            assert len(terminals) == len({e.trace.task_id for e in stored if e.trace.task_id})
            assert all(t.type == EventType.TASK_FAILED and t.payload.code == "SUPERVISOR_RESTARTED"  # type: ignore[attr-defined]
                       for t in terminals)
    integrity_ok(data)
