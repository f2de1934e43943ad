"""What watching tasks costs: the event flood of case 1 with no observer (as ``codesdk run`` has it), with the
service's metrics (the default when serving), and with metrics and traces sent to a local OTLP sink (the otel
extra). Interleaved, so a noisy moment hits each alike; the ratios are against no observer."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import trio

from codesdk.supervisor.engine import Telemetry
from codesdk.supervisor.observe.metrics import TaskMetrics

from scripts.benchmarks.cases import events_codesdk


@contextmanager
def otlp_sink() -> Iterator[str]:
    """An OTLP/HTTP endpoint on 127.0.0.1 that takes every export and keeps nothing."""

    class Sink(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
            self.rfile.read(int(self.headers.get("content-length", "0")))
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def run(n: int, repeat: int) -> dict[str, list[float]]:
    """Events/s of each setting, ``repeat`` times, interleaved: {"none": [...], "metrics": [...], "traces": [...]}
    ("traces" is absent without the otel extra)."""
    try:
        from codesdk.supervisor.observe.tracing import open_tracer
    except ImportError:
        open_tracer = None  # type: ignore[assignment]
    results: dict[str, list[float]] = {"none": [], "metrics": []}
    with otlp_sink() as endpoint:
        for _ in range(repeat):
            results["none"].append(trio.run(events_codesdk, n)[0])
            metrics: list[Telemetry] = [TaskMetrics()]
            results["metrics"].append(trio.run(lambda: events_codesdk(n, observers=metrics))[0])
            if open_tracer is not None:
                tracer, shutdown = open_tracer(endpoint)
                try:
                    results.setdefault("traces", []).append(
                        trio.run(lambda: events_codesdk(n, observers=[TaskMetrics(), tracer]))[0])
                finally:
                    shutdown()
    return results
