"""Two ``codesdk-supervisor serve`` processes on one PostgreSQL database: namespaces spread over both, a session
followed on one while the other runs it, a supervisor SIGKILLed and its namespaces taken over, the database's
postmaster SIGKILLed mid-write and the service recovering when it is back."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from codesdk import Client, NamespaceElsewhere

from tests.postgres import PostgresServer
from tests.postgres import unavailable as postgres_unavailable
from tests.service.service_process import TERMINALS, ServiceProcess, fail_over
from tests.waits import wait_for
from tests.worker.harness import REPO

SCENARIOS = str(REPO / "worker" / "adapters" / "scripted" / "scenarios")
#: Short leases, so a takeover comes soon after a death (renewed every third of it).
LEASE_S = 2.0
#: The deployment key every supervisor of these tests shares (namespace variables are kept under it).
SECRET_KEY = base64.b64encode(os.urandom(32)).decode()

pytestmark = pytest.mark.skipif(postgres_unavailable() is not None, reason=postgres_unavailable() or "")


class Supervisor(ServiceProcess):
    """One service process with a data dir of its own, on the shared store. ``admin_token``: the deployment's
    (the tokens are the database's: the first supervisor makes it, the others' operator copies it)."""

    def __init__(self, data_dir: Path, store: str, admin_token: str | None = None) -> None:
        self.data_dir = data_dir
        self.socket = data_dir / "api.sock"
        self.token_file = data_dir / "admin.token"
        self.what = f"the supervisor on {self.socket}"
        argv = [sys.executable, "-m", "codesdk.supervisor.cli.admin", "serve", "--data-dir", str(data_dir),
                "--enable-test-scenarios", "--store", store, "--lease-s", str(LEASE_S), "--no-worker-template"]
        self.log = data_dir.parent / f"{data_dir.name}.log"
        data_dir.mkdir(mode=0o700)
        if admin_token is not None:
            self.token_file.write_text(admin_token + "\n")
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(argv, env={**os.environ, "CODESDK_SCENARIO_DIR": SCENARIOS,
                                                       "CODESDK_SECRET_KEY": SECRET_KEY}, cwd=REPO,
                                            stdout=subprocess.DEVNULL, stderr=log)
        self._wait_serving()


@contextmanager
def supervisors(tmp_path: Path, store: str, count: int) -> Iterator[list[Supervisor]]:
    started: list[Supervisor] = []
    try:
        for name in "abcdefgh"[:count]:
            admin = (started[0].data_dir / "admin.token").read_text().strip() if started else None
            started.append(Supervisor(tmp_path / name, store, admin))
        yield started
    finally:
        for supervisor in started:
            supervisor.stop()


def follow(supervisor: Supervisor, session_id: str) -> list[dict[str, Any]]:
    """The session's events over SSE from ``supervisor`` until the next terminal event."""
    events: list[dict[str, Any]] = []
    with supervisor.client.stream("GET", f"/v1/sessions/{session_id}/events/stream",
                                  params={"until_terminal": "true"}) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[len("data: "):]))
    return events


def test_namespaces_spread_over_two_supervisors_and_each_is_followed_from_either(
        tmp_path: Path, postgres_url: str) -> None:
    with supervisors(tmp_path, postgres_url, 2) as (a, b):
        on_a = a.session("user:alice")
        on_b = b.session("user:bob")
        # A namespace runs where its lease is: the other supervisor answers with where to go.
        refused = b.client.post("/v1/sessions", json={"namespace": "user:alice"})
        assert refused.status_code == 421, refused.text
        error = refused.json()["error"]
        assert error["code"] == "namespace_elsewhere"
        assert error["details"]["supervisor"]["api"] == [f"unix:{a.socket}"]
        refused = a.client.post(f"/v1/sessions/{on_b['session_id']}/tasks", json={"prompt": "x"})
        assert refused.status_code == 421 and refused.json()["error"]["details"]["namespace"] == "user:bob"
        token = (a.data_dir / "admin.token").read_text().strip()
        with Client(socket=a.socket, token=token) as client, pytest.raises(NamespaceElsewhere) as elsewhere:
            client.create_session(namespace="user:bob")
        assert elsewhere.value.api == [f"unix:{b.socket}"] and "user:bob" in elsewhere.value.message
        # Keys no store can hold (PostgreSQL text has no NUL) are unknown, as on SQLite; a bad name is refused.
        assert a.client.get("/v1/sessions/ses_%00x").status_code == 404
        assert a.client.get("/v1/tasks/task_%00x").status_code == 404
        assert a.client.get("/v1/sessions", params={"namespace": "user:a\x00"}).status_code == 422
        assert b.client.post("/v1/sessions", json={"namespace": "user:zed", "runtime": "x\x00"}).status_code == 422
        # A client of A follows the session B runs: every event, in order, no gap, up to its terminal.
        task = b.task(on_b["session_id"], "slow-stream")
        followed = follow(a, on_b["session_id"])
        assert followed[-1]["type"] in TERMINALS and followed[-1]["trace"]["task_id"] == task["task_id"]
        assert [e["seq"] for e in followed] == list(range(1, len(followed) + 1))
        assert followed == b.events(on_b["session_id"])[:len(followed)]
        # And each runs its own namespace's tasks.
        done = a.task(on_a["session_id"])
        wait_for("alice's task to complete", lambda: a.task_state(done["task_id"]) == "completed")
        workers = {w["namespace"] for w in a.client.get("/v1/workers").json()["workers"]}
        assert "user:alice" in workers and "user:bob" not in workers


def test_a_token_made_or_revoked_on_one_supervisor_is_so_on_the_other(tmp_path: Path, postgres_url: str) -> None:
    """The tokens are the database's: what the API of A changes holds on B as soon as B hears of it, event streams
    already open on B included."""
    with supervisors(tmp_path, postgres_url, 2) as (a, b):
        made = a.client.post("/v1/tokens", json={"name": "dora", "namespaces": ["user:dora"]})
        assert made.status_code == 201, made.text
        dora = {"Authorization": f"Bearer {made.json()['secret']}"}
        wait_for("B to accept the token A made", lambda: b.client.get("/v1/sessions", headers=dora).status_code == 200)
        session = b.client.post("/v1/sessions", json={"namespace": "user:dora"}, headers=dora)
        assert session.status_code == 201, session.text
        # A stream dora opened on B before the revoke ends too, saying why (not only her new requests fail).
        with b.client.stream("GET", f"/v1/sessions/{session.json()['session_id']}/events/stream",
                             headers=dora) as stream:
            assert stream.status_code == 200
            assert a.client.delete(f"/v1/tokens/{made.json()['token']['id']}").status_code == 200
            last = [line for line in stream.iter_lines() if line.startswith(("event: ", "data: "))][-2:]
        assert last[0] == "event: error" and json.loads(last[1][len("data: "):])["error"]["code"] == "token_revoked"
        wait_for("B to refuse the token A revoked",
                 lambda: b.client.get("/v1/sessions", headers=dora).status_code == 401)
        assert a.client.get("/v1/sessions", headers=dora).status_code == 401


def test_a_killed_supervisors_namespaces_move_to_the_other_after_the_lease_expires(
        tmp_path: Path, postgres_url: str) -> None:
    with supervisors(tmp_path, postgres_url, 2) as (a, b):
        session = a.session("user:carol")["session_id"]
        task = a.task(session, "hang")["task_id"]
        fail_over(a, b, session, task)
        # The namespace runs on B now.
        again = b.task(session)["task_id"]
        wait_for("carol's next task to complete on B", lambda: b.task_state(again) == "completed")
        assert len([e for e in b.events(session) if e["type"] in TERMINALS]) == 2


def test_a_killed_database_is_reported_and_nothing_unstored_is_acknowledged(tmp_path: Path) -> None:
    server = PostgresServer()
    try:
        server.start()
        url = server.new_database()
        with supervisors(tmp_path, url, 1) as (a,):
            session = a.session("user:dave")["session_id"]
            task = a.task(session, "hang")["task_id"]
            wait_for("dave's task to stream", lambda: any(e["type"] == "model.output.delta"
                                                           for e in a.events(session)))
            acknowledged = a.events(session)
            server.kill()
            wait_for("readiness to report the store", lambda: a.client.get("/readyz").status_code == 503)
            refused = a.client.post("/v1/sessions", json={"namespace": "user:erin"})
            assert refused.status_code >= 500, refused.text  # not acknowledged: nothing claims it was stored
            server.start()
            wait_for("readiness to come back", lambda: a.client.get("/readyz").status_code == 200)
            created = a.session("user:erin")
            assert created["namespace"] == "user:erin"
            stopped = a.client.post(f"/v1/tasks/{task}/stop", json={})
            assert stopped.status_code in (200, 409), stopped.text
            wait_for("dave's task to end", lambda: a.task_state(task) in ("failed", "stopped"))
            after = a.events(session)
            assert after[:len(acknowledged)] == acknowledged
            assert [e["seq"] for e in after] == list(range(1, len(after) + 1))
            assert len([e for e in after if e["type"] in TERMINALS]) == 1
    finally:
        server.close()
