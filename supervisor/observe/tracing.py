"""OpenTelemetry traces of tasks, sent by OTLP over HTTP (protobuf) to the collector the operator names
(``serve --otlp-endpoint URL``, or the standard ``OTEL_EXPORTER_OTLP_ENDPOINT``): each task is a span
(``codesdk.task``), its model requests, tool calls, approval waits and store commits its children. A task started
with a W3C ``traceparent`` joins that trace. Needs the ``otel`` extra; without an endpoint this module is never
imported and the engine's hooks have no tracer to call.

Spans are handed to the SDK's batch processor, whose thread exports them: the event loop never waits on the
collector, and spans a slow collector cannot take are dropped (the SDK's bounded queue), never the service slowed.
"""

from __future__ import annotations

from collections.abc import Callable

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import NonRecordingSpan, Span, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from codesdk._version import __version__
from codesdk.protocol import EventType, TraceParent

_REQUEST_STARTED = EventType.RUNTIME_REQUEST_STARTED.value
_REQUEST_COMPLETED = EventType.RUNTIME_REQUEST_COMPLETED.value


def traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL of a collector's base endpoint (``http://host:4318`` → ``…/v1/traces``); a URL
    that already names a path is taken as it is."""
    trimmed = endpoint.rstrip("/")
    scheme, _, rest = trimmed.partition("://")
    if not rest:
        raise ValueError(f"an OTLP endpoint is an http(s) URL (http://collector:4318), not {endpoint!r}")
    if scheme not in ("http", "https"):
        raise ValueError(f"an OTLP endpoint is an http(s) URL, not {scheme}:")
    return trimmed if "/" in rest else f"{trimmed}/v1/traces"


class TaskTracer:
    """The engine's ``Telemetry`` as spans."""

    def __init__(self, provider: trace.TracerProvider) -> None:
        self._tracer = provider.get_tracer("codesdk.supervisor", __version__)

    def task(self, *, task_id: str, session_id: str, namespace: str, runtime: str, request_id: str | None,
             client_id: str | None, parent: TraceParent | None) -> _TaskSpans:
        context = None
        if parent is not None:
            remote = SpanContext(trace_id=int(parent.trace_id, 16), span_id=int(parent.parent_id, 16),
                                 is_remote=True, trace_flags=TraceFlags(int(parent.flags, 16) & 1))
            context = trace.set_span_in_context(NonRecordingSpan(remote))
        attributes = {"codesdk.task_id": task_id, "codesdk.session_id": session_id, "codesdk.namespace": namespace,
                      "codesdk.runtime": runtime}
        attributes |= {key: value for key, value in (("codesdk.request_id", request_id),
                                                     ("codesdk.client_id", client_id)) if value}
        span = self._tracer.start_span("codesdk.task", context=context, kind=SpanKind.INTERNAL, attributes=attributes)
        return _TaskSpans(self._tracer, span)


class _TaskSpans:
    __slots__ = ("_context", "_first_seen", "_request", "_span", "_tracer")

    def __init__(self, tracer: trace.Tracer, span: Span) -> None:
        self._tracer = tracer
        self._span = span
        self._context = trace.set_span_in_context(span)
        self._first_seen = False
        self._request: Span | None = None

    def _child(self, name: str, attributes: dict[str, str | int]) -> Span:
        return self._tracer.start_span(name, context=self._context, attributes=attributes)

    def worker_event(self, event_type: str) -> None:
        if not self._first_seen:
            self._first_seen = True
            self._span.add_event("codesdk.first_worker_event", {"codesdk.event_type": event_type})
        if event_type == _REQUEST_STARTED:
            if self._request is not None:
                self._request.end()
            self._request = self._child("codesdk.model_request", {})
        elif event_type == _REQUEST_COMPLETED and self._request is not None:
            self._request.end()
            self._request = None

    def tool_call(self, tool_name: str, tool_class: str) -> _SpanPhase:
        return _SpanPhase(self._child("codesdk.tool_call", {"codesdk.tool_name": tool_name,
                                                             "codesdk.tool_class": tool_class}))

    def approval_wait(self, tool_name: str) -> _SpanPhase:
        return _SpanPhase(self._child("codesdk.approval_wait", {"codesdk.tool_name": tool_name}))

    def store_commit(self, events: int) -> _SpanPhase:
        return _SpanPhase(self._child("codesdk.store.commit", {"codesdk.events": events}))

    def ended(self, outcome: str, code: str) -> None:
        if self._request is not None:
            self._request.end()
            self._request = None
        self._span.set_attribute("codesdk.outcome", outcome)
        if code:
            self._span.set_attribute("codesdk.failure_code", code)
        if outcome == "failed":
            self._span.set_status(Status(StatusCode.ERROR, code or "failed"))
        self._span.end()


class _SpanPhase:
    __slots__ = ("_span",)

    def __init__(self, span: Span) -> None:
        self._span = span

    def end(self, outcome: str) -> None:
        if not self._span.is_recording():
            return  # ended already
        self._span.set_attribute("codesdk.outcome", outcome)
        if outcome == "error":
            self._span.set_status(Status(StatusCode.ERROR))
        self._span.end()


def open_tracer(endpoint: str, *, service_name: str = "codesdk-supervisor",
                timeout_s: float = 10.0) -> tuple[TaskTracer, Callable[[], None]]:
    """A tracer exporting to ``endpoint`` (``traces_url``), and what flushes and stops it (at the service's end)."""
    provider = TracerProvider(resource=Resource.create({"service.name": service_name,
                                                        "service.version": __version__}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=traces_url(endpoint),
                                                                    timeout=timeout_s)))
    return TaskTracer(provider), provider.shutdown


__all__ = ["TaskTracer", "open_tracer", "traces_url"]
