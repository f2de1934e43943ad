"""The service's metrics, as Prometheus reads them: what tasks did (outcomes by code, durations, first events, tool
calls, approval waits) as counters and histograms; the service's state with counters typed as counters; build and
process facts; tenant labels only where bounded; a metrics token that reads /metrics and nothing else; the metrics
port; and ``promtool check metrics`` where promtool is installed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import httpx2 as httpx
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from codesdk.supervisor.api.server import serve_api

from tests.api.conftest import Api


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _value(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def _tasks_of_every_outcome(api: Api) -> None:
    """A completed task, one with two tool calls, one with an approval, a failed one and a stopped one."""
    auth = api.auth(api.alice)
    sid = (await api.create_session(api.alice, "user:alice"))["session_id"]
    for scenario in ("echo", "parallel-tools", "fail"):
        task = await api.run_task(api.alice, sid, scenario)
        await api.ended(api.alice, task["task_id"])
    r = await api.client.post(f"/v1/sessions/{sid}/tasks", headers=auth, json={
        "prompt": "write", "interaction_mode": "interactive", "runtime_config": {"scenario": "write-or-deny"}})
    await api.decide_first_approval(api.alice, allow=True)
    await api.ended(api.alice, r.json()["task_id"])
    hung = await api.run_task(api.alice, sid, "hang")
    await api.client.post(f"/v1/tasks/{hung['task_id']}/stop", headers=auth, json={})


async def test_tasks_are_counted_and_timed_by_outcome(api: Api) -> None:
    with trio.fail_after(90):
        await _tasks_of_every_outcome(api)
        prometheus = api.tokens.add_principal("prometheus", [], metrics=True)
        r = await api.client.get("/metrics", headers=api.auth(prometheus))
        assert r.status_code == 200, r.text
        samples = _samples(r.text)
        assert _value(samples, "codesdk_tasks_started_total", runtime="scripted") == 5
        assert _value(samples, "codesdk_tasks_ended_total", outcome="completed", code="") == 3
        assert _value(samples, "codesdk_tasks_ended_total", outcome="failed", code="RATE_LIMITED") == 1
        assert _value(samples, "codesdk_tasks_ended_total", outcome="stopped", code="") == 1
        assert _value(samples, "codesdk_task_duration_seconds_count", outcome="completed") == 3
        assert _value(samples, "codesdk_task_duration_seconds_bucket", outcome="completed", le="+Inf") == 3
        assert _value(samples, "codesdk_task_first_event_seconds_count") >= 4
        assert _value(samples, "codesdk_model_request_seconds_count") >= 3
        tool_calls = sum(v for (name, _), v in samples.items() if name == "codesdk_tool_call_seconds_count")
        assert tool_calls >= 3  # two reads, one write
        assert _value(samples, "codesdk_approval_wait_seconds_count", decision="approved") == 1
        assert _value(samples, "codesdk_store_commit_seconds_count") >= 5
        assert _value(samples, "codesdk_http_request_duration_seconds_count", route="/v1/sessions/{session_id}/tasks") == 5
        for name in ("codesdk_tasks_ended", "codesdk_store_write_transactions", "codesdk_worker_starts",
                     "codesdk_http_requests", "codesdk_sse_events_sent", "codesdk_dropped_events"):
            [family] = [f for f in text_string_to_metric_families(r.text) if f.name == name]
            assert family.type == "counter", (name, family.type)
        assert _value(samples, "codesdk_store_write_transactions_total") > 0
        [info] = [k for k in samples if k[0] == "codesdk_build_info"]
        assert {label for label, _ in info[1]} == {"version", "python", "store"}
        assert _value(samples, "process_cpu_seconds_total") > 0
        assert _value(samples, "process_resident_memory_bytes") > 0
        # a namespace is a label only while it runs a worker (a bounded set), never for each one ever seen
        labelled = {dict(k[1]).get("namespace") for k in samples if k[0] == "codesdk_namespace_workers_started"}
        assert labelled <= {"user:alice"}


async def test_only_the_admin_or_a_metrics_token_reads_metrics_and_a_metrics_token_nothing_else(api: Api) -> None:
    with trio.fail_after(30):
        prometheus = api.tokens.add_principal("prometheus", [], metrics=True)
        for token, path, status in ((api.alice, "/metrics", 403), (api.admin, "/metrics", 200),
                                    (prometheus, "/metrics", 200), (prometheus, "/v1/sessions", 403),
                                    (prometheus, "/v1/workers", 403), (None, "/metrics", 401)):
            r = await api.client.get(path, headers=api.auth(token))
            assert r.status_code == status, (path, r.text)
        r = await api.client.post("/v1/sessions", headers=api.auth(prometheus), json={"namespace": "default"})
        assert r.status_code == 403 and "metrics" in r.json()["error"]["message"]
        with pytest.raises(ValueError, match="no namespace"):
            api.tokens.add_principal("both", ["user:alice"], metrics=True)


async def test_the_metrics_port_serves_metrics_and_probes_alone(api: Api, tmp_path: Path,
                                                                nursery: trio.Nursery) -> None:
    with trio.fail_after(30):
        prometheus = api.tokens.add_principal("prometheus", [], metrics=True)
        with trio.socket.socket() as probe:  # a free port on 127.0.0.1
            await probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        bound = await nursery.start(lambda task_status: serve_api(
            api.engine, api.tokens, tmp_path / "second.sock", None, metrics_port=port, task_status=task_status))
        assert f"http://127.0.0.1:{port}" in bound
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            headers = {"Authorization": f"Bearer {prometheus}"}
            assert (await client.get("/metrics", headers=headers)).status_code == 200
            assert (await client.get("/healthz")).status_code == 200
            r = await client.get("/v1/sessions", headers={"Authorization": f"Bearer {api.admin}"})
            assert r.status_code == 404 and "metrics port" in r.json()["error"]["message"]
            assert (await client.get("/metrics")).status_code == 401  # a token still, on the port too


@pytest.mark.skipif(shutil.which("promtool") is None,
                    reason="promtool is not installed (Debian: apt-get install prometheus; .ci/run does)")
async def test_promtool_finds_nothing_to_fault(api: Api) -> None:
    with trio.fail_after(90):
        await _tasks_of_every_outcome(api)
        text = (await api.client.get("/metrics", headers=api.auth(api.admin))).text
        checked = await trio.to_thread.run_sync(lambda: subprocess.run(
            ["promtool", "check", "metrics"], input=text.encode(), capture_output=True, timeout=60, check=False))
        assert checked.returncode == 0, (checked.stdout + checked.stderr).decode()
