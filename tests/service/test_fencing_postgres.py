"""Fenced writes between two real ``codesdk-supervisor serve`` processes on one PostgreSQL database: a supervisor
paused (SIGSTOP) past its lease while its task keeps streaming, and a request waiting for it, is taken over by the
other; once resumed it lets the namespace go, and nothing it had queued lands after the takeover."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

import httpx2 as httpx
import psycopg
import pytest

from tests.postgres import unavailable as postgres_unavailable
from tests.service.service_process import TERMINALS
from tests.service.test_two_supervisors import Supervisor, supervisors
from tests.waits import wait_for

pytestmark = pytest.mark.skipif(postgres_unavailable() is not None, reason=postgres_unavailable() or "")

NAMESPACE = "user:paused"
#: A task that writes for as long as the test needs: a delta every few milliseconds, then a hang.
STREAMING = {"name": "keeps-writing", "steps": [
    {"text": "tick " * 40_000, "chunk_size": 5, "delay_s": 0.005}, {"hang": True}]}


def _lease(url: str) -> tuple[str, Any]:
    """Who holds the namespace's lease, and since when."""
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT supervisor_id, taken_at FROM namespace_leases WHERE namespace = %s",
                           (NAMESPACE,)).fetchone()
    assert row is not None
    return str(row[0]), row[1]


def _let_go(supervisor: Supervisor) -> bool:
    log = supervisor.log.read_text(errors="replace")
    lost = (f"the lease of namespace {NAMESPACE} was lost" in log
            or f"namespace {NAMESPACE}: a write was refused" in log)
    workers = supervisor.client.get("/v1/workers").json()["workers"]
    return lost and all(worker["namespace"] != NAMESPACE or worker.get("pid") is None for worker in workers)


def _waiting_on_a_lock(url: str) -> bool:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                           "AND application_name = 'codesdk-supervisor'").fetchone()
    return row is not None and bool(row[0])


def _paused_past_its_lease(a: Supervisor, b: Supervisor, url: str, *, write_in_flight: bool) -> None:
    """A runs a task that keeps writing; A is stopped past its lease (with a session-creating request waiting for
    it, and with ``write_in_flight`` an append inside its transaction, held there until B has taken the namespace
    over); B takes over and fails the task; A goes on and lets the namespace go: nothing of A's lands after the
    takeover."""
    session = a.session(NAMESPACE)["session_id"]
    started = a.client.post(f"/v1/sessions/{session}/tasks", json={
        "prompt": "go", "runtime_config": {"scenario_inline": STREAMING}})
    assert started.status_code == 202, started.text
    task = started.json()["task_id"]
    wait_for("A's task to stream", lambda: len(a.events(session)) > 20)
    a_holder, _ = _lease(url)
    late: dict[str, httpx.Response] = {}

    def create_late() -> None:  # waits in A's socket while A is stopped, answered once it goes on
        late["response"] = a.client.post("/v1/sessions", json={"namespace": NAMESPACE})

    blocker = psycopg.connect(url)
    request = threading.Thread(target=create_late)
    try:
        if write_in_flight:  # A's next append waits for the session's row, inside its transaction
            blocker.execute("SELECT 1 FROM sessions WHERE session_id = %s FOR UPDATE", (session,))
            wait_for("A's append to wait for the session's row", lambda: _waiting_on_a_lock(url))
        os.kill(a.process.pid, signal.SIGSTOP)
        request.start()
        if write_in_flight:
            wait_for("B to take the lease over", lambda: _lease(url)[0] != a_holder)
            blocker.commit()  # A's append gets the row now, after the takeover, then sits idle: A is stopped
        wait_for("B to take the namespace over and fail the task A left", lambda: b.task_state(task) == "failed")
        b_holder, _ = _lease(url)
        assert b_holder != a_holder
        events = b.events(session)
        [failure] = [e for e in events if e["type"] in TERMINALS]
        assert failure["payload"]["code"] == "SUPERVISOR_RESTARTED"
    finally:
        blocker.close()
        os.kill(a.process.pid, signal.SIGCONT)
        if request.ident is not None:  # started
            request.join()
    wait_for("A to let the namespace go", lambda: _let_go(a))

    # Nothing of A's landed after the takeover: no event after B's failure of the task, no new session.
    after = b.events(session)
    assert after[:len(events)] == events
    assert [e for e in after if e["seq"] > failure["seq"]] == []
    assert [e["seq"] for e in after] == list(range(1, len(after) + 1))
    assert len([e for e in after if e["type"] in TERMINALS]) == 1  # the task ended exactly once
    assert b.task_state(task) == "failed"
    assert late["response"].status_code in (421, 503), late["response"].text
    if write_in_flight:  # the append got its rows after the takeover: the lease's epoch refused it
        assert "event(s) refused, not stored" in a.log.read_text(errors="replace")
    sessions = b.client.get("/v1/sessions", params={"namespace": NAMESPACE}).json()["sessions"]
    assert [s["session_id"] for s in sessions] == [session]
    # The namespace is B's: A sends a new request there to B, and B serves it.
    assert a.client.post("/v1/sessions", json={"namespace": NAMESPACE}).status_code == 421
    assert b.session(NAMESPACE)["namespace"] == NAMESPACE


def test_a_paused_supervisor_writes_nothing_after_its_namespace_was_taken_over(
        tmp_path: Path, postgres_url: str) -> None:
    with supervisors(tmp_path, postgres_url, 2) as (a, b):
        _paused_past_its_lease(a, b, postgres_url, write_in_flight=False)


def test_a_write_in_flight_when_its_supervisor_stopped_neither_lands_nor_holds_up_the_takeover(
        tmp_path: Path, postgres_url: str) -> None:
    """A's append is inside its transaction when A stops, and gets its rows only after B took the lease: it sees
    the new epoch, and its transaction, left stalled by the stopped A (pipelined: no server timer runs), is ended by
    B's write it blocks (a quarter of the lease) so that B can fail the task."""
    with supervisors(tmp_path, postgres_url, 2) as (a, b):
        _paused_past_its_lease(a, b, postgres_url, write_in_flight=True)
