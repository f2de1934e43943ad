"""The Starlette application: versioned JSON routes, an SSE event stream, health and metrics."""

from __future__ import annotations

import contextlib
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import trio
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, PlatformCollector, ProcessCollector, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from codesdk.protocol import QuestionReply, QuestionState
from codesdk.protocol import DeliveryState, parse_kinds
from codesdk.protocol import (
    HASH_PREFIX,
    CanonicalizationError,
    IsolationLevel,
    canonical_json,
    sha256_hex,
    RUNTIME_NAME_PATTERN,
    RUNTIME_NAME_RULE,
    ApprovalState,
    BadFrame,
    EventType,
    InteractionMode,
    StopReceipt,
    TaskStopped,
    api,
    decode_json,
    is_hash,
    parse_traceparent,
    TraceContext,
)

from ..audit import audit
from ..bundle import BundleLimits, BundleService
from ..observe.metrics import STEP_BUCKETS, ServiceCollector, ServiceFacts, TaskMetrics
from ..engine import (
    DecisionRefused,
    Engine,
    ForkInsideTask,
    GrantAlreadyRevoked,
    UnknownGrant,
    InvalidTaskInput,
    IsolationRefused,
    MonthlyBudgetSpent,
    NamespaceElsewhere,
    RuntimeUnavailable,
    UnknownRuntime,
    derive_transcript,
    error_status,
)
from ..egress import HostPattern, PatternError
from ..namespaces import (
    EnvEntry,
    InvalidNamespace,
    KeyNotHeld,
    Namespace,
    NamespaceBudgetError,
    NamespaceEgress,
    NamespaceEgressError,
    NamespaceEnvError,
    UndecryptableVariable,
    month_of,
    next_month_start,
)
from ..store import (
    IDEMPOTENCY_WINDOW_S,
    ApprovalDecided,
    ApprovalRecord,
    BlobNotFound,
    EventLogReader,
    QuotaExceeded,
    SessionRecord,
    StoreError,
    TaskRecord,
    UnknownApproval,
    UnknownSession,
    UnknownTask,
)
from ._auth import Principal, TokenAuth, TokenFileInvalid, TokenNameTaken, TokenNotFound, hash_token
from ._console import ConsoleRefused, console_routes, cookie_principal
from ..console import COOKIE, ConsoleSessions
from ._endpoints import ENDPOINTS, Access, Endpoint
from ._ranges import Unsatisfiable, byte_range
from .openapi import openapi_document, reference_page
from ..engine import APPROVAL_KIND, QUESTION_KIND, InvalidAnswer
from ..store import QuestionRecord, QuestionSettled, UnknownQuestion
from .views import question_answer, routing_answer
from ..store import DeliveryRecord, RotationOverlaps, UnknownDelivery, UnknownWebhook, WebhookRecord
from ..webhooks import TooManyWebhooks, WebhookRefused, WebhookService
from .views import delivery_answer, webhook_answer
from .views import (
    approval_answer,
    budget_answer,
    deleted_answer,
    env_answer,
    grant_answer,
    runtime_env_answer,
    session_answer,
    task_answer,
    task_result,
    worker_answer,
)

log = logging.getLogger(__name__)

KEEPALIVE_S = 15.0
#: ASGI scope extension a server may offer on an HTTP/1.1 GET whose response it sends chunked (no content-length):
#: ``async (bytes) -> None`` writing one non-empty piece of the body as its own chunk, straight to the connection,
#: once the response has started. An event stream's writes then skip the middlewares' and the server's layers per
#: message (they only look at the start and the end of a response); ``serve_api`` offers it.
CHUNK_WRITER = "codesdk.chunk_writer"
#: Seconds /readyz waits for a probe write when the last write failed (the store may be back).
READY_PROBE_S = 2.0
MAX_BODY = 1 << 20
MAX_SEQ = api.MAX_SEQ
DRAIN_LIMIT = 16 << 20
M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers


def _error(status: int, code: str, message: str, headers: dict[str, str] | None = None, *,
           details: dict[str, Any] | None = None) -> JSONResponse:
    error: dict[str, Any] = {"code": code, "message": message}
    if details:
        error["details"] = details
    return JSONResponse({"error": error}, status_code=status, headers=headers)


#: What ``GET /v1/approvals?state=`` may ask for (or "all"), in the order the refusal lists them.
_APPROVAL_STATES = tuple(state.value for state in ApprovalState)
_QUESTION_STATES = tuple(state.value for state in QuestionState)


def _unstorable(key: str) -> bool:
    """A key no store holds: text with a NUL character (PostgreSQL cannot store one at all, so it can only be
    unknown, on either backend)."""
    return "\x00" in key


#: What a field's pattern asks for, in words (pydantic names only the regular expression).
_PATTERN_MEANS = {RUNTIME_NAME_PATTERN: f"a runtime's name is {RUNTIME_NAME_RULE} "
                                        "(GET /v1/runtimes?namespace=… lists those a namespace can run)",
                  api.TITLE_PATTERN: "it may not hold a NUL character"}


def _validation_message(exc: ValidationError, where: str) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or where
        means = None
        if err["type"] == "string_pattern_mismatch":
            means = _PATTERN_MEANS.get(str(err.get("ctx", {}).get("pattern")))
        parts.append(f"{where} field '{loc}': {means or err['msg']}")
    return "; ".join(parts)


#: Where a request's scope holds its ``Endpoint`` (set by the route's wrapper), and who sent it (once known).
_ENDPOINT = "codesdk.endpoint"
_PRINCIPAL = "codesdk.principal"
#: The sha256 of the token a request authenticated with (its console session's, for the cookie): what a long-lived
#: request re-checks while it is open.
_TOKEN_SHA256 = "codesdk.token_sha256"

access_log = logging.getLogger("codesdk.access")
#: The route label of a request no route takes (404, 405): its path is the client's to choose, so never a label.
UNMATCHED = "unmatched"
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def _log_access(request: Request, endpoint: Endpoint | None, status: int, seconds: float, level: int) -> None:
    """One line per request: who (the principal, never its token), what (the route and the path, not the query:
    it may hold a tenant's search text), the status and how long until the answer started."""
    if not access_log.isEnabledFor(level):
        return
    who = request.scope.get(_PRINCIPAL, "-")
    client = request.client.host if request.client is not None and request.client.host else "unix"
    access_log.log(level, "%s %s %d %.1f ms principal=%s client=%s", request.method, request.url.path, status,
                   seconds * 1000, who, client, extra={"access": {
                       "method": request.method, "route": endpoint.path if endpoint else UNMATCHED,
                       "operation": endpoint.operation_id if endpoint else None,
                       "path": request.url.path, "status": status, "duration_ms": round(seconds * 1000, 3),
                       "principal": who, "client": client}})


def _declared(request: Request, what: str, model: type[BaseModel]) -> None:
    """A handler reads only the body and query its route declares (what the OpenAPI document says it takes)."""
    endpoint: Endpoint = request.scope[_ENDPOINT]
    declared = endpoint.body if what == "body" else endpoint.query
    if declared is not model:
        raise RuntimeError(f"{endpoint.operation_id} reads a {what} of {model.__name__}, but its route declares "
                           f"{declared.__name__ if declared else 'none'}")


def _answer(request: Request, answer: BaseModel) -> JSONResponse:
    """The success answer its route declares, with its status; a model's None fields are left out."""
    endpoint: Endpoint = request.scope[_ENDPOINT]
    if endpoint.answer is None or not isinstance(answer, endpoint.answer):
        raise RuntimeError(f"{endpoint.operation_id} answers a {type(answer).__name__}, but its route declares "
                           f"{endpoint.answer.__name__ if endpoint.answer else 'none'}")
    return JSONResponse(answer.model_dump(mode="json", exclude_none=True), status_code=endpoint.status)


def _validate(model: type[M], data: Any, where: str) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ApiError(422, "invalid_request", _validation_message(exc, where)) from exc


async def _body(request: Request, model: type[M]) -> M:
    _declared(request, "body", model)
    raw = await _raw_body(request)
    if not raw.strip():
        data: Any = {}
    else:  # the worker protocol's strict decoder: no duplicate keys, NaN, lone surrogates, absurd nesting
        data = decode_json(raw)
        if isinstance(data, BadFrame):
            raise ApiError(422, "invalid_json", f"request body is not valid JSON: {data.detail}")
    if not isinstance(data, dict):
        raise ApiError(422, "invalid_request", "request body must be a JSON object")
    return _validate(model, data, "body")


#: Where a request's scope keeps its body once read (an idempotent request's is read before its handler runs).
_BODY = "codesdk.body"


async def _raw_body(request: Request) -> bytes:
    """The request's body, read once: bounded in size (413) and in time (408)."""
    if (cached := request.scope.get(_BODY)) is not None:
        return bytes(cached)
    chunks: list[bytes] = []
    size = 0
    timeout_s: float = request.app.state.body_timeout_s  # set by create_app
    with trio.move_on_after(timeout_s) as reading:  # a body trickled in slowly holds a connection: bounded
        async with contextlib.aclosing(request.stream()) as stream:
            async for chunk in stream:
                size += len(chunk)
                if size <= MAX_BODY:
                    chunks.append(chunk)
                elif size > DRAIN_LIMIT:
                    break  # stop reading; the client gets the 413 (or a reset) while still sending
    if reading.cancelled_caught:
        raise ApiError(408, "body_timeout", f"the request body did not arrive within {timeout_s:g} s (the limit: "
                                            "`codesdk-supervisor serve --body-timeout`)", {"connection": "close"})
    if size > MAX_BODY:
        # Draining (up to DRAIN_LIMIT) first means a client that writes its whole body before reading
        # the response sees the 413 instead of stalling on a full socket buffer.
        raise ApiError(413, "body_too_large", f"request body is larger than {MAX_BODY} bytes")
    raw = b"".join(chunks)
    request.scope[_BODY] = raw
    return raw


#: An ``Idempotency-Key``: 1 to 255 visible ASCII characters (the Python client sends a random UUID).
_IDEMPOTENCY_KEY = re.compile(r"[\x21-\x7e]{1,255}")


def _fingerprint(request: Request, raw: bytes) -> str:
    """What makes two requests with one key the same request: method, path and body (as canonical JSON when it is
    JSON, so a retry that re-serializes its body in another key order is still the same)."""
    decoded = decode_json(raw) if raw.strip() else {}
    try:
        body = raw if isinstance(decoded, BadFrame) else canonical_json(decoded)
    except CanonicalizationError:  # a value RFC 8785 has no form for (an integer past 2**53): the bytes as sent
        body = raw
    return sha256_hex(f"{request.method} {request.url.path}\n".encode() + body)


#: What an ``X-Request-Id`` or ``X-Client-Id`` may be: up to 200 visible ASCII characters (else ignored).
_TRACE_ID = re.compile(r"[\x21-\x7e]{1,200}")


def _trace_header(request: Request, name: str) -> str | None:
    value = request.headers.get(name)
    return value if value is not None and _TRACE_ID.fullmatch(value) else None


def _query(request: Request, model: type[M]) -> M:
    _declared(request, "query", model)
    repeated = sorted({key for key, _ in request.query_params.multi_items()
                       if len(request.query_params.getlist(key)) > 1})
    if repeated:
        raise ApiError(422, "invalid_request", f"query field '{repeated[0]}': given more than once; give it once")
    return _validate(model, dict(request.query_params), "query")


# -- the app -----------------------------------------------------------------------------------------

class _Metrics:
    """The service's metrics (``supervisor.observe.metrics``): its tasks, as the engine tells them; its state at each
    scrape; the HTTP requests; the namespaces' groups and disks; the process."""

    def __init__(self, engine: Engine) -> None:
        self.registry = r = CollectorRegistry()
        self.tasks = TaskMetrics(r)
        stats = engine.stats
        writer = engine.store.writer_stats
        r.register(ServiceCollector(ServiceFacts(
            workers=lambda: [(str(s["namespace"]), str(s["state"]), _count(s["workers_started"]),
                              s["pid"] is not None and s["isolation"] == "namespaced")  # one sample per namespace
                             for s in engine.pool.status()],
            writer=lambda: (writer.transactions, writer.requests, writer.bulk_transactions),
            dropped=lambda: {"late": stats.late_events, "unknown_task": stats.unknown_task_events,
                             "ordinal_gap": stats.ordinal_gaps, "duplicate": stats.duplicate_events,
                             "invalid": stats.invalid_events},
            worker_crashes=lambda: stats.worker_crashes,
            store_backend="postgresql" if engine.config.store else "sqlite")))
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        self.active_tasks = Gauge("codesdk_active_tasks", "Tasks pending or running (all supervisors sharing the "
                                  "store)", registry=r)
        self.sse_events = Counter("codesdk_sse_events_sent", "Events sent over SSE streams", registry=r)
        self.disk = {what: Gauge(f"codesdk_namespace_disk_{what}", f"A namespace's volume: {what.replace('_', ' ')} "
                                 "(its disk quota; namespaces with a mounted volume)", ["namespace"], registry=r)
                     for what in ("used_bytes", "limit_bytes", "used_files", "limit_files")}
        self.requests = Counter("codesdk_http_requests", "HTTP requests by route, method and status (a path no route "
                                "takes: route=\"unmatched\")", ["route", "method", "status"], registry=r)
        self.request_seconds = Histogram("codesdk_http_request_duration_seconds", "From a request's arrival to its "
                                         "answer's start (an event stream: to its first byte), by route",
                                         ["route"], buckets=STEP_BUCKETS, registry=r)
        # Per namespace with a live resource group (one that runs a worker or an exec call): a bounded label set.
        group = ["namespace"]
        self.ns_processes = Gauge("codesdk_namespace_processes", "Processes in the namespace's resource group",
                                  group, registry=r)
        self.ns_memory = Gauge("codesdk_namespace_memory_bytes", "Memory charged to the namespace's group "
                               "(tmpfs pages included)", group, registry=r)
        self.ns_cpu = Gauge("codesdk_namespace_cpu_seconds", "CPU time used by the namespace's group since it "
                            "was created", group, registry=r)
        self.ns_limit = Gauge("codesdk_namespace_limit", "The namespace group's limits", ["namespace", "resource"],
                              registry=r)
        self.ns_hits = Gauge("codesdk_namespace_limit_hits", "Times the namespace's group hit a limit since it was "
                             "created (pids: a fork refused; memory: the limit reached; oom_kill: a process killed)",
                             ["namespace", "limit"], registry=r)


def _count(value: object) -> int:
    return value if isinstance(value, int) else 0


async def _group_metrics(metrics: _Metrics, engine: Engine) -> None:
    """Each live namespace group's usage, limits and limits hit (namespaces whose group is gone drop out)."""
    groups = engine.pool.config.groups
    if groups is None:
        return
    stats = await trio.to_thread.run_sync(groups.stats)
    for gauge in (metrics.ns_processes, metrics.ns_memory, metrics.ns_cpu, metrics.ns_limit, metrics.ns_hits):
        gauge.clear()
    for namespace, (used, limits) in stats.items():
        metrics.ns_processes.labels(namespace=namespace).set(used.processes)
        metrics.ns_memory.labels(namespace=namespace).set(used.memory_bytes)
        metrics.ns_cpu.labels(namespace=namespace).set(used.cpu_seconds)
        for resource, value in limits.to_json_obj().items():
            metrics.ns_limit.labels(namespace=namespace, resource=resource).set(value)
        for limit, hits in (("pids", used.pids_limit_hits), ("memory", used.memory_limit_hits),
                            ("oom_kill", used.oom_kills)):
            metrics.ns_hits.labels(namespace=namespace, limit=limit).set(hits)


class _OpenStream:
    __slots__ = ("scope", "seq", "session_id")

    def __init__(self, session_id: str, seq: int, scope: trio.CancelScope) -> None:
        self.session_id = session_id
        self.seq = seq  # the last event sent
        self.scope = scope


class StreamDrain:
    """The open SSE event streams, for the service's drain (SIGTERM): ``drain`` gives each stream every event its
    session has when the drain begins — the terminal events of the tasks the service stopped — then ends its body
    cleanly (a follower sees the end, not a cut connection). New streams are refused (503) from then on."""

    def __init__(self) -> None:
        self._open: set[_OpenStream] = set()
        self._changed = trio.Event()
        self.draining = False

    def opened(self, stream: _OpenStream) -> None:
        self._open.add(stream)

    def sent(self, stream: _OpenStream, seq: int) -> None:
        stream.seq = seq
        self._changed.set()

    def closed(self, stream: _OpenStream) -> None:
        self._open.discard(stream)
        self._changed.set()

    async def drain(self, store: EventLogReader, limit_s: float) -> tuple[int, int]:
        """(open streams, streams given all their session's events) — the others were ended at ``limit_s``."""
        self.draining = True
        streams = list(self._open)
        targets: dict[_OpenStream, int] = {}
        for stream in streams:
            try:
                targets[stream] = await store.last_seq(stream.session_id)
            except StoreError:
                targets[stream] = stream.seq  # the store is failing: nothing more can be read for it anyway

        def behind() -> list[_OpenStream]:
            return [s for s in streams if s in self._open and s.seq < targets[s]]

        with trio.move_on_after(limit_s):
            while behind():
                self._changed = trio.Event()
                await self._changed.wait()
        delivered = len(streams) - len(behind())
        for stream in list(self._open):
            stream.scope.cancel()  # the stream's body is then ended cleanly (_SSEResponse._stream)
        with trio.move_on_after(limit_s):  # each last chunk sent before the connections are closed
            while self._open:
                self._changed = trio.Event()
                await self._changed.wait()
        return len(streams), delivered


def create_app(engine: Engine, auth: TokenAuth, *, keepalive_s: float = KEEPALIVE_S,
               max_streams_per_principal: int = 32, body_timeout_s: float = 30.0,
               claim_connection: Callable[[str], str | None] | None = None,
               drain: StreamDrain | None = None, bundle_limits: BundleLimits | None = None,
               console: ConsoleSessions | None = None,
               webhooks: WebhookService | None = None) -> Starlette:
    """``claim_connection(principal identity)`` charges the request's connection to the principal (the server's
    per-token connection cap); it returns why not, if the token holds too many (429). ``drain``: the service's
    record of open event streams, which it drains on SIGTERM. ``console``: the web console's sessions (their
    cookie authenticates as the token that logged in)."""
    drain = drain or StreamDrain()
    console = console if console is not None else ConsoleSessions()

    def consoles_on(namespace: str) -> int:
        """Active console sessions whose token (still valid) may see ``namespace``: someone who can answer."""
        principals = (auth.authenticate_hash(session.token_sha256) for session in console.active())
        return sum(1 for p in principals if p is not None and not p.metrics and p.can_access(namespace))

    engine.audience.console_source = consoles_on
    console.on_seen = engine.audience.noticed
    metrics = _Metrics(engine)
    engine.observers.add(metrics.tasks)
    store = engine.store
    streams = _StreamSlots(max_streams_per_principal)
    bundles = BundleService(engine, bundle_limits)  # support bundles: one per token at a time, cached

    def principal_of(request: Request) -> Principal:
        header = request.headers.get("authorization")
        if header is None and COOKIE in request.cookies:  # the console's: the same principal as its token
            try:
                principal: Principal | None = cookie_principal(request, console, auth)
            except ConsoleRefused as exc:
                raise ApiError(exc.status, exc.code, exc.message) from None
            if principal is not None and (session := console.find(request.cookies.get(COOKIE))) is not None:
                request.scope[_TOKEN_SHA256] = session.token_sha256
        else:
            scheme, _, token = (header or "").partition(" ")
            principal = auth.authenticate(token.strip()) if scheme.lower() == "bearer" else None
            if principal is not None:
                request.scope[_TOKEN_SHA256] = hash_token(token.strip())
        if principal is None:
            raise ApiError(401, "unauthorized", "missing or invalid bearer token (Authorization: Bearer <token>)")
        access = request.scope[_ENDPOINT].access
        if access is Access.METRICS and not (principal.admin or principal.metrics):
            raise ApiError(403, "forbidden", "/metrics needs the admin token or a metrics token (`codesdk-supervisor "
                                             "token add NAME --metrics`)")
        if principal.metrics and access is not Access.METRICS:
            raise ApiError(403, "forbidden", "a metrics token reads /metrics and nothing else")
        request.scope[_PRINCIPAL] = principal.identity
        if claim_connection is not None and (refused := claim_connection(principal.identity)) is not None:
            raise ApiError(429, "too_many_connections", refused, {"connection": "close", "retry-after": "1"})
        return principal

    async def offered(namespace: str, runtime: str, runtime_config: dict[str, Any] | None = None, *,
                      available: bool = True, unknown: int = 422, worker_needed: bool = True) -> None:
        """Refuse, nothing stored (``Engine.check_offer``): a runtime the namespace's worker does not offer (422, or
        ``unknown`` where the runtime is the path's resource), a ``runtime_config`` it does not take (422), or a
        runtime it cannot run now (503)."""
        try:
            await engine.check_offer(namespace, runtime, runtime_config, available=available,
                                     worker_needed=worker_needed)
        except UnknownRuntime as exc:
            raise ApiError(unknown, "unknown_runtime", f"{exc} (GET /v1/runtimes?namespace=…)") from exc
        except InvalidTaskInput as exc:
            raise ApiError(422, "invalid_runtime_config", str(exc)) from exc
        except RuntimeUnavailable as exc:
            raise ApiError(503, "runtime_unavailable", str(exc)) from exc

    def refuse_while_draining() -> None:
        """Nothing new starts once the service drains (SIGTERM): its tasks are being stopped, its streams ended."""
        if drain.draining:
            raise ApiError(503, "shutting_down", "the service is shutting down; retry once it is back",
                           {"retry-after": "5"})

    async def session_for(principal: Principal, session_id: str) -> SessionRecord:
        try:
            session = None if _unstorable(session_id) else await store.get_session(session_id)
        except UnknownSession:
            session = None
        if session is None or not principal.can_access(session.namespace):
            raise ApiError(404, "session_not_found", f"no session {session_id!r}")
        return session

    async def task_for(principal: Principal, task_id: str) -> TaskRecord:
        try:
            if _unstorable(task_id):
                raise UnknownTask(task_id)
            task = await store.get_task(task_id)
            session = await store.get_session(task.session_id)
        except (UnknownTask, UnknownSession):
            raise ApiError(404, "task_not_found", f"no task {task_id!r}") from None
        if not principal.can_access(session.namespace):
            raise ApiError(404, "task_not_found", f"no task {task_id!r}")
        return task

    # -- routes --

    async def healthz(request: Request) -> Response:
        return _answer(request, api.Health(status="ok"))

    async def readyz(request: Request) -> Response:
        if store.closed:
            return _error(503, "not_ready", "the event store is closed")
        if store.write_failure is not None:  # is it over? one probe (a write) says
            with trio.move_on_after(READY_PROBE_S), contextlib.suppress(StoreError):
                await store.ping()
        if store.write_failure is not None:
            return _error(503, "store_failing", f"the last write to the event store failed: {store.write_failure}")
        if engine.leasing.leases.failure is not None:
            return _error(503, "store_failing", f"the event store can't be reached: {engine.leasing.leases.failure}")
        if (shortage := engine.space_shortage(engine.config.workspaces_dir)) is not None:  # a probe write fits
            return _error(503, "insufficient_space", shortage)  # where a task's own files would not
        groups = engine.pool.config.groups
        # No resource groups is a degraded mode, not unready: shown, with why, but still 200.
        return _answer(request, api.Readiness(
            status="ready", details=None if groups is None else {"resource_groups": groups.describe()}))

    async def metrics_route(request: Request) -> Response:
        principal_of(request)  # the admin's token or a metrics token (the route's access)
        metrics.active_tasks.set(len(await store.list_active_tasks()))
        disks = engine.config.pool.disks
        for gauge in metrics.disk.values():
            gauge.clear()
        for namespace in disks.mounted() if disks is not None else ():  # one label per volume (a loop device)
            if disks is not None and (usage := disks.usage(namespace.name)) is not None:
                for what, gauge in metrics.disk.items():
                    gauge.labels(namespace=namespace.name).set(getattr(usage, what))
        await _group_metrics(metrics, engine)
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    def single_user_only(isolation: IsolationLevel) -> None:
        """``IsolationRefused`` (409) for ``shared`` while the service has tenants' tokens: the operator's own HOME
        (its logins, its files) is no tenant's to use."""
        if isolation == IsolationLevel.SHARED and (tenants := auth.tenants()):
            shown = ", ".join(tenants[:5]) + (f" and {len(tenants) - 5} more" if len(tenants) > 5 else "")
            raise IsolationRefused(
                f"isolation 'shared' runs in the service user's own HOME, and this service has tenants' tokens "
                f"({shown}): it is multi-user. Use 'namespaced' (the namespace's own HOME) or 'ephemeral' (a HOME "
                "made for the session); 'shared' is for a single-user service, whose only tokens are the admin's")

    async def create_session(request: Request) -> Response:
        principal = principal_of(request)
        refuse_while_draining()
        body = await _body(request, api.CreateSessionRequest)
        try:
            Namespace.parse(body.namespace)
        except InvalidNamespace as exc:
            raise ApiError(422, "invalid_request", f"body field 'namespace': {exc}") from exc
        if not principal.can_access(body.namespace):
            raise ApiError(403, "forbidden", f"this token may not create sessions in namespace {body.namespace!r}")
        if body.workspace is not None and not principal.admin:
            raise ApiError(403, "forbidden", "only the admin token may choose a workspace path")
        single_user_only(body.isolation)
        if body.runtime is not None:
            await offered(body.namespace, body.runtime)
        record = await engine.create_session(runtime=body.runtime, namespace=body.namespace,
                                             workspace=Path(body.workspace) if body.workspace else None,
                                             metadata=body.metadata, title=body.title, isolation=body.isolation,
                                             budget=body.budget.limits() if body.budget is not None else None)
        return _answer(request, session_answer(record))

    async def list_sessions(request: Request) -> Response:
        principal = principal_of(request)
        query = _query(request, api.SessionsQuery)
        if query.namespace is not None and _unstorable(query.namespace):
            raise ApiError(422, "invalid_query", "query 'namespace' is not a namespace (it has a NUL character)")
        if query.namespace is not None:
            Namespace.parse(query.namespace)  # InvalidNamespace: 422, saying what a namespace is
            namespaces: list[str] | None = [query.namespace] if principal.can_access(query.namespace) else []
        else:
            namespaces = None if principal.admin else sorted(principal.namespaces)
        if query.after is not None:  # a cursor names one of the sessions the token sees, or it is no cursor
            try:
                seen = None if _unstorable(query.after) else await store.get_session(query.after)
            except UnknownSession:
                seen = None
            if seen is None or not principal.can_access(seen.namespace):
                raise ApiError(422, "invalid_query", f"query 'after' is no session of yours ({query.after!r}): give "
                                                     "the next_after of the page before")
        found = await store.list_sessions(namespaces=namespaces, runtime=query.runtime, after=query.after,
                                          limit=query.limit + 1, offset=query.offset, state=query.state,
                                          text=query.q)
        page, more = found[:query.limit], len(found) > query.limit
        return _answer(request, api.SessionList(sessions=tuple(session_answer(s) for s in page), has_more=more,
                                                next_after=page[-1].session_id if more else None))

    async def get_session(request: Request) -> Response:
        session = await session_for(principal_of(request), request.path_params["session_id"])
        return _answer(request, session_answer(session))

    async def update_session(request: Request) -> Response:
        principal = principal_of(request)
        session = await session_for(principal, request.path_params["session_id"])
        body = await _body(request, api.UpdateSessionRequest)
        title = "" if "title" in body.model_fields_set and body.title is None else body.title  # null: removed
        record = await engine.update_session(session.session_id, title=title, archived=body.archived,
                                             metadata=body.metadata, by=f"api:{principal.identity}")
        return _answer(request, session_answer(record))

    async def delete_session(request: Request) -> Response:
        principal = principal_of(request)
        session = await session_for(principal, request.path_params["session_id"])
        dropped, removed = await engine.delete_session(session.session_id, by=f"api:{principal.identity}")
        await trio.to_thread.run_sync(bundles.cache.forget, session.session_id)
        return _answer(request, deleted_answer(dropped, removed))

    async def fork_session(request: Request) -> Response:
        principal = principal_of(request)
        session = await session_for(principal, request.path_params["session_id"])
        refuse_while_draining()
        body = await _body(request, api.ForkSessionRequest)
        single_user_only(session.isolation)
        record = await engine.fork_session(session.session_id, at_seq=body.at_seq, title=body.title,
                                           metadata=body.metadata, by=f"api:{principal.identity}",
                                           new_workspace=body.workspace == api.ForkWorkspace.NEW)
        return _answer(request, session_answer(record))

    async def start_task(request: Request) -> Response:
        principal = principal_of(request)
        session = await session_for(principal, request.path_params["session_id"])
        refuse_while_draining()
        body = await _body(request, api.StartTaskRequest)
        single_user_only(session.isolation)  # a tenant token added since: no more tasks in the operator's HOME
        switching = body.runtime is not None and body.runtime != session.runtime
        if switching or body.runtime_config:  # the session's own runtime was offered when it was made
            await offered(session.namespace, body.runtime or session.runtime, body.runtime_config, available=switching,
                          worker_needed=switching)
        parent = parse_traceparent(request.headers.get("traceparent"))
        record = await engine.start_task(
            session.session_id, body.prompt, permission_mode=body.permission_mode,
            trace=TraceContext(request_id=_trace_header(request, "x-request-id") or (parent and parent.trace_id),
                               client_id=_trace_header(request, "x-client-id")), traceparent=parent,
            runtime_config=body.runtime_config, runtime=body.runtime, max_input_tokens=body.max_input_tokens,
            timeout_s=body.timeout_s, idle_timeout_s=body.idle_timeout_s,
            durable_approvals=body.interaction_mode == InteractionMode.INTERACTIVE,
            budget=body.budget.limits() if body.budget is not None else None)
        return _answer(request, task_answer(record))

    async def get_session_budget(request: Request) -> Response:
        session = await session_for(principal_of(request), request.path_params["session_id"])
        return _answer(request, budget_answer(session))

    async def set_session_budget(request: Request) -> Response:
        principal = principal_of(request)
        session = await session_for(principal, request.path_params["session_id"])
        body = await _body(request, api.SetBudgetRequest)
        record = await engine.set_budget(session.session_id, body.limits.limits(), by=f"api:{principal.identity}")
        return _answer(request, budget_answer(record))

    async def raise_session_budget(request: Request) -> Response:
        principal = principal_of(request)
        session = await session_for(principal, request.path_params["session_id"])
        body = await _body(request, api.RaiseBudgetRequest)
        if body.continue_:
            refuse_while_draining()
        record, task = await engine.raise_budget(
            session.session_id, body.limits.limits(), by=f"api:{principal.identity}", go_on=body.continue_,
            task_budget=body.task_budget.limits() if body.task_budget is not None else None,
            **({"prompt": body.prompt} if body.prompt is not None else {}))
        return _answer(request, api.RaisedBudget(**budget_answer(record).model_dump(),
                                                 task=task_answer(task) if task is not None else None))

    async def get_task(request: Request) -> Response:
        task = await task_for(principal_of(request), request.path_params["task_id"])
        return _answer(request, task_answer(task, await task_result(store, task)))

    async def stop_task(request: Request) -> Response:
        principal = principal_of(request)
        task = await task_for(principal, request.path_params["task_id"])
        body = await _body(request, api.StopTaskRequest)
        record = await engine.stop_task(task.task_id, reason=body.reason, requested_by=f"api:{principal.name}")
        return _answer(request, api.StoppedTask(**task_answer(record, await task_result(store, record)).model_dump(),
                                                receipt=await _receipt_of(engine, record)))

    async def send_task_input(request: Request) -> Response:
        task = await task_for(principal_of(request), request.path_params["task_id"])
        body = await _body(request, api.TaskInputRequest)
        text = body.input if isinstance(body.input, str) else tuple(body.input)
        answer = await engine.send_input(task.task_id, text, input_id=body.input_id)
        return _answer(request, api.TaskInput(task_id=task.task_id, input_id=answer.input_id,
                                              delivery=answer.delivery))

    def namespace_for(principal: Principal, namespace: str) -> str:
        Namespace.parse(namespace)  # InvalidNamespace: 422 invalid_namespace (ERROR_STATUS)
        if not principal.can_access(namespace):
            raise ApiError(404, "not_found", f"no namespace {namespace}")
        return namespace

    def own_namespace(principal: Principal, asked: str | None, how: str = "?namespace=") -> str:
        """The namespace a request names, or else the caller's own: the one its token is bound to (the admin's:
        "default"); a token bound to several must name one (422, saying ``how``)."""
        if asked is not None:
            return asked
        if principal.admin or not principal.namespaces:
            return "default"
        if len(principal.namespaces) > 1:
            raise ApiError(422, "namespace_required", "this token is bound to several namespaces ("
                           f"{', '.join(sorted(principal.namespaces))}); name one with {how}")
        [only] = principal.namespaces
        return only

    async def list_runtimes(request: Request) -> Response:
        principal = principal_of(request)
        query = _query(request, api.RuntimesQuery)
        namespace = namespace_for(principal, own_namespace(principal, query.namespace))
        offers = await engine.runtimes(namespace)
        return _answer(request, api.RuntimeList(namespace=namespace, runtimes=tuple(offers)))

    async def list_namespaces(request: Request) -> Response:
        """The namespaces the token sees, with their session counts: a tenant's own (even without sessions); the
        admin's, every namespace that has sessions or a worker directory."""
        principal = principal_of(request)
        _query(request, api.NoQuery)
        counts: dict[str, int] = {}
        if principal.admin:
            for session in await store.list_sessions(limit=MAX_SEQ):
                counts[session.namespace] = counts.get(session.namespace, 0) + 1
            root = engine.config.data_dir / "namespaces"
            names = await trio.to_thread.run_sync(lambda: sorted(p.name for p in root.iterdir()) if root.is_dir()
                                                  else [])
            for name in names:
                namespace = name if name == "default" else name.replace(".", ":", 1)
                with contextlib.suppress(InvalidNamespace):
                    Namespace.parse(namespace)
                    counts.setdefault(namespace, 0)
        else:
            for namespace in principal.namespaces:
                counts[namespace] = len(await store.list_sessions(namespace=namespace, limit=MAX_SEQ))
        return _answer(request, api.NamespaceList(namespaces=tuple(
            api.NamespaceInfo(namespace=n, sessions=counts[n]) for n in sorted(counts))))

    async def me(request: Request) -> Response:
        principal = principal_of(request)
        _query(request, api.NoQuery)
        return _answer(request, api.Me(name=principal.name, admin=principal.admin,
                                       namespaces=tuple(sorted(principal.namespaces))))

    def require_admin(request: Request, what: str) -> None:
        if not principal_of(request).admin:
            raise ApiError(403, "forbidden", f"{what} needs the admin token")

    async def list_workers(request: Request) -> Response:
        require_admin(request, "/v1/workers")  # names every tenant's namespace
        workers = await engine.pool.status_with_shared()
        return _answer(request, api.WorkerList(workers=tuple(worker_answer(w) for w in workers),
                                               template=engine.pool.template_state()))

    async def lift_quarantine(request: Request) -> Response:
        namespace = admin_namespace(request, "lifting a quarantine")
        lifted = engine.pool.lift_quarantine(namespace)
        lifted = await engine.pool.lift_shared_quarantine(namespace) or lifted
        if lifted:
            audit("namespace.quarantine_lifted", "api:admin", namespace=namespace)
        return _answer(request, api.QuarantineLifted(namespace=namespace, lifted=lifted))

    def token_info(token_id: str, principal: Principal) -> api.TokenInfo:
        return api.TokenInfo(id=token_id, name=principal.name, admin=principal.admin, metrics=principal.metrics,
                             namespaces=tuple(sorted(principal.namespaces)))

    def tenant_token(token_id: str) -> None:
        """Only a token of the table, by its id (never a name: one name may be several tenants'), and not the
        admin's own (its file on the host is the way back in)."""
        found = [p for i, p in auth.records() if i == token_id]
        if not found:
            raise ApiError(404, "token_not_found", f"no token {token_id!r} (GET /v1/tokens lists them)")
        if found[0].admin:
            raise ApiError(409, "admin_token", "the admin's token is changed on the host: `codesdk-supervisor token "
                                               "rotate admin` (it writes the new one nowhere else)")

    async def list_tokens(request: Request) -> Response:
        require_admin(request, "/v1/tokens")
        _query(request, api.NoQuery)
        return _answer(request, api.TokenList(tokens=tuple(token_info(i, p) for i, p in auth.records())))

    async def tokens_changed(change: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """A change of the token table (a file or the database: blocking, so in a thread); its refusals as
        answers."""
        try:
            return await trio.to_thread.run_sync(partial(change, *args, **kwargs))
        except TokenNotFound as exc:  # revoked elsewhere in the meantime
            raise ApiError(404, "token_not_found", str(exc)) from exc
        except (TokenFileInvalid, StoreError) as exc:
            raise ApiError(503, "tokens_unavailable", f"the token table can't be changed now: {exc}") from exc

    async def create_token(request: Request) -> Response:
        require_admin(request, "making a token")
        body = await _body(request, api.CreateTokenRequest)
        if not body.metrics and not body.namespaces:
            raise ApiError(422, "invalid_request", "body field 'namespaces': give the namespaces the token may use "
                                                   "(or metrics: true for a token that reads /metrics alone)")
        try:
            token_id, principal, secret = await tokens_changed(auth.issue, body.name, body.namespaces,
                                                               metrics=body.metrics)
        except InvalidNamespace as exc:
            raise ApiError(422, "invalid_request", f"body field 'namespaces': {exc}") from exc
        except TokenNameTaken as exc:
            raise ApiError(409, "token_name_taken", str(exc)) from exc
        except ValueError as exc:
            raise ApiError(422, "invalid_request", str(exc)) from exc
        audit("token.added", "api:admin", token=token_id, name=principal.name,
              namespaces=",".join(sorted(principal.namespaces)) or "-")
        return _answer(request, api.IssuedToken(token=token_info(token_id, principal), secret=secret))

    async def revoke_token(request: Request) -> Response:
        require_admin(request, "revoking a token")
        token_id = str(request.path_params["token_id"])
        tenant_token(token_id)
        token_id, principal = await tokens_changed(auth.revoke, token_id)
        audit("token.revoked", "api:admin", token=token_id, name=principal.name)
        return _answer(request, token_info(token_id, principal))

    async def rotate_token(request: Request) -> Response:
        require_admin(request, "rotating a token")
        token_id = str(request.path_params["token_id"])
        tenant_token(token_id)
        token_id, principal, secret = await tokens_changed(auth.rotate, token_id)
        audit("token.rotated", "api:admin", token=token_id, name=principal.name)
        return _answer(request, api.IssuedToken(token=token_info(token_id, principal), secret=secret))

    def admin_namespace(request: Request, what: str) -> str:
        require_admin(request, what)
        namespace = str(request.path_params["namespace"])
        Namespace.parse(namespace)  # InvalidNamespace: 422 invalid_namespace (ERROR_STATUS)
        return namespace

    async def list_env(request: Request) -> Response:
        namespace = admin_namespace(request, "reading a namespace's variables")
        entries = await env_call(engine.pool.namespace_env.entries, namespace)
        return _answer(request, env_answer(namespace, entries))

    async def env_call(call: Callable[..., list[EnvEntry]], *args: Any) -> list[EnvEntry]:
        """``call`` in a thread; rows under a key this supervisor lacks: 503 (the key ids go to the log only)."""
        try:
            return await trio.to_thread.run_sync(call, *args)
        except UndecryptableVariable as exc:
            log.error("namespace variables unreadable: %s", exc)
            raise ApiError(503, "secret_key_mismatch", KeyNotHeld.TENANT_MESSAGE) from exc

    async def update_env(request: Request) -> Response:
        namespace = admin_namespace(request, "changing a namespace's variables")
        body = await _body(request, api.EnvUpdateRequest)
        try:
            entries = await env_call(engine.pool.namespace_env.update, namespace, body.set, body.unset)
        except NamespaceEnvError as exc:
            raise ApiError(422, "invalid_variable", str(exc)) from exc
        await engine.pool.env_changed(namespace)
        audit("namespace.env_changed", "api:admin", namespace=namespace, set=",".join(sorted(body.set)) or "-",
              unset=",".join(sorted(body.unset)) or "-")  # names only: values are secrets
        return _answer(request, env_answer(namespace, entries))

    egress = (engine.config.namespace_state.egress if engine.config.namespace_state is not None
              else NamespaceEgress(engine.config.data_dir))
    operator_egress = engine.tooling.config.fetch.egress

    def egress_answer(namespace: str, own: tuple[HostPattern, ...] | None) -> api.NamespaceEgress:
        return api.NamespaceEgress(namespace=namespace, operator_hosts=tuple(str(p) for p in operator_egress.hosts),
                                   hosts=None if own is None else tuple(str(p) for p in own))

    async def get_egress(request: Request) -> Response:
        namespace = admin_namespace(request, "reading a namespace's egress policy")
        try:
            own = await trio.to_thread.run_sync(egress.get, namespace)
        except NamespaceEgressError as exc:
            raise ApiError(503, "egress_unreadable", str(exc)) from exc
        return _answer(request, egress_answer(namespace, own))

    async def set_egress(request: Request) -> Response:
        namespace = admin_namespace(request, "changing a namespace's egress policy")
        body = await _body(request, api.EgressUpdateRequest)
        patterns: tuple[HostPattern, ...] | None = None
        if body.hosts is not None:
            try:
                patterns = tuple(HostPattern.parse(host) for host in body.hosts)
            except PatternError as exc:
                raise ApiError(422, "invalid_pattern", str(exc)) from exc
            wider = operator_egress.uncovered(patterns)
            if wider:
                raise ApiError(422, "invalid_pattern", (
                    f"{', '.join(str(p) for p in wider)} would allow hosts the operator's --allow-fetch "
                    f"({operator_egress.describe_hosts()}) does not; a namespace's list can only narrow it"))
        try:
            own = await trio.to_thread.run_sync(egress.set, namespace, patterns)
        except NamespaceEgressError as exc:
            raise ApiError(422, "invalid_pattern", str(exc)) from exc
        audit("namespace.egress_changed", "api:admin", namespace=namespace,
              hosts="operator's" if own is None else ",".join(str(p) for p in own) or "none")
        return _answer(request, egress_answer(namespace, own))

    namespace_budgets = engine.budgets.namespaces

    async def namespace_budget_answer(namespace: str, monthly_usd: float | None) -> api.NamespaceBudget:
        now = engine.config.wall_clock()
        month = month_of(now)
        return api.NamespaceBudget(namespace=namespace, monthly_usd=monthly_usd, month=month,
                                   spent=await store.namespace_spend(namespace, month),
                                   resets_at=next_month_start(now))

    async def get_namespace_budget(request: Request) -> Response:
        namespace = admin_namespace(request, "reading a namespace's monthly budget")
        try:
            limit = await trio.to_thread.run_sync(namespace_budgets.get, namespace)
        except NamespaceBudgetError as exc:
            raise ApiError(503, "budgets_unreadable", str(exc)) from exc
        return _answer(request, await namespace_budget_answer(namespace, limit))

    async def set_namespace_budget(request: Request) -> Response:
        namespace = admin_namespace(request, "changing a namespace's monthly budget")
        body = await _body(request, api.NamespaceBudgetRequest)
        try:
            limit = await trio.to_thread.run_sync(namespace_budgets.set, namespace, body.monthly_usd)
        except NamespaceBudgetError as exc:
            raise ApiError(422, "invalid_request", f"body field 'monthly_usd': {exc}") from exc
        audit("namespace.budget_changed", "api:admin", namespace=namespace,
              monthly_usd="none" if limit is None else f"{limit:g}")
        return _answer(request, await namespace_budget_answer(namespace, limit))

    async def auth_status(request: Request) -> Response:
        namespace = namespace_for(principal_of(request), request.path_params["namespace"])
        await offered(namespace, request.path_params["runtime"], available=False, unknown=404)
        result = await engine.ensure_login(namespace, request.path_params["runtime"])
        return _answer(request, api.LoginState(**result.model_dump()))

    async def runtime_env(request: Request) -> Response:
        principal = principal_of(request)
        namespace = namespace_for(principal, request.path_params["namespace"])
        query = _query(request, api.RuntimeEnvQuery)
        if query.session_id is not None:
            session = await session_for(principal, query.session_id)  # 404 unless the caller may see it
            single_user_only(session.isolation)  # a shared session's worker is the operator's own
        return _answer(request, runtime_env_answer(namespace, await engine.runtime_env(namespace, query.session_id)))

    async def list_approvals(request: Request) -> Response:
        principal = principal_of(request)
        asked = _query(request, api.ApprovalsQuery).state
        if asked != "all" and asked not in _APPROVAL_STATES:
            raise ApiError(422, "invalid_query", f"query 'state' must be {', '.join(_APPROVAL_STATES)} or all")
        state = None if asked == "all" else ApprovalState(asked)
        namespaces = None if principal.admin else sorted(principal.namespaces)
        records = await engine.store.list_approvals(state=state, namespaces=namespaces)
        return _answer(request, api.ApprovalList(approvals=tuple(approval_view(r) for r in records)))

    def approval_view(record: ApprovalRecord) -> api.Approval:
        """The approval, with its routing while it is pending."""
        if record.state != ApprovalState.PENDING:
            return approval_answer(record)
        return approval_answer(record, routing_answer(engine.audience, record.namespace, APPROVAL_KIND,
                                                      engine.approvals.route_of(record.approval_id)))

    def question_view(record: QuestionRecord) -> api.AskedQuestion:
        """The question, with its routing while it is pending."""
        if record.state != QuestionState.PENDING:
            return question_answer(record)
        return question_answer(record, routing_answer(engine.audience, record.namespace, QUESTION_KIND,
                                                      engine.questions.route_of(record.question_id)))

    async def approval_for(principal: Principal, approval_id: str) -> ApprovalRecord:
        try:
            record = None if _unstorable(approval_id) else await engine.store.get_approval(approval_id)
        except UnknownApproval:
            record = None
        if record is None or not principal.can_access(record.namespace):
            raise ApiError(404, "not_found", f"no approval {approval_id}")
        return record

    async def decided(principal: Principal, record: ApprovalRecord, body: api.DecisionRequest) -> api.Approval:
        """One decision applied (404/409/422 as ``ApiError``)."""
        await engine.leasing.own(record.namespace)  # the task waiting for it runs here, or NamespaceElsewhere
        decision = ApprovalState.APPROVED if body.allow else ApprovalState.DENIED
        reason = body.reason or f"{decision.value} by {principal.name}"
        try:
            answer = await engine.approvals.decide(record.approval_id, body.allow, f"api:{principal.name}", reason,
                                                   scope=body.scope, pattern=body.pattern, input=body.input)
        except DecisionRefused as exc:
            raise ApiError(422, "invalid_request", f"body field '{exc.field}': {exc}") from exc
        except ApprovalDecided as exc:
            raise ApiError(409, "already_decided", str(exc)) from exc
        return approval_answer(answer)

    async def decide_approval(request: Request) -> Response:
        principal = principal_of(request)
        record = await approval_for(principal, request.path_params["approval_id"])
        body = await _body(request, api.DecisionRequest)
        return _answer(request, await decided(principal, record, body))

    async def decide_approvals(request: Request) -> Response:
        principal = principal_of(request)
        body = await _body(request, api.DecisionsRequest)
        results: list[api.DecisionResult] = []
        for item in body.decisions:
            try:
                approval = await decided(principal, await approval_for(principal, item.approval_id), item)
                results.append(api.DecisionResult(approval_id=item.approval_id, status=200, approval=approval))
            except ApiError as exc:
                if exc.status == 421:  # the namespace is another supervisor's: so is every other decision of it
                    raise
                results.append(api.DecisionResult(approval_id=item.approval_id, status=exc.status,
                                                  error={"code": exc.code, "message": exc.message}))
        return _answer(request, api.DecisionResults(results=tuple(results)))

    async def list_grants(request: Request) -> Response:
        session = await session_for(principal_of(request), request.path_params["session_id"])
        entries = await engine.grants.entries(session)
        return _answer(request, api.GrantList(grants=tuple(grant_answer(session.session_id, e) for e in entries)))

    async def revoke_grant(request: Request) -> Response:
        principal = principal_of(request)
        session = await session_for(principal, request.path_params["session_id"])
        grant_id = request.path_params["grant_id"]
        await engine.leasing.own(session.namespace)  # its tasks' policy runs here, or NamespaceElsewhere
        try:
            entry = await engine.grants.revoke(session, grant_id, f"api:{principal.name}")
        except UnknownGrant as exc:
            raise ApiError(404, "not_found", str(exc)) from exc
        except GrantAlreadyRevoked as exc:
            raise ApiError(409, "already_revoked", str(exc)) from exc
        return _answer(request, grant_answer(session.session_id, entry))

    async def list_questions(request: Request) -> Response:
        principal = principal_of(request)
        asked = _query(request, api.QuestionsQuery).state
        if asked != "all" and asked not in _QUESTION_STATES:
            raise ApiError(422, "invalid_query", f"query 'state' must be {', '.join(_QUESTION_STATES)} or all")
        state = None if asked == "all" else QuestionState(asked)
        namespaces = None if principal.admin else sorted(principal.namespaces)
        records = await engine.store.list_questions(state=state, namespaces=namespaces)
        return _answer(request, api.AskedQuestionList(questions=tuple(question_view(r) for r in records)))

    async def question_for(request: Request) -> QuestionRecord:
        """The question the path names, if the caller may see it (else 404: another tenant's does not exist)."""
        principal = principal_of(request)
        question_id = request.path_params["question_id"]
        try:
            record = None if _unstorable(question_id) else await engine.store.get_question(question_id)
        except UnknownQuestion:
            record = None
        if record is None or not principal.can_access(record.namespace):
            raise ApiError(404, "not_found", f"no question {question_id}")
        return record

    async def get_question(request: Request) -> Response:
        return _answer(request, question_view(await question_for(request)))

    async def answer_question(request: Request) -> Response:
        record = await question_for(request)
        body = await _body(request, api.AnswerRequest)
        if record.state != QuestionState.PENDING:
            raise ApiError(409, "already_answered", f"question {record.question_id!r} is already {record.state}; "
                                                    "an answer is final")
        await engine.leasing.own(record.namespace)  # the task waiting for it runs here, or NamespaceElsewhere
        reply = QuestionReply(answers=body.answers, decline=body.decline, reason=body.reason)
        try:
            answered = await engine.questions.answer(record.question_id, reply, f"api:{principal_of(request).name}")
        except InvalidAnswer as exc:
            raise ApiError(422, "invalid_answer", "; ".join(f"body field '{field}': {why}"
                                                            for field, why in exc.problems)) from exc
        except QuestionSettled as exc:
            raise ApiError(409, "already_answered", str(exc)) from exc
        return _answer(request, question_answer(answered))

    async def list_events(request: Request) -> Response:
        session = await session_for(principal_of(request), request.path_params["session_id"])
        query = _query(request, api.EventsQuery)
        events = await store.read(session.session_id, after_seq=query.after_seq, limit=query.limit)
        return _answer(request, api.EventPage(events=tuple(events),
                                              next_after_seq=events[-1].seq if events else query.after_seq,
                                              has_more=len(events) == query.limit))

    async def stream_events(request: Request) -> Response:
        principal = principal_of(request)
        session = await session_for(principal, request.path_params["session_id"])
        if streams.full(principal.identity):
            raise streams.refusal()
        if drain.draining:
            raise ApiError(503, "shutting_down", "the service is shutting down; reconnect with Last-Event-ID once "
                                                 "it is back", {"retry-after": "5"})
        if (digest := request.scope.get(_TOKEN_SHA256)) is None:  # the console session ended meanwhile
            raise ApiError(401, "unauthorized", "the console session has ended; log in again at /console/")
        query = _query(request, api.StreamQuery)
        after = query.after_seq
        last_id = request.headers.get("last-event-id")
        if last_id is not None and last_id.strip():
            try:
                after = int(last_id)
            except ValueError:
                raise ApiError(422, "invalid_request", "header 'Last-Event-ID' must be an event seq (integer)") \
                    from None
            if not 0 <= after <= MAX_SEQ:
                raise ApiError(422, "invalid_request", f"header 'Last-Event-ID' must be between 0 and {MAX_SEQ}")
        return _SSEResponse(engine, session.session_id, after or 0, query.until_terminal, metrics.sse_events,
                            keepalive_s, streams=streams, principal=principal.identity, drain=drain,
                            namespace=session.namespace,
                            token_lapsed=partial(auth.until_lapsed, digest, session.namespace))

    async def transcript(request: Request) -> Response:
        session = await session_for(principal_of(request), request.path_params["session_id"])
        messages = await derive_transcript(store, session.session_id)
        return _answer(request, api.Transcript(session_id=session.session_id, messages=tuple(messages)))

    async def get_blob(request: Request) -> Response:
        """A blob the session's events name (``EventStore.names_blob``), to the session's readers: whole, or the one
        byte range asked for; its hash is its ETag (a blob never changes), so a cached copy is answered 304."""
        session = await session_for(principal_of(request), request.path_params["session_id"])
        asked = str(request.path_params["ref"])
        ref = asked if asked.startswith(HASH_PREFIX) else HASH_PREFIX + asked
        missing = ApiError(404, "blob_not_found", f"session {session.session_id} names no blob {asked!r} (its "
                                                  "events' *_ref fields say which it does)")
        if not is_hash(ref) or not await store.names_blob(session.session_id, ref):
            raise missing
        try:
            info = await store.blob_info(ref)
            data = await store.get_blob(ref)  # re-hashed on read: corrupt bytes are never sent
        except BlobNotFound:
            raise missing from None
        etag = f'"{ref.removeprefix(HASH_PREFIX)}"'
        headers = {"etag": etag, "accept-ranges": "bytes", "cache-control": "private, max-age=31536000, immutable",
                   "x-content-type-options": "nosniff", "content-security-policy": "sandbox"}
        if etag in {tag.strip() for tag in request.headers.get("if-none-match", "").split(",")}:
            return Response(status_code=304, headers=headers)
        if_range = request.headers.get("if-range")
        try:
            wanted = byte_range(request.headers.get("range") if if_range in (None, etag) else None, len(data))
        except Unsatisfiable:
            raise ApiError(416, "range_not_satisfiable", f"the blob is {len(data)} bytes; the Range asks for none of "
                                                         "them", {"content-range": f"bytes */{len(data)}"}) from None
        if wanted is None:
            return Response(data, media_type=info.media_type, headers=headers)
        start, stop = wanted
        headers["content-range"] = f"bytes {start}-{stop - 1}/{len(data)}"
        return Response(data[start:stop], status_code=206, media_type=info.media_type, headers=headers)

    async def support_bundle(request: Request) -> Response:
        """The session's support bundle (``supervisor.bundle``): for its namespace's tokens and the admin; any other
        token gets the 404 of a session it cannot see. Built off the loop, bounded, cached (``BundleService``)."""
        from .. import bundle

        principal = principal_of(request)
        session = await session_for(principal, request.path_params["session_id"])
        try:
            handle = await bundles.open(principal.identity, session.session_id)
        except bundle.BundleRefused as exc:
            raise ApiError(429, exc.code, str(exc), {"retry-after": str(exc.retry_after_s)}) from None
        except bundle.BundleError as exc:  # the operator's to fix (a bad pattern file): not shown to a tenant
            log.error("bundle of %s failed: %s", session.session_id, exc)
            raise ApiError(500, "bundle_failed", "the bundle could not be written; see the supervisor log") from None

        async def chunks() -> AsyncIterator[bytes]:
            try:
                while chunk := await trio.to_thread.run_sync(handle.read, 1 << 20):
                    yield chunk
            finally:
                handle.close()

        name = f"codesdk-bundle-{session.session_id}.tar.gz"
        return StreamingResponse(chunks(), media_type="application/gzip",
                                 headers={"content-disposition": f'attachment; filename="{name}"'})

    # -- webhooks (docs/webhooks.md) --

    def webhooks_on() -> WebhookService:
        if webhooks is None:
            raise ApiError(503, "webhooks_unavailable", "this supervisor sends no webhooks (an embedded one); use "
                           "the service (codesdk-supervisor serve)")
        return webhooks

    async def webhook_for(request: Request) -> tuple[Principal, WebhookRecord]:
        """The path's webhook, if the token sees it: the admin every one, a tenant those of its namespaces."""
        principal = principal_of(request)
        webhook_id = str(request.path_params["webhook_id"])
        service = webhooks_on()
        try:
            record = None if _unstorable(webhook_id) else await service.store.get_webhook(webhook_id)
        except UnknownWebhook:
            record = None
        if record is None or not (principal.admin or (record.namespace is not None
                                                      and principal.can_access(record.namespace))):
            raise ApiError(404, "webhook_not_found", f"no webhook {webhook_id!r}")
        return principal, record

    async def delivery_for(request: Request) -> DeliveryRecord:
        _, webhook = await webhook_for(request)
        delivery_id = str(request.path_params["delivery_id"])
        try:
            record = None if _unstorable(delivery_id) else await webhooks_on().store.get_delivery(delivery_id)
        except UnknownDelivery:
            record = None
        if record is None or record.webhook_id != webhook.webhook_id:
            raise ApiError(404, "delivery_not_found", f"no delivery {delivery_id!r} of webhook {webhook.webhook_id}")
        return record

    async def create_webhook(request: Request) -> Response:
        principal = principal_of(request)
        service = webhooks_on()
        body = await _body(request, api.CreateWebhookRequest)
        if principal.admin and body.namespace is None:
            namespace: str | None = None
        else:
            namespace = own_namespace(principal, body.namespace,
                                      "the body field 'namespace' (codesdk webhooks add --namespace)")
            Namespace.parse(namespace)  # InvalidNamespace: 422 invalid_namespace (ERROR_STATUS)
            if not principal.can_access(namespace):  # as creating a session there: the name is the caller's own
                raise ApiError(403, "forbidden", f"this token may not register webhooks in namespace {namespace!r} "
                               f"(it may in {', '.join(sorted(principal.namespaces)) or 'none'})")
        try:
            kinds = parse_kinds(body.kinds)
        except ValueError as exc:
            raise ApiError(422, "invalid_request", f"body field 'kinds': {exc}") from exc
        try:
            record, secret = await service.register(body.url, kinds, namespace, body.description,
                                                    f"api:{principal.name}", by_admin=principal.admin)
        except WebhookRefused as exc:
            raise ApiError(422, "webhook_refused", f"body field '{exc.field}': {exc}") from exc
        except TooManyWebhooks as exc:
            raise ApiError(409, "too_many_webhooks", str(exc)) from exc
        audit("webhook.created", f"api:{principal.name}", webhook=record.webhook_id, url=record.url,
              namespace=namespace or "*", kinds=",".join(kinds))
        return _answer(request, api.WebhookCreated(webhook=webhook_answer(record), secret=secret))

    async def list_webhooks(request: Request) -> Response:
        principal = principal_of(request)
        _query(request, api.NoQuery)
        records = await webhooks_on().store.list_webhooks(None if principal.admin else sorted(principal.namespaces))
        return _answer(request, api.WebhookList(webhooks=tuple(webhook_answer(r) for r in records)))

    async def get_webhook(request: Request) -> Response:
        _, record = await webhook_for(request)
        return _answer(request, webhook_answer(record))

    async def delete_webhook(request: Request) -> Response:
        principal, record = await webhook_for(request)
        await webhooks_on().remove(record.webhook_id)
        audit("webhook.removed", f"api:{principal.name}", webhook=record.webhook_id)
        return Response(status_code=204)

    async def rotate_webhook_secret(request: Request) -> Response:
        principal, record = await webhook_for(request)
        body = await _body(request, api.RotateWebhookSecretRequest)
        try:
            secret, until = await webhooks_on().rotate(record.webhook_id, end_overlap=body.end_overlap)
        except RotationOverlaps as exc:
            raise ApiError(409, "rotation_overlaps", f"{exc}, and receivers may still verify with it. Rotate again "
                           "after then, or end that overlap now with the body field 'end_overlap': true (codesdk "
                           "webhooks rotate --end-overlap): that secret then stops signing at once, so switch every "
                           "receiver to the current secret first") from exc
        audit("webhook.secret_rotated", f"api:{principal.name}", webhook=record.webhook_id)
        return _answer(request, api.RotatedSecret(secret=secret, previous_valid_until=until))

    async def test_webhook(request: Request) -> Response:
        _, record = await webhook_for(request)
        return _answer(request, api.DeliveryAnswer(delivery=delivery_answer(await webhooks_on().test(record))))

    async def list_deliveries(request: Request) -> Response:
        _, record = await webhook_for(request)
        query = _query(request, api.DeliveriesQuery)
        try:
            state = None if query.state is None else DeliveryState(query.state)
        except ValueError:
            raise ApiError(422, "invalid_query", "query 'state' must be pending, delivered or dead") from None
        try:  # one more than asked: whether another page follows
            found = await webhooks_on().store.list_deliveries(record.webhook_id, state, query.limit + 1,
                                                              query.before)
        except UnknownDelivery:
            raise ApiError(422, "invalid_query", f"query 'before': no delivery {query.before!r} of this webhook "
                           "(pass a page's next_before, or leave it out for the newest)") from None
        page, more = found[:query.limit], len(found) > query.limit
        return _answer(request, api.DeliveryList(deliveries=tuple(delivery_answer(d) for d in page), has_more=more,
                                                 next_before=page[-1].delivery_id if more else None))

    async def get_delivery(request: Request) -> Response:
        record = await delivery_for(request)
        return _answer(request, delivery_answer(record, await webhooks_on().store.delivery_attempts(record.delivery_id)))

    async def redeliver_delivery(request: Request) -> Response:
        record = await delivery_for(request)
        return _answer(request, api.DeliveryAnswer(delivery=delivery_answer(
            await webhooks_on().redeliver(record.delivery_id))))

    async def refusals_answered(handler: Callable[[Request], Awaitable[Response]], request: Request) -> Response:
        """The handler's response, or the answer to a refusal of the engine (or the store below it), by its type
        (``supervisor.engine.ERROR_STATUS``); anything else goes on up."""
        try:
            return await handler(request)
        except Exception as exc:
            answer = error_status(exc)
            if answer is None:
                raise
            details = exc.details() if isinstance(exc, NamespaceElsewhere | QuotaExceeded | ForkInsideTask
                                                  | MonthlyBudgetSpent) else None
            return _error(answer.status, answer.code, str(exc),
                          {"retry-after": str(answer.retry_after_s)} if answer.retry_after_s else None,
                          details=details)

    async def idempotent(handler: Callable[[Request], Awaitable[Response]], request: Request, key: str) -> Response:
        """A POST with an ``Idempotency-Key``: the first request with the key runs and its success is kept (for
        ``IDEMPOTENCY_WINDOW_S``); the same request again gets that answer without running, another request with
        the key is 409. A request that did not succeed changed nothing, so its key stays free for the retry."""
        if not _IDEMPOTENCY_KEY.fullmatch(key):
            raise ApiError(422, "invalid_idempotency_key", "header 'Idempotency-Key' must be 1 to 255 visible ASCII "
                                                            "characters (a random UUID, say)")
        principal = principal_of(request)
        claim = await store.claim_request(principal.identity, key, _fingerprint(request, await _raw_body(request)))
        if claim.outcome == "answered":
            return Response(claim.answer, status_code=claim.status, media_type="application/json",
                            headers={"idempotent-replayed": "true"})
        if claim.outcome == "mismatch":
            raise ApiError(409, "idempotency_key_reused", "this Idempotency-Key was used for another request (method, "
                           f"path or body) within {IDEMPOTENCY_WINDOW_S // 3600} h; a new request takes a new key")
        if claim.outcome == "running":
            raise ApiError(409, "idempotency_key_in_use", "the first request with this Idempotency-Key is still "
                           "being answered; retry shortly for its answer", {"retry-after": "1"})
        status: int | None = None
        answer: str | None = None
        try:
            response = await refusals_answered(handler, request)
            if 200 <= response.status_code < 300:
                status, answer = response.status_code, bytes(response.body).decode()
            return response
        finally:
            with trio.CancelScope(shield=True), contextlib.suppress(StoreError):  # kept even if the client left
                await store.finish_request(principal.identity, key, claim.token, status, answer)

    def counted(endpoint: Endpoint, handler: Callable[[Request], Awaitable[Response]]) -> Callable[
            [Request], Awaitable[Response]]:
        probe = endpoint.access is Access.PUBLIC or endpoint.access is Access.METRICS  # at DEBUG: scrapes, probes

        async def run(request: Request) -> Response:
            request.scope[_ENDPOINT] = endpoint
            arrived = time.monotonic()
            try:
                key = request.headers.get("idempotency-key") if endpoint.method == "POST" else None
                response = await (refusals_answered(handler, request) if key is None
                                  else idempotent(handler, request, key))
            except ApiError as exc:
                response = _error(exc.status, exc.code, exc.message, exc.headers)
            except StoreError as exc:
                log.warning("%s %s: store error: %s", request.method, request.url.path, exc)
                response = _error(503, "store_error", str(exc))
            except Exception:
                log.exception("%s %s failed", request.method, request.url.path)
                response = _error(500, "internal_error", "internal error; see the supervisor log")
            seconds = time.monotonic() - arrived
            metrics.requests.labels(route=endpoint.path, method=endpoint.method,
                                    status=str(response.status_code)).inc()
            metrics.request_seconds.labels(route=endpoint.path).observe(seconds)
            _log_access(request, endpoint, response.status_code, seconds, logging.DEBUG if probe else logging.INFO)
            return response
        return run

    document = openapi_document(version="1")
    page = reference_page(document)

    async def openapi(request: Request) -> Response:
        return JSONResponse(document)

    async def api_reference(request: Request) -> Response:
        return HTMLResponse(page)

    handlers: dict[str, Callable[[Request], Awaitable[Response]]] = {
        "getHealth": healthz, "getReadiness": readyz, "getMetrics": metrics_route,
        "createSession": create_session, "listSessions": list_sessions, "getSession": get_session,
        "updateSession": update_session, "deleteSession": delete_session, "forkSession": fork_session,
        "startTask": start_task, "listEvents": list_events, "streamEvents": stream_events,
        "getTranscript": transcript, "getSupportBundle": support_bundle, "getBlob": get_blob, "getTask": get_task, "stopTask": stop_task, "sendTaskInput": send_task_input,
        "listApprovals": list_approvals, "decideApproval": decide_approval, "listQuestions": list_questions,
        "getQuestion": get_question, "answerQuestion": answer_question, "listRuntimes": list_runtimes,
        "decideApprovals": decide_approvals, "listGrants": list_grants, "revokeGrant": revoke_grant,
        "getMe": me, "listNamespaces": list_namespaces, "getLoginState": auth_status, "getRuntimeEnv": runtime_env, "listWorkers": list_workers,
        "liftQuarantine": lift_quarantine, "getNamespaceEnv": list_env, "updateNamespaceEnv": update_env,
        "getNamespaceEgress": get_egress, "setNamespaceEgress": set_egress,
        "getSessionBudget": get_session_budget, "setSessionBudget": set_session_budget,
        "raiseSessionBudget": raise_session_budget, "getNamespaceBudget": get_namespace_budget,
        "setNamespaceBudget": set_namespace_budget,
        "listTokens": list_tokens, "createToken": create_token, "revokeToken": revoke_token,
        "rotateToken": rotate_token,
        "createWebhook": create_webhook, "listWebhooks": list_webhooks, "getWebhook": get_webhook,
        "deleteWebhook": delete_webhook, "rotateWebhookSecret": rotate_webhook_secret, "testWebhook": test_webhook,
        "listDeliveries": list_deliveries, "getDelivery": get_delivery, "redeliverDelivery": redeliver_delivery,
        "getOpenApi": openapi, "getApiReference": api_reference,
    }
    operation_ids = {endpoint.operation_id for endpoint in ENDPOINTS}
    if set(handlers) != operation_ids:
        raise RuntimeError(f"the route table and the handlers differ: {sorted(set(handlers) ^ operation_ids)}")
    routes = [Route(e.path, counted(e, handlers[e.operation_id]), methods=[e.method]) for e in ENDPOINTS]
    routes += console_routes(console, auth)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        metrics.requests.labels(route=UNMATCHED, method=request.method if request.method in _METHODS else "other",
                                status=str(exc.status_code)).inc()
        _log_access(request, None, exc.status_code, 0.0, logging.INFO)
        return _error(exc.status_code, code, str(exc.detail))

    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error})
    app.state.body_timeout_s = body_timeout_s
    return app


class _StreamSlots:
    """Open SSE streams per principal, at most ``limit`` each (``--max-streams-per-principal``)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.open: dict[str, int] = {}

    def full(self, principal: str) -> bool:
        return self.open.get(principal, 0) >= self.limit

    def acquire(self, principal: str) -> bool:
        if self.full(principal):
            return False
        self.open[principal] = self.open.get(principal, 0) + 1
        return True

    def release(self, principal: str) -> None:
        left = self.open[principal] - 1
        if left:
            self.open[principal] = left
        else:
            del self.open[principal]

    def refusal(self) -> ApiError:
        return ApiError(429, "too_many_streams",
                        f"this token already has {self.limit} event streams open, its limit (`codesdk-supervisor serve "
                        f"--max-streams-per-principal`); close one first", {"retry-after": "1"})


#: Most events one SSE write carries (those already read from the store or pushed to the subscriber): ~1 ms of
#: formatting, so that a flood's stream never holds the event loop long.
SSE_FRAMES_PER_WRITE = 64


class _SSEResponse(Response):
    """``text/event-stream`` of a session's events after ``after_seq``: ``id: <seq>``, ``event: <type>``,
    ``data: <event JSON>``; a keep-alive comment every 15 s; ends on client disconnect, store close, or
    (with ``until_terminal``) after the next terminal event."""

    def __init__(self, engine: Engine, session_id: str, after_seq: int, until_terminal: bool,
                 sent: Counter, keepalive_s: float, *, streams: _StreamSlots, principal: str,
                 drain: StreamDrain, namespace: str,
                 token_lapsed: Callable[[], Awaitable[tuple[str, str]]]) -> None:
        super().__init__(status_code=200, media_type="text/event-stream")
        if "content-length" in self.headers:
            del self.headers["content-length"]
        self.headers["cache-control"] = "no-cache"
        self.headers["x-accel-buffering"] = "no"
        self._engine = engine
        self._session_id = session_id
        self._after = after_seq
        self._until_terminal = until_terminal
        self._sent = sent
        self._keepalive_s = keepalive_s
        self._streams = streams
        self._principal = principal
        self._drain = drain
        self._namespace = namespace
        self._token_lapsed = token_lapsed  # returns (code, message) once the stream's token no longer admits it

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        streams = self._streams
        # The route refused a full principal already (a counted 429); this is the count that holds, taken only
        # when the stream really starts and given back when it ends, however it ends.
        if not streams.acquire(self._principal):
            refusal = streams.refusal()
            await _error(refusal.status, refusal.code, refusal.message, refusal.headers)(scope, receive, send)
            return
        try:
            # A client following the namespace can answer its approvals and questions (``Audience``): counted
            # while the stream is open, however it ends.
            with self._engine.audience.attached(self._namespace):
                await self._stream(scope, receive, send)
        finally:
            streams.release(self._principal)

    async def _stream(self, scope: Scope, receive: Receive, send: Send) -> None:
        lock = trio.Lock()  # the events and the keep-alives: one message at a time
        write_chunk = (scope.get("extensions") or {}).get(CHUNK_WRITER)

        async def emit(chunk: bytes) -> None:
            try:
                lock.acquire_nowait()  # free almost always: taken without a trip through the scheduler
            except trio.WouldBlock:
                await lock.acquire()
            try:
                if write_chunk is not None:
                    await write_chunk(chunk)
                else:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            finally:
                lock.release()

        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        open_stream = _OpenStream(self._session_id, self._after, trio.CancelScope())
        self._drain.opened(open_stream)
        try:
            await self._events(open_stream, emit, receive)
            with trio.move_on_after(5, shield=True), contextlib.suppress(Exception):  # the client may be gone
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            self._drain.closed(open_stream)  # its body ended (or the connection went): the drain waits no longer

    async def _events(self, open_stream: _OpenStream, emit: Callable[[bytes], Awaitable[None]],
                      receive: Receive) -> None:
        """The stream's events and keep-alives until the subscription ends, the client goes, or the drain ends it."""
        with open_stream.scope:
            async with trio.open_nursery() as nursery:
                async def pump() -> None:
                    try:
                        async with self._engine.store.subscribe(self._session_id, self._after,
                                                                until_terminal=self._until_terminal) as events:
                            while True:
                                # Events as stored: their frames are the stored JSON, built once and shared by
                                # every stream of the session. What is already here goes out in one write.
                                try:
                                    event = await events.next_stored()
                                except StopAsyncIteration:
                                    break
                                frames = [event.frame]
                                while events.ready and len(frames) < SSE_FRAMES_PER_WRITE:
                                    event = await events.next_stored()
                                    frames.append(event.frame)
                                await emit(b"".join(frames))
                                self._sent.inc(len(frames))
                                self._drain.sent(open_stream, event.seq)
                    except StoreError as exc:  # said, so that a follower reconnects rather than take this for the end
                        error = json.dumps({"error": {"code": "store_failing", "message": str(exc)}})
                        with contextlib.suppress(Exception):
                            await emit(f"event: error\ndata: {error}\n\n".encode())
                    nursery.cancel_scope.cancel()

                async def keepalive() -> None:
                    while True:
                        await trio.sleep(self._keepalive_s)
                        await emit(b": keep-alive\n\n")

                async def watch_token() -> None:
                    # A revoked, rotated or narrowed token (on any host sharing the table) ends its open streams
                    # within the bounds that refuse its new requests (``TokenAuth.until_lapsed``).
                    code, message = await self._token_lapsed()
                    error = json.dumps({"error": {"code": code, "message": message}})
                    with contextlib.suppress(Exception):
                        await emit(f"event: error\ndata: {error}\n\n".encode())
                    nursery.cancel_scope.cancel()

                async def watch_disconnect() -> None:
                    while True:
                        message = await receive()
                        if message["type"] == "http.disconnect":
                            nursery.cancel_scope.cancel()
                            return

                await emit(b": stream\n\n")
                nursery.start_soon(pump)
                nursery.start_soon(keepalive)
                nursery.start_soon(watch_disconnect)
                nursery.start_soon(watch_token)


async def _receipt_of(engine: Engine, record: TaskRecord) -> StopReceipt | None:
    """The receipt stored with the task's ``task.stopped`` (None: it ended otherwise, before the stop took)."""
    page = await engine.store.read_types(record.session_id, [EventType.TASK_STOPPED], limit=1000,
                                         task_id=record.task_id)
    stopped = page[-1].payload if page else None
    return stopped.receipt if isinstance(stopped, TaskStopped) else None
