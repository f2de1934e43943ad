"""The service's Prometheus metrics.

Two kinds. What tasks did is observed as it happens: ``TaskMetrics`` is the engine's ``Telemetry`` (its hooks feed
histograms and counters). What the service holds is read at each scrape (``ServiceCollector``): workers, the store's
writer, events the engine dropped, build and process facts. Counters are counters (``_total``); a tenant's namespace
is a label only where their number is bounded by the host: namespaces with a live worker, a mounted volume or a live
resource group.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from codesdk._version import __version__
from codesdk.protocol import EventType, TaskFailureCode, TraceParent

#: Seconds a whole task takes: from a second to an hour.
TASK_BUCKETS = (0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
#: Seconds of a step inside a task (first event, a model request, a tool call): from milliseconds to minutes.
STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
#: Seconds a person takes to decide an approval.
APPROVAL_BUCKETS = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 900.0, 1800.0, 3600.0, 86400.0)

_FAILURE_CODES = frozenset(code.value for code in TaskFailureCode)
_REQUEST_STARTED = EventType.RUNTIME_REQUEST_STARTED.value
_REQUEST_COMPLETED = EventType.RUNTIME_REQUEST_COMPLETED.value


def failure_label(code: str) -> str:
    """A failure code as a label: one of the contract's, or ``OTHER`` (a runtime's own codes are not bounded)."""
    return code if code in _FAILURE_CODES else "OTHER"


class TaskMetrics:
    """Histograms and counters of tasks, fed by the engine (the ``Telemetry`` of ``supervisor.engine``)."""

    def __init__(self, registry: CollectorRegistry | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.registry = registry or CollectorRegistry()
        self._clock = clock
        r = self.registry
        self.started = Counter("codesdk_tasks_started", "Tasks admitted, by runtime", ["runtime"], registry=r)
        self.ended = Counter("codesdk_tasks_ended", "Tasks ended, by outcome (completed, failed, stopped) and, for "
                             "a failure, its code (a runtime's own codes: OTHER)", ["outcome", "code"], registry=r)
        self.duration = Histogram("codesdk_task_duration_seconds", "From a task's admission to its end, by outcome",
                                  ["outcome"], buckets=TASK_BUCKETS, registry=r)
        self.first_event = Histogram("codesdk_task_first_event_seconds", "From a task's admission to its worker's "
                                     "first event (worker start, compiling its input, the runtime's start)",
                                     buckets=STEP_BUCKETS, registry=r)
        self.model_request = Histogram("codesdk_model_request_seconds", "A runtime's model request, from its start "
                                       "to its completion as the runtime reports them", buckets=STEP_BUCKETS,
                                       registry=r)
        self.tool_call = Histogram("codesdk_tool_call_seconds", "A tool call the supervisor holds, from its request "
                                   "to its answer sent (policy, approval, execution, storing), by tool class and "
                                   "outcome", ["tool_class", "outcome"], buckets=STEP_BUCKETS, registry=r)
        self.store_commit = Histogram("codesdk_store_commit_seconds", "A task's batch of events, from its submission "
                                      "to the store to its commit", buckets=STEP_BUCKETS, registry=r)
        self.approval_wait = Histogram("codesdk_approval_wait_seconds", "A call waiting for a person's decision, by "
                                       "decision (approved, denied, expired, cancelled)", ["decision"],
                                       buckets=APPROVAL_BUCKETS, registry=r)

    def task(self, *, task_id: str, session_id: str, namespace: str, runtime: str, request_id: str | None,
             client_id: str | None, parent: TraceParent | None) -> _TaskMeter:
        self.started.labels(runtime=runtime).inc()
        return _TaskMeter(self, self._clock())


class _TaskMeter:
    __slots__ = ("_admitted", "_ended", "_first_seen", "_metrics", "_request_started")

    def __init__(self, metrics: TaskMetrics, admitted: float) -> None:
        self._metrics = metrics
        self._admitted = admitted
        self._first_seen = False
        self._request_started: float | None = None
        self._ended = False

    def worker_event(self, event_type: str) -> None:
        if not self._first_seen:
            self._first_seen = True
            self._metrics.first_event.observe(self._metrics._clock() - self._admitted)
        if event_type == _REQUEST_STARTED:
            self._request_started = self._metrics._clock()
        elif event_type == _REQUEST_COMPLETED and self._request_started is not None:
            self._metrics.model_request.observe(self._metrics._clock() - self._request_started)
            self._request_started = None

    def tool_call(self, tool_name: str, tool_class: str) -> _Timed:
        return _Timed(self._metrics._clock, lambda outcome, seconds: self._metrics.tool_call.labels(
            tool_class=tool_class, outcome=outcome).observe(seconds))

    def approval_wait(self, tool_name: str) -> _Timed:
        return _Timed(self._metrics._clock, lambda outcome, seconds: self._metrics.approval_wait.labels(
            decision=outcome).observe(seconds))

    def store_commit(self, events: int) -> _Timed:
        return _Timed(self._metrics._clock, lambda outcome, seconds: self._metrics.store_commit.observe(seconds))

    def ended(self, outcome: str, code: str) -> None:
        if self._ended:
            return
        self._ended = True
        self._metrics.ended.labels(outcome=outcome, code=failure_label(code) if code else "").inc()
        self._metrics.duration.labels(outcome=outcome).observe(self._metrics._clock() - self._admitted)


class _Timed:
    __slots__ = ("_clock", "_done", "_observe", "_start")

    def __init__(self, clock: Callable[[], float], observe: Callable[[str, float], None]) -> None:
        self._clock = clock
        self._observe = observe
        self._start = clock()
        self._done = False

    def end(self, outcome: str) -> None:
        if not self._done:
            self._done = True
            self._observe(outcome, self._clock() - self._start)


@dataclass(frozen=True)
class ServiceFacts:
    """What a scrape reads of the service, each a function of no argument (so nothing is held between scrapes)."""

    #: (namespace, state, workers started, live) of each namespace's worker slot; live: it runs a worker now.
    workers: Callable[[], Iterable[tuple[str, str, int, bool]]]
    #: (transactions, requests, bulk transactions) the store's writer committed
    writer: Callable[[], tuple[int, int, int]]
    #: events the engine dropped rather than stored, by reason; and workers that crashed under a task
    dropped: Callable[[], dict[str, int]]
    worker_crashes: Callable[[], int]
    #: "sqlite" or "postgresql"
    store_backend: str


def build_info(store_backend: str) -> dict[str, str]:
    return {"version": __version__, "python": platform.python_version(), "store": store_backend}


class ServiceCollector(Collector):
    """The service's state at each scrape: its metric families are made from ``ServiceFacts`` then."""

    def __init__(self, facts: ServiceFacts) -> None:
        self._facts = facts
        self._build = build_info(facts.store_backend)

    def collect(self) -> Iterable[Metric]:
        facts = self._facts
        info = GaugeMetricFamily("codesdk_build_info", "The running CodeSDK: version, Python, store backend",
                                 labels=list(self._build))
        info.add_metric(list(self._build.values()), 1)
        yield info
        workers = list(facts.workers())
        by_state: dict[str, int] = {}
        for _, state, _, _ in workers:
            by_state[state] = by_state.get(state, 0) + 1
        states = GaugeMetricFamily("codesdk_workers", "Namespaces' worker slots, by state", labels=["state"])
        for state, count in sorted(by_state.items()):
            states.add_metric([state], count)
        yield states
        yield CounterMetricFamily("codesdk_worker_starts", "Worker processes started, all namespaces",
                                  value=sum(started for _, _, started, _ in workers))
        live = GaugeMetricFamily("codesdk_namespace_workers_started", "Workers started for a namespace that runs one "
                                 "now (restarts: this minus one)", labels=["namespace"])
        for namespace, _, started, running in workers:
            if running:
                live.add_metric([namespace], started)
        yield live
        yield CounterMetricFamily("codesdk_worker_crashes", "Workers that exited under a running task",
                                  value=facts.worker_crashes())
        transactions, requests, bulk = facts.writer()
        yield CounterMetricFamily("codesdk_store_write_transactions", "Write transactions the store committed",
                                  value=transactions)
        yield CounterMetricFamily("codesdk_store_write_requests", "Write requests those transactions carried",
                                  value=requests)
        yield CounterMetricFamily("codesdk_store_bulk_transactions", "Transactions of a flooding stream's events, "
                                  "taking turns with the others", value=bulk)
        dropped = CounterMetricFamily("codesdk_dropped_events", "Worker events the engine dropped rather than "
                                      "stored, by reason", labels=["reason"])
        for reason, count in sorted(facts.dropped().items()):
            dropped.add_metric([reason], count)
        yield dropped
