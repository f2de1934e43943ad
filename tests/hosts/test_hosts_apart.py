"""Two supervisors on hosts that are really apart (network and mount namespaces of their own, no shared file, one
PostgreSQL reached over veth: tests/hosts/apart.py): a namespace's tasks move on failover, and a session that
cannot go on with its files on the new host says why; blobs come from the database; a client of one host follows a
session the other runs; a token revoked on one is refused on the other."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from codesdk import Client, NamespaceElsewhere

from tests.hosts.apart import Deployment, HostSupervisor, hosts_apart, unavailable
from tests.postgres import unavailable as postgres_unavailable
from tests.service.service_process import TERMINALS, fail_over
from tests.waits import wait_for


pytestmark = [
    pytest.mark.skipif(postgres_unavailable() is not None, reason=postgres_unavailable() or ""),
    pytest.mark.skipif(unavailable() is not None, reason=unavailable() or ""),
]


@pytest.fixture
def deployment() -> Iterator[Deployment]:
    with hosts_apart() as made:
        yield made


def follow(supervisor: HostSupervisor, session_id: str) -> list[dict[str, Any]]:
    """The session's events over SSE from ``supervisor`` until the next terminal event."""
    events: list[dict[str, Any]] = []
    with supervisor.client.stream("GET", f"/v1/sessions/{session_id}/events/stream",
                                  params={"until_terminal": "true"}) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[len("data: "):]))
    return events


def test_the_hosts_share_no_file_and_reach_the_database_over_their_links(deployment: Deployment) -> None:
    a, b = deployment.a, deployment.b
    assert a.data_dir == b.data_dir  # one path, as the docs ask of every host…
    a.host.path(a.data_dir / "only-on-a").write_text("a")  # a file written on A is not on B
    assert not b.host.path(b.data_dir / "only-on-a").exists()
    assert not a.data_dir.exists()  # …each host's own: none of it in the test's file system
    assert deployment.database.tcp is not None
    assert urlsplit(deployment.store).hostname == deployment.database.tcp.address  # the hosts' way in: TCP
    import psycopg

    with psycopg.connect(deployment.local_store) as conn:  # (the test's own way in: the server's unix socket)
        registry = [json.loads(api) for (api,) in conn.execute("SELECT api FROM supervisors")]
    assert sorted(registry) == [[a.advertised], [b.advertised]]


def test_a_killed_hosts_namespace_moves_and_a_session_without_its_workspace_says_why(deployment: Deployment) -> None:
    a, b = deployment.a, deployment.b
    session = a.session("user:carol")["session_id"]
    workspace = Path(a.client.get(f"/v1/sessions/{session}").json()["workspace"])
    assert a.host.path(workspace).is_dir()
    task = a.task(session, "hang")["task_id"]
    after = fail_over(a, b, session, task)
    # The session's files were on A's disk only: on B its next task is refused, saying why, and nothing is stored.
    assert not b.host.path(workspace).exists()
    refused = b.client.post(f"/v1/sessions/{session}/tasks",
                            json={"prompt": "go on", "runtime_config": {"scenario": "echo"}})
    assert refused.status_code == 409, refused.text
    error = refused.json()["error"]
    assert error["code"] == "workspace_missing"
    assert str(workspace) in error["message"] and "not on this host" in error["message"]
    assert "Past one machine" in error["message"]
    assert b.events(session) == after
    # The namespace itself runs on B now: a new session there has its workspace (and HOME) on B's disk.
    fresh = b.session("user:carol")["session_id"]
    done = b.task(fresh)["task_id"]
    wait_for("carol's new session's task to complete on B", lambda: b.task_state(done) == "completed")
    assert b.host.path(Path(b.client.get(f"/v1/sessions/{fresh}").json()["workspace"])).is_dir()


def test_a_blob_stored_through_one_host_is_served_by_the_other(deployment: Deployment) -> None:
    a, b = deployment.a, deployment.b
    session = a.session("user:dora")["session_id"]
    done = a.task(session)["task_id"]
    wait_for("dora's task to complete on A", lambda: a.task_state(done) == "completed")
    [ref] = [e["payload"]["input_ref"] for e in a.events(session) if e["type"] == "model.input"]
    from_a = a.client.get(f"/v1/sessions/{session}/blobs/{ref}")
    assert from_a.status_code == 200, from_a.text
    from_b = b.client.get(f"/v1/sessions/{session}/blobs/{ref}")
    assert from_b.status_code == 200, from_b.text
    assert from_b.content == from_a.content
    assert "sha256:" + hashlib.sha256(from_b.content).hexdigest() == ref


def test_a_client_of_one_host_follows_a_session_the_other_runs(deployment: Deployment) -> None:
    a, b = deployment.a, deployment.b
    session = a.session("user:erin")["session_id"]
    # A write for A's namespace that reaches B is told where A is: the address A advertises, not a path of B's.
    refused = b.client.post(f"/v1/sessions/{session}/tasks", json={"prompt": "x"})
    assert refused.status_code == 421, refused.text
    assert refused.json()["error"]["details"]["supervisor"]["api"] == [a.advertised]
    with Client(socket=b.socket, token=b.token) as client, pytest.raises(NamespaceElsewhere) as elsewhere:
        client.start_task(session, "x")
    assert elsewhere.value.api == [a.advertised]
    # A client of B follows the task A runs: every event, in order, up to its terminal.
    task = a.task(session, "slow-stream")["task_id"]
    followed = follow(b, session)
    assert followed[-1]["type"] in TERMINALS and followed[-1]["trace"]["task_id"] == task
    assert [e["seq"] for e in followed] == list(range(1, len(followed) + 1))
    assert followed == a.events(session)[:len(followed)]


def test_a_token_revoked_on_one_host_is_refused_on_the_other(deployment: Deployment) -> None:
    a, b = deployment.a, deployment.b
    added = a.client.post("/v1/tokens", json={"name": "frank", "namespaces": ["user:frank"]})
    assert added.status_code == 201, added.text
    token = added.json()["secret"]
    # made on A, known to B once its notice arrives (B re-reads the shared table)
    wait_for("B to know the token made on A", lambda: b.client.get(
        "/v1/me", headers={"Authorization": f"Bearer {token}"}).status_code == 200)
    revoked = a.client.delete(f"/v1/tokens/{added.json()['token']['id']}")
    assert revoked.status_code in (200, 204), revoked.text
    wait_for("B to refuse the revoked token", lambda: b.client.get(
        "/v1/me", headers={"Authorization": f"Bearer {token}"}).status_code == 401)
