"""http.fetch end to end: a scripted runtime in a real worker calls it; the supervisor asks a human first (in every
permission mode, unless the operator lets yolo tasks fetch unattended), then fetches from a server in the test's
own network namespace and stores the body. The engine and the API run in the test's own loop; only the server and
the fetch's sockets are in the namespace (tests/netns.py says why)."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import trio

from codesdk.protocol import EventType, PermissionMode
from codesdk.supervisor.egress import EgressPolicy, HostPattern, parse_network
from codesdk.supervisor.store import TaskState

from tests.api.conftest import serve_test_api
from tests.conftest import MakeEngine
from tests.e2e.conftest import of_type, run_task
from tests.netns import FreshNetns
from tests.tools.http_server import serve_in

SERVER = "127.0.0.2"


def fetching(url: str) -> dict[str, Any]:
    return {"name": "fetch", "steps": [
        {"tool_calls": [{"id": "f", "name": "http.fetch", "input": {"url": url}}],
         "on_denied": [{"text": "denied: {{denied:f}}"}, {"complete": {}}]},
        {"text": "{{result:f.text}}"}, {"complete": {}}]}


async def test_a_fetch_through_the_api_waits_for_approval_then_stores_the_body(make_engine: MakeEngine,
                                                                               tmp_path: Path) -> None:
    async with FreshNetns() as netns:
        server = await serve_in(netns, SERVER)
        egress = EgressPolicy(hosts=(HostPattern.parse(f"{SERVER}:{server.port}"),),
                              addresses=(parse_network(f"{SERVER}/32"),))
        with trio.fail_after(90):
            async with serve_test_api(partial(make_engine, fetch=egress, fetch_connect=netns.connect),
                                      tmp_path) as api:
                session = await api.create_session(api.alice, "user:alice")
                sid = session["session_id"]
                r = await api.client.post(f"/v1/sessions/{sid}/tasks", headers=api.auth(api.alice), json={
                    "prompt": "fetch", "interaction_mode": "interactive", "permission_mode": "yolo",
                    "runtime_config": {"scenario_inline": fetching(f"http://{SERVER}:{server.port}/text")}})
                assert r.status_code == 202, r.text
                while not (pending := (await api.client.get("/v1/approvals",
                                                            headers=api.auth(api.alice))).json()["approvals"]):
                    await trio.sleep(0.05)
                [approval] = pending
                assert (approval["tool_name"], approval["tool_class"]) == ("http.fetch", "network")
                assert server.hits == []  # nothing is fetched before a human says so, even in yolo mode
                decided = await api.client.post(f"/v1/approvals/{approval['approval_id']}",
                                                headers=api.auth(api.alice), json={"allow": True})
                assert decided.status_code == 200, decided.text
                task = await api.ended(api.alice, r.json()["task_id"])
                assert task["state"] == "completed", task
                events = (await api.client.get(f"/v1/sessions/{sid}/events",
                                               headers=api.auth(api.alice))).json()["events"]
                texts = [e["payload"]["text"] for e in events if e["type"] == "model.output.completed"]
                assert texts[-1] == "hello from the namespace"
                [completed] = [e["payload"] for e in events if e["type"] == "tool.call.completed"]
                assert completed["is_error"] is False and completed["sandbox"]["network"] is True
                result = (await api.client.get(f"/v1/sessions/{sid}/blobs/{completed['result_ref']}",
                                               headers=api.auth(api.alice))).json()
                stored = await api.client.get(f"/v1/sessions/{sid}/blobs/{result['body_ref']}",
                                              headers=api.auth(api.alice))
                assert stored.status_code == 200 and stored.content == b"hello from the namespace"
                assert server.hits == ["/text"]


async def test_a_non_interactive_fetch_is_denied_even_in_yolo_mode(make_engine: MakeEngine, tmp_path: Path) -> None:
    egress = EgressPolicy(hosts=(HostPattern.parse("api.example.test"),))
    with trio.fail_after(60):
        async with make_engine(fetch=egress) as engine:
            _, record, events = await run_task(engine, permission_mode=PermissionMode.YOLO, runtime_config={
                "scenario_inline": fetching("http://api.example.test/")})
    [denied] = of_type(events, EventType.TOOL_CALL_DENIED)
    assert "needs approval for network tool 'http.fetch'" in denied.reason and "non-interactive" in denied.reason
    assert not of_type(events, EventType.TOOL_CALL_STARTED) and record.state == TaskState.COMPLETED


async def test_with_unattended_fetches_a_non_interactive_yolo_task_fetches_and_auto_still_asks(
        make_engine: MakeEngine, tmp_path: Path) -> None:
    async with FreshNetns() as netns:
        server = await serve_in(netns, SERVER)
        egress = EgressPolicy(hosts=(HostPattern.parse(f"{SERVER}:{server.port}"),),
                              addresses=(parse_network(f"{SERVER}/32"),))
        url = f"http://{SERVER}:{server.port}/text"
        with trio.fail_after(90):
            async with make_engine(fetch=egress, fetch_unattended=True, fetch_connect=netns.connect) as engine:
                _, record, events = await run_task(engine, permission_mode=PermissionMode.YOLO,
                                                   runtime_config={"scenario_inline": fetching(url)})
                assert record.state == TaskState.COMPLETED and not of_type(events, EventType.TOOL_CALL_DENIED)
                [approved] = of_type(events, EventType.TOOL_CALL_APPROVED)
                assert approved.policy_snapshot["rule"] == "mode.yolo.network.unattended"
                [output] = of_type(events, EventType.MODEL_OUTPUT_COMPLETED)
                assert output.text == "hello from the namespace" and server.hits == ["/text"]
                _, _, events = await run_task(engine, permission_mode=PermissionMode.AUTO,
                                              runtime_config={"scenario_inline": fetching(url)})
        [denied] = of_type(events, EventType.TOOL_CALL_DENIED)
        assert "needs approval for network tool 'http.fetch'" in denied.reason and server.hits == ["/text"]
