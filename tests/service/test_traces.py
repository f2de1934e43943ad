"""Traces of tasks at an OTLP collector: an in-process one (HTTP on 127.0.0.1, the OTLP protobuf decoded with the
reference definitions) receives the task's span and its children — model requests, tool calls, an approval wait,
store commits — joined to the caller's W3C trace; both through an engine in this process and through
``codesdk-supervisor serve --otlp-endpoint``."""

from __future__ import annotations

import gzip
import signal
import threading
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from codesdk.protocol import TraceParent, parse_traceparent

from tests.api.conftest import Api
from tests.api.conftest import api as api  # noqa: F401 - the fixture, served here too
from tests.service.test_service import _client, _start, _wait_socket
from tests.waits import wait_for

pytest.importorskip("opentelemetry.sdk", reason="traces need the otel extra (./scripts/bootstrap installs it)")

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (  # noqa: E402
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from codesdk.supervisor.observe.tracing import open_tracer, traces_url  # noqa: E402

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


class Collector:
    """Spans received on ``url`` (``/v1/traces``), as dicts: name, ids, parent, attributes, status."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def receive(self, body: bytes) -> None:
        request = ExportTraceServiceRequest.FromString(body)
        with self.lock:
            for resource in request.resource_spans:
                service = {a.key: a.value.string_value for a in resource.resource.attributes}
                for scope in resource.scope_spans:
                    for span in scope.spans:
                        attributes: dict[str, Any] = {}
                        for a in span.attributes:
                            kind = a.value.WhichOneof("value")
                            attributes[a.key] = getattr(a.value, kind) if kind else None
                        self.spans.append({
                            "name": span.name, "trace_id": span.trace_id.hex(), "span_id": span.span_id.hex(),
                            "parent": span.parent_span_id.hex(), "attributes": attributes,
                            "status": span.status.code, "service": service.get("service.name"),
                            "events": [e.name for e in span.events]})

    def named(self, name: str) -> list[dict[str, Any]]:
        with self.lock:
            return [s for s in self.spans if s["name"] == name]


@contextmanager
def collector() -> Iterator[tuple[Collector, str]]:
    got = Collector()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            encoding = self.headers.get("content-encoding")
            if encoding == "gzip":
                body = gzip.decompress(body)
            elif encoding == "deflate":
                body = zlib.decompress(body)
            if self.path != "/v1/traces":
                self.send_response(404)
                self.end_headers()
                return
            got.receive(body)
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, name="otlp-collector", daemon=True)
    thread.start()
    try:
        yield got, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def _check_task_tree(got: Collector, task_id: str) -> None:
    [task] = [s for s in got.named("codesdk.task") if s["attributes"]["codesdk.task_id"] == task_id]
    assert task["trace_id"] == "4bf92f3577b34da6a3ce929d0e0e4736" and task["parent"] == "00f067aa0ba902b7"
    assert task["attributes"]["codesdk.outcome"] == "completed" and task["service"] == "codesdk-supervisor"
    assert task["attributes"]["codesdk.request_id"] == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert "codesdk.first_worker_event" in task["events"]
    children = [s for s in got.spans if s["parent"] == task["span_id"]]
    names = {s["name"] for s in children}
    assert {"codesdk.model_request", "codesdk.tool_call", "codesdk.store.commit"} <= names, names
    assert all(s["trace_id"] == task["trace_id"] for s in children)
    tools = [s for s in children if s["name"] == "codesdk.tool_call"]
    assert all(s["attributes"]["codesdk.outcome"] == "ok" and s["attributes"]["codesdk.tool_class"] for s in tools)


async def test_a_task_is_a_span_with_its_steps_in_the_callers_trace(api: Api) -> None:
    with trio.fail_after(60), collector() as (got, endpoint):
        tracer, shutdown = open_tracer(endpoint)
        api.engine.observers.add(tracer)
        auth = api.auth(api.alice)
        sid = (await api.create_session(api.alice, "user:alice"))["session_id"]
        r = await api.client.post(f"/v1/sessions/{sid}/tasks", headers={**auth, "traceparent": PARENT},
                                  json={"prompt": "read", "runtime_config": {"scenario": "parallel-tools"}})
        task_id = r.json()["task_id"]
        await api.ended(api.alice, task_id)
        r = await api.client.post(f"/v1/sessions/{sid}/tasks", headers=auth, json={
            "prompt": "write", "interaction_mode": "interactive", "runtime_config": {"scenario": "write-or-deny"}})
        second = r.json()["task_id"]
        await api.decide_first_approval(api.alice, allow=False)
        await api.ended(api.alice, second)
        await trio.to_thread.run_sync(shutdown)  # flushes what is queued
        _check_task_tree(got, task_id)
        [wait] = got.named("codesdk.approval_wait")
        assert wait["attributes"]["codesdk.outcome"] == "denied"
        [own] = [s for s in got.named("codesdk.task") if s["attributes"]["codesdk.task_id"] == second]
        assert own["trace_id"] != "4bf92f3577b34da6a3ce929d0e0e4736" and own["parent"] == ""  # no traceparent: a root
        events = (await api.client.get(f"/v1/sessions/{sid}/events?limit=1000", headers=auth)).json()["events"]
        first_task = [e for e in events if e["trace"].get("task_id") == task_id]
        assert {e["trace"].get("request_id") for e in first_task} == {"4bf92f3577b34da6a3ce929d0e0e4736"}


def test_the_service_sends_traces_to_the_collector_it_is_given(tmp_path: Path) -> None:
    with collector() as (got, endpoint):
        proc = _start(tmp_path, None, "--otlp-endpoint", endpoint)
        try:
            _wait_socket(tmp_path)
            with _client(tmp_path) as client:
                sid = client.post("/v1/sessions", json={"namespace": "default"}).json()["session_id"]
                task_id = client.post(f"/v1/sessions/{sid}/tasks", headers={"traceparent": PARENT, "x-client-id": "app-7"},
                                      json={"prompt": "read", "runtime_config": {"scenario": "parallel-tools"}}
                                      ).json()["task_id"]
                wait_for("the task to end", lambda: client.get(f"/v1/tasks/{task_id}").json()["state"] == "completed")
        finally:
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err.decode()
        _check_task_tree(got, task_id)  # sent by the time the service exited
        [task] = [s for s in got.named("codesdk.task") if s["attributes"]["codesdk.task_id"] == task_id]
        assert task["attributes"]["codesdk.client_id"] == "app-7"


def test_an_endpoint_that_is_no_url_is_refused_at_start(tmp_path: Path) -> None:
    proc = _start(tmp_path, None, "--otlp-endpoint", "collector:4318")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "--otlp-endpoint" in err.decode() and "Traceback" not in err.decode()
    assert traces_url("http://c:4318") == "http://c:4318/v1/traces"
    assert traces_url("https://c/otlp/v1/traces") == "https://c/otlp/v1/traces"


_HEX = "0123456789abcdef"


@given(trace_id=st.text(_HEX, min_size=32, max_size=32), parent_id=st.text(_HEX, min_size=16, max_size=16),
       flags=st.text(_HEX, min_size=2, max_size=2), version=st.text(_HEX, min_size=2, max_size=2))
def test_traceparent_round_trips_and_refuses_what_the_spec_refuses(trace_id: str, parent_id: str, flags: str,
                                                                   version: str) -> None:
    header = f"{version}-{trace_id}-{parent_id}-{flags}"
    parsed = parse_traceparent(header)
    valid = version != "ff" and set(trace_id) != {"0"} and set(parent_id) != {"0"}
    assert (parsed == TraceParent(version, trace_id, parent_id, flags)) == valid
    assert parsed is None or parsed.header() == header
    assert parse_traceparent(header.upper()) is None or header == header.upper()
    assert (parse_traceparent(header + "-more") is not None) == (valid and version != "00")


@given(st.text(max_size=80))
def test_traceparent_parsing_never_fails_on_any_text(text: str) -> None:
    parsed = parse_traceparent(text)
    assert parsed is None or parse_traceparent(parsed.header()) == parsed
