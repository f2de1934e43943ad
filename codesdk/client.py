"""Python client of the supervisor's HTTP API, async (trio or asyncio, via anyio) and sync.

    async with AsyncClient(socket="/run/codesdk/api.sock", token=token) as client:
        session = await client.create_session(namespace="user:alice")
        async for event in client.run(session.session_id, "fix the tests"):
            print(event.type, event.payload)

Answers are the typed models of ``codesdk.protocol.api`` (``Session``, ``Task``, ``Approval`` …), re-exported here
with the event types; events come back as ``NormalizedEvent``. ``stream`` follows a session over SSE and, when the
connection drops, reconnects with ``Last-Event-ID`` = the last seq it handed out: no gaps, no duplicates.
Errors are typed by status: Unauthorized (401), Forbidden (403), NotFound (404), Conflict (409),
NamespaceElsewhere (421: another supervisor sharing the store runs the namespace; ``.api`` says where),
InvalidRequest (422), TooManyRequests (429), else ApiError; ``.details`` holds what the service added.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from pathlib import Path
from dataclasses import dataclass
from functools import partial
from typing import IO, Any, Generic, Self, TypeVar
from urllib.parse import quote

import anyio
import httpx2 as httpx

from pydantic import BaseModel, ValidationError

from codesdk.protocol import (
    TERMINAL_EVENT_TYPES,
    ApprovalRequested,
    BudgetLimits,
    CodeBlock,
    CommandPattern,
    EventType,
    HostPattern,
    NormalizedEvent,
    PathPattern,
    QuestionReply,
    QuestionRequested,
    QuestionState,
    RuntimeOffer,
    TextBlock,
    api,
)
from codesdk.protocol.api import (
    Approval,
    DeletedSession,
    EnvVariable,
    ForkWorkspace,
    LoginState,
    NamespaceInfo,
    Session,
    SessionFilter,
    SessionList,
    SessionState,
    StoppedTask,
    Task,
    TaskInput,
    TaskResult,
    TaskState,
    Transcript,
    Usage,
    WorkerState,
)

T = TypeVar("T")

#: A message for a running task (``send_input``): text, or text/code blocks (models or their JSON objects).
TaskInputText = str | Sequence[TextBlock | CodeBlock | Mapping[str, Any]]


def _input_json(text: TaskInputText) -> str | list[Any]:
    if isinstance(text, str):
        return text
    return [block.to_json_obj() if isinstance(block, (TextBlock, CodeBlock)) else dict(block) for block in text]


__all__ = ["ApiError", "Approval", "AsyncClient", "Budget", "Client", "Conflict", "DeletedSession", "EnvVariable",
           "EventAnswerer", "EventApprover", "PaymentRequired", "QuestionReply",
           "EventType", "Forbidden", "ForkWorkspace", "InvalidRequest", "LoginState", "NamespaceElsewhere",
           "NamespaceInfo", "NormalizedEvent", "NotFound", "RuntimeOffer", "ServiceUnreachable", "Session",
           "SessionFilter", "SessionList", "SessionState", "StoppedTask", "Task", "TaskInput", "TaskInputText", "TaskResult", "TaskRun", "TaskState",
           "TooManyRequests", "Transcript", "Unauthorized", "Usage", "WorkerState"]

#: Answers one ``approval.requested`` event: allow or not, and why (shown to the runtime on a denial) — or a whole
#: ``api.DecisionRequest`` (with a scope, a rule's pattern, an edited input).
Answer = tuple[bool, str] | api.DecisionRequest
EventApprover = Callable[[NormalizedEvent], Awaitable[Answer]]

#: What an answerer returns: a ``QuestionReply`` (answers, or a decline), or just the answers by question id.
Reply = QuestionReply | Mapping[str, Any]
#: Answers one ``question.requested`` event: the answers (keyed by question id), or a decline with its reason.
EventAnswerer = Callable[[NormalizedEvent], Awaitable[Reply]]

#: The longest wait between two asks of whether an approval or a question ``run`` put to a person was settled
#: elsewhere (over the API, by expiry, by its task's end).
SETTLED_POLL_MAX_S = 5.0
#: Reconnects of one stream in a row that bring no new event before giving up (each resumes where the last left
#: off), and the wait before the first of them (doubled for each next one, up to 4 s).
MAX_RECONNECTS = 5
RECONNECT_BACKOFF_S = 0.25

#: A request whose connection broke after it was sent (the answer never came) is sent again this many times, with
#: the same ``Idempotency-Key`` for a POST, so it runs once; ``RECONNECT_BACKOFF_S`` apart, doubling.
RETRIES = 3
#: How long a retry waits, at most, for the first request with its key to be answered (409 ``idempotency_key_in_use``).
IN_USE_WAIT_S = 120.0

#: Seconds a stop may take: the runtime's longest grace (``protocol.MAX_STOP_GRACE_S``), its SIGTERM grace and the
#: checks that follow.
STOP_TIMEOUT_S = 120.0


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        #: what the service added to the refusal (a quota's limit and use; where a namespace runs)
        self.details: dict[str, Any] = details or {}


class Unauthorized(ApiError): ...


class Forbidden(ApiError): ...


class NotFound(ApiError): ...


class Conflict(ApiError): ...


class InvalidRequest(ApiError): ...


class TooManyRequests(ApiError):
    """A limit of the service (429): ``code`` says which — ``too_many_tasks``, ``too_many_streams``,
    ``too_many_connections``, ``session_quota_exceeded``, ``namespace_quota_exceeded`` — and the message how to
    go on (wait, close something, or have the operator raise the limit)."""


class PaymentRequired(ApiError):
    """402 ``monthly_budget_spent``: the namespace spent its monthly budget (the operator's); ``details`` say what it
    spent, its limit and when the month resets (``resets_at``, UTC)."""


class NamespaceElsewhere(ApiError):
    """421: several supervisors share the service's store, and another one runs this namespace (creating its
    sessions, starting, stopping and approving its tasks happen there; reading works on any). ``api`` lists where
    that supervisor listens: send the request there, with a token it knows."""

    @property
    def api(self) -> list[str]:
        supervisor = self.details.get("supervisor")
        return [str(a) for a in supervisor.get("api", [])] if isinstance(supervisor, dict) else []


class ServiceUnreachable(ApiError):
    """Nothing answers at the socket or URL (status 503, code ``service_unreachable``): the service is not running
    there, or the path or address is wrong."""

    def __init__(self, where: str, why: BaseException) -> None:
        super().__init__(503, "service_unreachable", f"cannot reach the CodeSDK service at {where} ({why}); is "
                         "`codesdk-supervisor serve` running there, and is that the socket or URL it listens on?")


_BY_STATUS: dict[int, type[ApiError]] = {402: PaymentRequired, 401: Unauthorized, 403: Forbidden, 404: NotFound, 409: Conflict,
                                         421: NamespaceElsewhere, 422: InvalidRequest, 429: TooManyRequests}


def _raise_for(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    try:
        error = response.json()["error"]
        code, message = str(error["code"]), str(error["message"])
        details = error.get("details") if isinstance(error.get("details"), dict) else None
    except (ValueError, KeyError, TypeError, AttributeError):
        code, message, details = "http_error", response.text[:500], None
    raise _BY_STATUS.get(response.status_code, ApiError)(response.status_code, code, message, details)


def _transport_args(socket: str | Path | None, base_url: str | None) -> tuple[dict[str, Any], str]:
    if socket is not None:
        return {"uds": str(socket)}, "http://codesdk"
    if base_url is None:
        raise ValueError("give the supervisor's unix socket (socket=…) or its base_url")
    return {}, base_url.rstrip("/")


class _SSE:
    """Incremental ``text/event-stream`` parser: lines in, (id, data) out."""

    def __init__(self) -> None:
        self.event_id: str | None = None
        self.data: list[str] = []

    def line(self, line: str) -> tuple[str | None, str] | None:
        if not line:
            if not self.data:
                return None
            out = (self.event_id, "\n".join(self.data))
            self.event_id, self.data = None, []
            return out
        if line.startswith(":"):
            return None  # keep-alive comment
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "id":
            self.event_id = value
        elif field == "data":
            self.data.append(value)
        return None


class _Follow:
    """Where one followed stream stands across its connections (sans-IO, shared by both clients): the last seq
    handed out (the next connection's ``Last-Event-ID``; nothing at or below it is handed out twice), whether the
    terminal event came, the service's last ``error`` frame, and how long to wait before the next connection —
    none once ``MAX_RECONNECTS`` + 1 connections in a row brought nothing new."""

    def __init__(self, session_id: str, after_seq: int, until_terminal: bool, task_id: str | None = None) -> None:
        self.session_id = session_id
        self.last = after_seq
        self.until_terminal = _boolean("until_terminal", until_terminal)
        self.task_id = task_id
        self.finished = False
        self.failure: dict[str, Any] | None = None
        self._fruitless = -1  # connections in a row that ended without a new event (-1: none made yet)
        self._resumed_from = after_seq
        self._frames = _SSE()
        self._unreachable: ServiceUnreachable | None = None
        self._connections = 0

    def next_connection(self) -> float | None:
        """Seconds to wait before connecting again, or None: give up (raise ``lost()``)."""
        if self.last > self._resumed_from or self._fruitless < 0:  # a fresh start: what went wrong before is over
            self._fruitless, self.failure, self._unreachable = 0, None, None
        else:
            self._fruitless += 1
        if self._fruitless > MAX_RECONNECTS:
            return None
        self._resumed_from, self._frames = self.last, _SSE()
        self._connections += 1
        return 0.0 if not self._fruitless else min(RECONNECT_BACKOFF_S * 2 ** (self._fruitless - 1), 4.0)

    def request(self) -> tuple[dict[str, str], dict[str, str]]:
        """The next connection's query parameters and headers."""
        params = {"until_terminal": "true"} if self.until_terminal else {}
        return params, {"Last-Event-ID": str(self.last)}

    def line(self, line: str) -> NormalizedEvent | None:
        """One line of the response: the event it completes, if it is one to hand out. (Read a response to its
        end even after the terminal event — the server closes it right after — since leaving httpx's line
        iterator early leaks its inner generators.)"""
        frame = self._frames.line(line)
        if frame is None or self.finished:
            return None
        data = json.loads(frame[1])
        if isinstance(data, dict) and "error" in data:  # the service could not go on
            self.failure = data["error"] if isinstance(data["error"], dict) else {"message": str(data["error"])}
            return None
        event = NormalizedEvent.model_validate(data)
        if event.seq <= self.last:
            return None
        self.last = event.seq
        if self.task_id is not None and event.trace.task_id != self.task_id:
            return None  # another task's (an orphan's end, stored when the namespace was taken over)
        self.finished = self.until_terminal and event.type in TERMINAL_EVENT_TYPES
        return event

    def unreachable(self, where: str, why: BaseException) -> None:
        """A connection could not be made: at once an error when it was the first (nothing to resume: the address
        is likely wrong), else the reason given if the ones after fail too."""
        self._unreachable = ServiceUnreachable(where, why)
        if self._connections == 1:
            raise self._unreachable from why

    def lost(self) -> ApiError:
        if self.failure is not None:
            return ApiError(503, str(self.failure.get("code", "stream_failed")), str(self.failure.get("message", "")))
        if self._unreachable is not None:
            return self._unreachable
        return ApiError(0, "stream_lost", f"the event stream of {self.session_id} ended {MAX_RECONNECTS + 1} times "
                        "in a row without a new event")


def _q(segment: str) -> str:
    """One path segment, quoted: an id or namespace can never address another route ("/", "..")."""
    return quote(str(segment), safe=":@")


def _blob_path(session_id: str, ref: str) -> str:
    return f"/v1/sessions/{_q(session_id)}/blobs/{_q(ref)}"


def _approval_id(event: NormalizedEvent) -> str:
    if not isinstance(event.payload, ApprovalRequested):
        raise TypeError(f"{event.type} is not an approval.requested event; nothing to answer")
    return event.payload.approval_id


def _question_id(event: NormalizedEvent) -> str:
    if not isinstance(event.payload, QuestionRequested):
        raise TypeError(f"{event.type} is not a question.requested event; nothing to answer")
    return event.payload.question_id


def _asks_someone(event: NormalizedEvent) -> bool:
    """A ``question.requested`` that waits for an answer (one refused at once has no expiry, and no one to ask)."""
    return isinstance(event.payload, QuestionRequested) and event.payload.expires_at is not None


def _boolean(name: str, value: object) -> bool:
    """A flag the API takes as a JSON boolean: ``"yes"``, ``1`` or ``None`` is refused here, as by the API."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, not {value!r}")
    return value


@dataclass(frozen=True)
class _Call(Generic[T]):
    """One request and how its answer reads (sans-IO): what both clients send for an operation, so the blocking
    and the async client cannot differ in anything but waiting."""

    method: str
    path: str
    read: Callable[[Any], T]
    json: Any = None
    params: dict[str, Any] | None = None
    timeout: float | None = None
    #: A POST's ``Idempotency-Key`` (a random one unless the caller gave its own): sent again as is on a retry.
    idempotency_key: str | None = None

    def headers(self) -> dict[str, str]:
        return {} if self.idempotency_key is None else {"Idempotency-Key": self.idempotency_key}


#: A rule's pattern: the model, or its JSON form (``{"kind": "path", "prefix": "src"}``).
Pattern = PathPattern | CommandPattern | HostPattern | Mapping[str, Any]
#: One decision of ``decide_many``: the request model, or its JSON form with ``approval_id``.
Decision = api.ApprovalDecision | Mapping[str, Any]


def _decision(allow: bool, reason: str, scope: str, pattern: Pattern | None,
              input: Mapping[str, Any] | None) -> dict[str, Any]:
    """A decision's JSON body; checked here as the API checks it (``TypeError``/``ValueError`` before sending)."""
    _boolean("allow", allow)
    if not isinstance(reason, str):
        raise TypeError(f"reason must be text, not {reason!r}")
    body: dict[str, Any] = {"allow": allow, "reason": reason}
    if scope != "once":
        body["scope"] = str(scope)
    if pattern is not None:
        body["pattern"] = pattern.model_dump(mode="json") if isinstance(pattern, BaseModel) else dict(pattern)
    if input is not None:
        body["input"] = dict(input)
    api.DecisionRequest.model_validate(body)  # ValidationError (a ValueError) naming the field, before sending
    return body


def _decision_item(item: Decision) -> dict[str, Any]:
    model = item if isinstance(item, api.ApprovalDecision) else api.ApprovalDecision.model_validate(dict(item))
    return model.model_dump(mode="json", exclude_none=True)


def _as_reply(reply: Reply) -> QuestionReply:
    """An answerer's reply: a ``QuestionReply``, or just the answers keyed by question id."""
    if isinstance(reply, QuestionReply):
        return reply
    if isinstance(reply, Mapping):
        return QuestionReply(answers=dict(reply))
    raise TypeError(f"an answerer returns a QuestionReply or a dict of answers by question id, not {reply!r}")


def _as_decision(answer: Answer) -> api.DecisionRequest:
    if isinstance(answer, api.DecisionRequest):
        return answer
    allow, reason = answer
    return api.DecisionRequest(allow=_boolean("allow", allow), reason=reason)


def _key(given: str | None) -> str:
    return given if given is not None else str(uuid.uuid4())


class _Retry:
    """When to send a call again (sans-IO, shared by both clients): a connection that broke once the request was
    on its way (not one that could not be made: nothing listens) up to ``RETRIES`` times, and a POST whose key's
    first request is still being answered until ``IN_USE_WAIT_S`` has passed. Every operation may be sent again:
    GETs read, PATCH and DELETE set a state, and each POST carries its key."""

    def __init__(self) -> None:
        self.broken = 0
        self.waited = 0.0

    def after_break(self) -> float | None:
        self.broken += 1
        return None if self.broken > RETRIES else RECONNECT_BACKOFF_S * 2 ** (self.broken - 1)

    def after_answer(self, response: httpx.Response) -> float | None:
        if response.status_code != 409 or "idempotent-replayed" in response.headers:
            return None
        try:
            in_use = response.json()["error"]["code"] == "idempotency_key_in_use"
        except (ValueError, KeyError, TypeError):
            return None
        if not in_use or self.waited >= IN_USE_WAIT_S:
            return None
        wait = min(float(response.headers.get("retry-after", "1") or 1), 5.0)
        self.waited += wait
        return wait


#: Errors of a connection that broke after the request was (perhaps) sent.
_BROKEN = (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError, httpx.ReadTimeout, httpx.WriteTimeout)

#: A budget's limits: ``{"tokens": N, "cost_usd": X, "tool_calls": N}`` (any of them), or the API's model.
Budget = Mapping[str, Any] | api.BudgetLimitsRequest | BudgetLimits


def _budget(limits: Budget) -> dict[str, Any]:
    """A budget as the body carries it: as given (the service says what is wrong with it, naming the field)."""
    if isinstance(limits, (api.BudgetLimitsRequest, BudgetLimits)):
        return limits.model_dump(exclude_none=True)
    for name, value in limits.items():  # JSON has no NaN or infinity: such a limit cannot even be sent
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"budget limit {name!r} must be a finite number, not {value!r}")
    return dict(limits)


def _page_params(**params: object) -> dict[str, Any]:
    return {name: value for name, value in params.items() if value is not None}


class _Calls:
    """Every operation of the API as a ``_Call``; the clients' methods are these, sent."""

    @staticmethod
    def create_session(namespace: str, runtime: str | None, metadata: dict[str, Any] | None,
                       workspace: str | Path | None, key: str | None, title: str | None,
                       isolation: api.IsolationLevel | str | None = None,
                       budget: Budget | None = None) -> _Call[api.Session]:
        body: dict[str, Any] = {"namespace": namespace, "metadata": metadata or {}}
        if budget is not None:
            body["budget"] = _budget(budget)
        if isolation is not None:  # as given: the service names the levels it knows when it refuses one
            body["isolation"] = str(isolation)
        if runtime:
            body["runtime"] = runtime
        if workspace is not None:  # the admin token only: a tenant gets a workspace of its own
            body["workspace"] = str(workspace)
        if title is not None:  # as given: the service says what a title takes (1 to 200 characters)
            body["title"] = title
        return _Call("POST", "/v1/sessions", api.Session.model_validate, json=body, idempotency_key=_key(key))

    @staticmethod
    def list_sessions(namespace: str | None, runtime: str | None, after: str | None, limit: int | None,
                      offset: int | None, state: str | None, q: str | None) -> _Call[api.SessionList]:
        return _Call("GET", "/v1/sessions", api.SessionList.model_validate,
                     params=_page_params(namespace=namespace, runtime=runtime, after=after, limit=limit,
                                         offset=offset, state=None if state is None else str(state), q=q))

    @staticmethod
    def get_session(session_id: str) -> _Call[api.Session]:
        return _Call("GET", f"/v1/sessions/{_q(session_id)}", api.Session.model_validate)

    @staticmethod
    def update_session(session_id: str, title: str | None, archived: bool | None,
                       metadata: dict[str, Any] | None) -> _Call[api.Session]:
        """Only what is given changes (``api.UpdateSessionRequest``)."""
        body: dict[str, Any] = {}
        if title is not None:
            body["title"] = title
        if archived is not None:
            body["archived"] = _boolean("archived", archived)
        if metadata is not None:
            body["metadata"] = metadata
        return _Call("PATCH", f"/v1/sessions/{_q(session_id)}", api.Session.model_validate, json=body)

    @staticmethod
    def delete_session(session_id: str) -> _Call[api.DeletedSession]:
        return _Call("DELETE", f"/v1/sessions/{_q(session_id)}", api.DeletedSession.model_validate)

    @staticmethod
    def fork_session(session_id: str, at_seq: int | None, title: str | None, metadata: dict[str, Any] | None,
                     workspace: str, key: str | None) -> _Call[api.Session]:
        body: dict[str, Any] = {"workspace": str(workspace)}
        optional = {"at_seq": at_seq, "title": title, "metadata": metadata}
        body |= {name: value for name, value in optional.items() if value is not None}
        return _Call("POST", f"/v1/sessions/{_q(session_id)}/fork", api.Session.model_validate, json=body,
                     idempotency_key=_key(key))

    @staticmethod
    def start_task(session_id: str, prompt: str, permission_mode: str | None, runtime_config: dict[str, Any] | None,
                   interactive: bool, runtime: str | None, max_input_tokens: int | None, timeout_s: float | None,
                   idle_timeout_s: float | None, key: str | None, budget: Budget | None = None) -> _Call[api.Task]:
        """The body carries what was given; the service checks it (``api.StartTaskRequest``) and says what is
        wrong, so both clients' refusals are the service's own."""
        body: dict[str, Any] = {"prompt": prompt}
        if budget is not None:
            body["budget"] = _budget(budget)
        if _boolean("interactive", interactive):
            body["interaction_mode"] = "interactive"
        optional = {"runtime": runtime or None, "max_input_tokens": max_input_tokens, "timeout_s": timeout_s,
                    "idle_timeout_s": idle_timeout_s, "permission_mode": permission_mode or None,
                    "runtime_config": runtime_config or None}
        body |= {name: value for name, value in optional.items() if value is not None}
        return _Call("POST", f"/v1/sessions/{_q(session_id)}/tasks", api.Task.model_validate, json=body,
                     idempotency_key=_key(key))

    @staticmethod
    def get_task(task_id: str) -> _Call[api.Task]:
        return _Call("GET", f"/v1/tasks/{_q(task_id)}", api.Task.model_validate)

    @staticmethod
    def stop_task(task_id: str, reason: str | None, key: str | None) -> _Call[api.StoppedTask]:
        return _Call("POST", f"/v1/tasks/{_q(task_id)}/stop", api.StoppedTask.model_validate,
                     json={"reason": reason} if reason else {}, timeout=STOP_TIMEOUT_S, idempotency_key=_key(key))

    @staticmethod
    def send_input(task_id: str, text: TaskInputText, input_id: str | None, key: str | None) -> _Call[api.TaskInput]:
        body: dict[str, Any] = {"input": _input_json(text)}
        if input_id is not None:
            body["input_id"] = input_id
        return _Call("POST", f"/v1/tasks/{_q(task_id)}/input", api.TaskInput.model_validate, json=body,
                     idempotency_key=_key(key))

    @staticmethod
    def events(session_id: str, after_seq: int, limit: int) -> _Call[list[NormalizedEvent]]:
        return _Call("GET", f"/v1/sessions/{_q(session_id)}/events",
                     lambda answer: list(api.EventPage.model_validate(answer).events),
                     params={"after_seq": after_seq, "limit": limit})

    @staticmethod
    def approvals(state: str) -> _Call[list[api.Approval]]:
        return _Call("GET", "/v1/approvals", lambda answer: list(api.ApprovalList.model_validate(answer).approvals),
                     params={"state": state})

    @staticmethod
    def decide(approval_id: str, allow: bool, reason: str, key: str | None, scope: str = "once",
               pattern: Pattern | None = None, input: Mapping[str, Any] | None = None) -> _Call[api.Approval]:
        return _Call("POST", f"/v1/approvals/{_q(approval_id)}", api.Approval.model_validate,
                     json=_decision(allow, reason, scope, pattern, input), idempotency_key=_key(key))

    @staticmethod
    def decide_many(decisions: Sequence[Decision], key: str | None) -> _Call[list[api.DecisionResult]]:
        body = [_decision_item(item) for item in decisions]
        return _Call("POST", "/v1/approvals/decisions",
                     lambda answer: list(api.DecisionResults.model_validate(answer).results),
                     json={"decisions": body}, idempotency_key=_key(key))

    @staticmethod
    def grants(session_id: str) -> _Call[list[api.Grant]]:
        return _Call("GET", f"/v1/sessions/{_q(session_id)}/grants",
                     lambda answer: list(api.GrantList.model_validate(answer).grants))

    @staticmethod
    def revoke_grant(session_id: str, grant_id: str) -> _Call[api.Grant]:
        return _Call("DELETE", f"/v1/sessions/{_q(session_id)}/grants/{_q(grant_id)}", api.Grant.model_validate)

    @staticmethod
    def questions(state: str) -> _Call[list[api.AskedQuestion]]:
        return _Call("GET", "/v1/questions",
                     lambda answer: list(api.AskedQuestionList.model_validate(answer).questions),
                     params={"state": state})

    @staticmethod
    def question(question_id: str) -> _Call[api.AskedQuestion]:
        return _Call("GET", f"/v1/questions/{_q(question_id)}", api.AskedQuestion.model_validate)

    @staticmethod
    def answer_question(question_id: str, answers: Mapping[str, Any] | None, decline: bool, reason: str,
                        key: str | None) -> _Call[api.AskedQuestion]:
        _boolean("decline", decline)
        if not isinstance(reason, str):
            raise TypeError(f"reason must be text, not {reason!r}")
        if answers is not None and not isinstance(answers, Mapping):
            raise TypeError(f"answers must be a mapping of question id to answer, not {answers!r}")
        body: dict[str, Any] = {"answers": dict(answers or {}), "decline": decline, "reason": reason}
        return _Call("POST", f"/v1/questions/{_q(question_id)}", api.AskedQuestion.model_validate, json=body,
                     idempotency_key=_key(key))

    @staticmethod
    def me() -> _Call[api.Me]:
        return _Call("GET", "/v1/me", api.Me.model_validate)

    @staticmethod
    def namespaces() -> _Call[list[api.NamespaceInfo]]:
        return _Call("GET", "/v1/namespaces",
                     lambda answer: list(api.NamespaceList.model_validate(answer).namespaces))

    @staticmethod
    def runtimes(namespace: str | None) -> _Call[list[RuntimeOffer]]:
        return _Call("GET", "/v1/runtimes", lambda answer: list(api.RuntimeList.model_validate(answer).runtimes),
                     params=_page_params(namespace=namespace))

    @staticmethod
    def auth_status(namespace: str, runtime: str) -> _Call[api.LoginState]:
        return _Call("GET", f"/v1/namespaces/{_q(namespace)}/auth/{_q(runtime)}", api.LoginState.model_validate)

    @staticmethod
    def runtime_env(namespace: str, session_id: str | None) -> _Call[api.RuntimeEnvView]:
        return _Call("GET", f"/v1/namespaces/{_q(namespace)}/runtime-env", api.RuntimeEnvView.model_validate,
                     params=_page_params(session_id=session_id))

    @staticmethod
    def namespace_env(namespace: str) -> _Call[list[api.EnvVariable]]:
        return _Call("GET", f"/v1/namespaces/{_q(namespace)}/env",
                     lambda answer: list(api.EnvList.model_validate(answer).variables))

    @staticmethod
    def update_namespace_env(namespace: str, set: dict[str, str] | None,
                             unset: list[str] | None) -> _Call[list[api.EnvVariable]]:
        return _Call("PATCH", f"/v1/namespaces/{_q(namespace)}/env",
                     lambda answer: list(api.EnvList.model_validate(answer).variables),
                     json={"set": set or {}, "unset": unset or []})

    @staticmethod
    def session_budget(session_id: str) -> _Call[api.SessionBudgetView]:
        return _Call("GET", f"/v1/sessions/{_q(session_id)}/budget", api.SessionBudgetView.model_validate)

    @staticmethod
    def set_session_budget(session_id: str, limits: Budget) -> _Call[api.SessionBudgetView]:
        return _Call("PUT", f"/v1/sessions/{_q(session_id)}/budget", api.SessionBudgetView.model_validate,
                     json={"limits": _budget(limits)})

    @staticmethod
    def raise_budget(session_id: str, limits: Budget | None, go_on: bool, task_budget: Budget | None,
                     prompt: str | None, key: str | None) -> _Call[api.RaisedBudget]:
        body: dict[str, Any] = {"limits": _budget(limits or {}), "continue": _boolean("continue_", go_on)}
        if task_budget is not None:
            body["task_budget"] = _budget(task_budget)
        if prompt is not None:
            body["prompt"] = prompt
        return _Call("POST", f"/v1/sessions/{_q(session_id)}/budget/raise", api.RaisedBudget.model_validate,
                     json=body, idempotency_key=_key(key))

    @staticmethod
    def namespace_budget(namespace: str) -> _Call[api.NamespaceBudget]:
        return _Call("GET", f"/v1/namespaces/{_q(namespace)}/budget", api.NamespaceBudget.model_validate)

    @staticmethod
    def set_namespace_budget(namespace: str, monthly_usd: float | None) -> _Call[api.NamespaceBudget]:
        return _Call("PUT", f"/v1/namespaces/{_q(namespace)}/budget", api.NamespaceBudget.model_validate,
                     json={"monthly_usd": monthly_usd})

    @staticmethod
    def namespace_egress(namespace: str) -> _Call[api.NamespaceEgress]:
        return _Call("GET", f"/v1/namespaces/{_q(namespace)}/egress", api.NamespaceEgress.model_validate)

    @staticmethod
    def set_namespace_egress(namespace: str, hosts: list[str] | None) -> _Call[api.NamespaceEgress]:
        return _Call("PUT", f"/v1/namespaces/{_q(namespace)}/egress", api.NamespaceEgress.model_validate,
                     json={"hosts": hosts})

    @staticmethod
    def workers() -> _Call[list[api.WorkerState]]:
        return _Call("GET", "/v1/workers", lambda answer: list(api.WorkerList.model_validate(answer).workers))

    @staticmethod
    def lift_quarantine(namespace: str) -> _Call[bool]:
        return _Call("DELETE", f"/v1/namespaces/{_q(namespace)}/quarantine",
                     lambda answer: api.QuarantineLifted.model_validate(answer).lifted)

    @staticmethod
    def transcript(session_id: str) -> _Call[api.Transcript]:
        return _Call("GET", f"/v1/sessions/{_q(session_id)}/transcript", api.Transcript.model_validate)

    @staticmethod
    def create_webhook(url: str, kinds: Sequence[str], namespace: str | None, description: str,
                       key: str | None) -> _Call[api.WebhookCreated]:
        body: dict[str, Any] = {"url": url, "kinds": list(kinds), "description": description}
        if namespace is not None:
            body["namespace"] = namespace
        return _Call("POST", "/v1/webhooks", api.WebhookCreated.model_validate, json=body, idempotency_key=_key(key))

    @staticmethod
    def webhooks() -> _Call[list[api.Webhook]]:
        return _Call("GET", "/v1/webhooks", lambda answer: list(api.WebhookList.model_validate(answer).webhooks))

    @staticmethod
    def webhook(webhook_id: str) -> _Call[api.Webhook]:
        return _Call("GET", f"/v1/webhooks/{_q(webhook_id)}", api.Webhook.model_validate)

    @staticmethod
    def delete_webhook(webhook_id: str) -> _Call[None]:
        return _Call("DELETE", f"/v1/webhooks/{_q(webhook_id)}", lambda answer: None)

    @staticmethod
    def rotate_webhook_secret(webhook_id: str, end_overlap: bool) -> _Call[api.RotatedSecret]:
        return _Call("POST", f"/v1/webhooks/{_q(webhook_id)}/rotate", api.RotatedSecret.model_validate,
                     json={"end_overlap": True} if end_overlap else None, idempotency_key=_key(None))

    @staticmethod
    def test_webhook(webhook_id: str) -> _Call[api.Delivery]:
        return _Call("POST", f"/v1/webhooks/{_q(webhook_id)}/test",
                     lambda answer: api.DeliveryAnswer.model_validate(answer).delivery, idempotency_key=_key(None))

    @staticmethod
    def deliveries(webhook_id: str, state: str | None) -> _Call[list[api.Delivery]]:
        return _Call("GET", f"/v1/webhooks/{_q(webhook_id)}/deliveries",
                     lambda answer: list(api.DeliveryList.model_validate(answer).deliveries),
                     params=None if state is None else {"state": state})

    @staticmethod
    def list_deliveries(webhook_id: str, state: str | None, before: str | None,
                        limit: int | None) -> _Call[api.DeliveryList]:
        params = {key: value for key, value in (("state", state), ("before", before), ("limit", limit))
                  if value is not None}
        return _Call("GET", f"/v1/webhooks/{_q(webhook_id)}/deliveries", api.DeliveryList.model_validate,
                     params=params or None)

    @staticmethod
    def delivery(webhook_id: str, delivery_id: str) -> _Call[api.Delivery]:
        return _Call("GET", f"/v1/webhooks/{_q(webhook_id)}/deliveries/{_q(delivery_id)}",
                     api.Delivery.model_validate)

    @staticmethod
    def redeliver(webhook_id: str, delivery_id: str) -> _Call[api.Delivery]:
        return _Call("POST", f"/v1/webhooks/{_q(webhook_id)}/deliveries/{_q(delivery_id)}/redeliver",
                     lambda answer: api.DeliveryAnswer.model_validate(answer).delivery, idempotency_key=_key(None))


def _unexpected(call: _Call[Any], answer: object, exc: ValidationError) -> ApiError:
    return ApiError(502, "unexpected_answer", f"{call.method} {call.path} answered what this client cannot read "
                    f"({exc.error_count()} problems, first: {exc.errors()[0]['msg']}); is the service a newer major "
                    "version?")


class AsyncClient:
    """The API's client, async (trio or asyncio). Every answer is a typed model of ``codesdk.protocol.api``
    (re-exported here); events are ``NormalizedEvent``."""

    def __init__(self, *, socket: str | Path | None = None, base_url: str | None = None, token: str,
                 timeout_s: float = 30.0) -> None:
        transport_args, url = _transport_args(socket, base_url)
        self._where = f"unix:{socket}" if socket is not None else url
        self._http = httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(**transport_args), base_url=url,
                                       headers={"Authorization": f"Bearer {token}"}, timeout=timeout_s)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _send(self, call: _Call[T]) -> T:
        retry = _Retry()
        while True:
            try:
                response = await self._http.request(call.method, call.path, json=call.json, params=call.params,
                                                     headers=call.headers(),
                                                     timeout=call.timeout or httpx.USE_CLIENT_DEFAULT)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                raise ServiceUnreachable(self._where, exc) from exc
            except _BROKEN as exc:
                if (wait := retry.after_break()) is None:
                    raise ServiceUnreachable(self._where, exc) from exc
                await anyio.sleep(wait)
                continue
            if (wait := retry.after_answer(response)) is None:
                break
            await anyio.sleep(wait)
        _raise_for(response)
        answer = response.json() if response.content else None  # 204: no body
        try:
            return call.read(answer)
        except ValidationError as exc:
            raise _unexpected(call, answer, exc) from exc

    async def create_session(self, *, namespace: str = "default", runtime: str | None = None,
                             metadata: dict[str, Any] | None = None, workspace: str | Path | None = None,
                             title: str | None = None, idempotency_key: str | None = None,
                             isolation: api.IsolationLevel | str | None = None,
                             budget: Budget | None = None) -> api.Session:
        """A new session in ``namespace`` (``workspace``: the admin token only; a tenant's session gets its own;
        ``title``: 1 to 200 characters, for people, searched by ``list_sessions(q=…)``; ``isolation``: where its
        runtime's HOME is — ``namespaced`` (the service's default), ``ephemeral`` (one of its own, removed with it)
        or ``shared`` (the service user's own; ``Conflict`` ``isolation_refused`` on a multi-user service)).

        Every POST carries an ``Idempotency-Key`` (a random one, or ``idempotency_key``: give your own to retry
        across restarts of your app) and is sent again with it when the connection breaks before the answer came:
        it runs once."""
        return await self._send(_Calls.create_session(namespace, runtime, metadata, workspace, idempotency_key,
                                                      title, isolation, budget))

    async def list_sessions(self, *, namespace: str | None = None, runtime: str | None = None,
                            after: str | None = None, limit: int | None = None, offset: int | None = None,
                            state: api.SessionFilter | str | None = None, q: str | None = None) -> api.SessionList:
        """One page of the sessions the token sees, oldest first (``namespace``, ``runtime``: only those); while
        ``has_more``, the next page is ``after=page.next_after``. ``state``: ``live`` (the default: all but the
        archived), ``idle``, ``busy``, ``archived`` or ``all``; ``q``: only those whose title or one of whose
        prompts contains this text."""
        return await self._send(_Calls.list_sessions(namespace, runtime, after, limit, offset, state, q))

    async def get_session(self, session_id: str) -> api.Session:
        return await self._send(_Calls.get_session(session_id))

    async def update_session(self, session_id: str, *, title: str | None = None, archived: bool | None = None,
                             metadata: dict[str, Any] | None = None) -> api.Session:
        """Retitle the session, archive it (``archived=True``) or bring it back, and/or replace its metadata; only
        what is given changes. Returns the session as it is now."""
        return await self._send(_Calls.update_session(session_id, title, archived, metadata))

    async def archive(self, session_id: str) -> api.Session:
        """Leave the session out of listings (``state="archived"`` or ``"all"`` lists it); it is kept whole and
        usable."""
        return await self._send(_Calls.update_session(session_id, None, True, None))

    async def unarchive(self, session_id: str) -> api.Session:
        """Bring an archived session back into listings."""
        return await self._send(_Calls.update_session(session_id, None, False, None))

    async def delete_session(self, session_id: str) -> api.DeletedSession:
        """Delete the session: its events, tasks and approvals, the blobs no other session holds, and its default
        workspace unless a fork works in it; returns what was removed. ``Conflict`` (``session_busy``) while one of
        its tasks is pending or running: stop it first."""
        return await self._send(_Calls.delete_session(session_id))

    async def fork_session(self, session_id: str, *, at_seq: int | None = None, title: str | None = None,
                           metadata: dict[str, Any] | None = None, workspace: api.ForkWorkspace | str = "shared",
                           idempotency_key: str | None = None) -> api.Session:
        """A new session whose events are copies of this one's up to ``at_seq`` (default: the newest outside a
        running task); its next task's runtime is given that conversation. ``workspace``: ``"shared"`` (the same
        directory) or ``"new"`` (an empty one of its own); ``title``, ``metadata``: default the session's own.
        ``InvalidRequest`` ``fork_inside_task`` when ``at_seq`` falls inside a task (``.details``: ``task_id``,
        ``started_seq``, ``ended_seq``, ``fork_before``), ``fork_past_end`` past the newest event."""
        return await self._send(_Calls.fork_session(session_id, at_seq, title, metadata, workspace,
                                                    idempotency_key))

    async def start_task(self, session_id: str, prompt: str, *, permission_mode: str | None = None,
                         runtime_config: dict[str, Any] | None = None, interactive: bool = False,
                         runtime: str | None = None, max_input_tokens: int | None = None,
                         timeout_s: float | None = None, idle_timeout_s: float | None = None,
                         idempotency_key: str | None = None, budget: Budget | None = None) -> api.Task:
        """Start a task. ``runtime``: move the session to another runtime from this task on (it is given the
        session's transcript); ``max_input_tokens``: cap the compiled input below the runtime's own budget;
        ``timeout_s`` / ``idle_timeout_s``: its deadlines in seconds (None: the service's default), past which it
        is stopped and fails ``TASK_TIMEOUT`` (one above the service's maximum is refused: ``InvalidRequest``)."""
        return await self._send(_Calls.start_task(session_id, prompt, permission_mode, runtime_config, interactive,
                                                  runtime, max_input_tokens, timeout_s, idle_timeout_s,
                                                  idempotency_key, budget))

    async def get_task(self, task_id: str) -> api.Task:
        return await self._send(_Calls.get_task(task_id))

    async def stop_task(self, task_id: str, reason: str | None = None, *,
                        idempotency_key: str | None = None) -> api.StoppedTask:
        """Stop the task; returns it with its ``receipt`` once it has ended (its runtime may take its whole grace,
        up to a minute: this call waits longer than the client's timeout)."""
        return await self._send(_Calls.stop_task(task_id, reason, idempotency_key))

    async def send_input(self, task_id: str, text: TaskInputText, *, input_id: str | None = None,
                         idempotency_key: str | None = None) -> api.TaskInput:
        """Add a message to the running task (steering): its ``delivery`` says whether the runtime takes it into
        the running turn (``mid_turn``) or queues it for the next (``queued``). ``text``: a string, or text/code
        blocks. Conflict unless the task is running."""
        return await self._send(_Calls.send_input(task_id, text, input_id, idempotency_key))

    async def events(self, session_id: str, *, after_seq: int = 0, limit: int = 500) -> list[NormalizedEvent]:
        """One page of the session's stored events after ``after_seq``."""
        return await self._send(_Calls.events(session_id, after_seq, limit))

    async def approvals(self, state: str = "pending") -> list[api.Approval]:
        """Tool calls waiting for a human (interactive tasks), or decided ones with ``state``."""
        return await self._send(_Calls.approvals(state))

    async def decide(self, approval_id: str, *, allow: bool, reason: str = "", scope: str = "once",
                     pattern: Pattern | None = None, input: Mapping[str, Any] | None = None,
                     idempotency_key: str | None = None) -> api.Approval:
        """Approve or deny a pending call; final (a second decision is a Conflict). ``scope`` ``task``,
        ``session`` or ``rule`` (with ``pattern``) also makes a grant for the calls it covers; ``input``: run the
        call with this input instead (an allow only)."""
        return await self._send(_Calls.decide(approval_id, allow, reason, idempotency_key, scope, pattern, input))

    async def decide_many(self, decisions: Sequence[Decision], *,
                          idempotency_key: str | None = None) -> list[api.DecisionResult]:
        """Decide several approvals in one request (parallel calls): each applied on its own, answered with its own
        ``status`` (200, 404, 409, 422) in the order given."""
        return await self._send(_Calls.decide_many(decisions, idempotency_key))

    async def grants(self, session_id: str) -> list[api.Grant]:
        """The session's grants, active and revoked, oldest first."""
        return await self._send(_Calls.grants(session_id))

    async def revoke_grant(self, session_id: str, grant_id: str) -> api.Grant:
        """Revoke a grant: it decides nothing from now on. ``NotFound``; ``Conflict`` if already revoked."""
        return await self._send(_Calls.revoke_grant(session_id, grant_id))

    async def answer(self, event: NormalizedEvent, *, allow: bool, reason: str = "") -> api.Approval:
        """Decide the approval an ``approval.requested`` event (from ``stream``/``run``) asks for."""
        return await self.decide(_approval_id(event), allow=allow, reason=reason)

    async def questions(self, state: str = "pending") -> list[api.AskedQuestion]:
        """Runtimes' questions waiting for an answer (interactive tasks), or settled ones with ``state``."""
        return await self._send(_Calls.questions(state))

    async def question(self, question_id: str) -> api.AskedQuestion:
        return await self._send(_Calls.question(question_id))

    async def answer_question(self, question_id: str, answers: Mapping[str, Any] | None = None, *,
                              decline: bool = False, reason: str = "",
                              idempotency_key: str | None = None) -> api.AskedQuestion:
        """Answer a pending question (answers keyed by question id), or decline it; final (a second answer is a
        Conflict, a bad answer an InvalidRequest naming the field)."""
        return await self._send(_Calls.answer_question(question_id, answers, decline, reason, idempotency_key))

    async def reply(self, event: NormalizedEvent, answers: Mapping[str, Any] | None = None, *,
                    decline: bool = False, reason: str = "") -> api.AskedQuestion:
        """Answer the question a ``question.requested`` event (from ``stream``/``run``) asks."""
        return await self.answer_question(_question_id(event), answers, decline=decline, reason=reason)

    async def me(self) -> api.Me:
        """Who this token is: its name, whether it is the admin, and the namespaces a tenant's is bound to."""
        return await self._send(_Calls.me())

    async def namespaces(self) -> list[api.NamespaceInfo]:
        """The namespaces this token sees, with their session counts (the admin: every one)."""
        return await self._send(_Calls.namespaces())

    async def runtimes(self, namespace: str | None = None) -> list[RuntimeOffer]:
        """What ``namespace``'s worker can run (default: the token's own namespace): each runtime's name, version,
        capabilities (the ``runtime_config`` keys it takes among them) and whether it is available now."""
        return await self._send(_Calls.runtimes(namespace))

    async def auth_status(self, namespace: str, runtime: str) -> api.LoginState:
        """Whether ``runtime`` is logged in for ``namespace``, and how to log it in (never a secret)."""
        return await self._send(_Calls.auth_status(namespace, runtime))

    async def runtime_env(self, namespace: str, *, session_id: str | None = None) -> api.RuntimeEnvView:
        """What ``namespace``'s worker runs with: its HOME and XDG folders, the names of its variables (never a
        value), its uid, and per runtime what it would load on its own — project files looked for in
        ``session_id``'s workspace if given. The namespace's own token or the admin's."""
        return await self._send(_Calls.runtime_env(namespace, session_id))

    async def namespace_env(self, namespace: str) -> list[api.EnvVariable]:
        """The namespace's stored variables as names and fingerprints (admin token); values are never returned."""
        return await self._send(_Calls.namespace_env(namespace))

    async def update_namespace_env(self, namespace: str, *, set: dict[str, str] | None = None,
                                   unset: list[str] | None = None) -> list[api.EnvVariable]:
        """Set and remove variables of a namespace (admin token); its next worker has them."""
        return await self._send(_Calls.update_namespace_env(namespace, set, unset))

    async def session_budget(self, session_id: str) -> api.SessionBudgetView:
        """The session's budget: limits, what it spent, and ``paused`` (what it reached) while a raise is pending."""
        return await self._send(_Calls.session_budget(session_id))

    async def set_session_budget(self, session_id: str, limits: Budget) -> api.SessionBudgetView:
        """Replace the session's limits (``{"tokens": N, "cost_usd": X, "tool_calls": N}``); a paused session stays
        paused (``raise_budget`` ends a pause). ``InvalidRequest`` naming the field for a bad limit."""
        return await self._send(_Calls.set_session_budget(session_id, limits))

    async def raise_budget(self, session_id: str, limits: Budget | None = None, *, continue_: bool = False,
                           task_budget: Budget | None = None, prompt: str | None = None,
                           idempotency_key: str | None = None) -> api.RaisedBudget:
        """Raise a session paused at its budget (``limits`` replace its own, kind by kind); ``continue_``: start a
        task at once that goes on with the work (``.task``). ``Conflict`` ``budget_not_paused`` when it is not
        paused."""
        return await self._send(_Calls.raise_budget(session_id, limits, continue_, task_budget, prompt,
                                                    idempotency_key))

    async def namespace_budget(self, namespace: str) -> api.NamespaceBudget:
        """A namespace's monthly budget and what it spent this month, UTC (admin token)."""
        return await self._send(_Calls.namespace_budget(namespace))

    async def set_namespace_budget(self, namespace: str, monthly_usd: float | None) -> api.NamespaceBudget:
        """Set a namespace's monthly budget in USD (``None``: none), admin token. Once spent, new tasks there are
        refused with ``PaymentRequired`` until the month (UTC) ends."""
        return await self._send(_Calls.set_namespace_budget(namespace, monthly_usd))

    async def namespace_egress(self, namespace: str) -> api.NamespaceEgress:
        """The hosts ``http.fetch`` may reach for a namespace: the operator's, and its own narrowing (admin token)."""
        return await self._send(_Calls.namespace_egress(namespace))

    async def set_namespace_egress(self, namespace: str, hosts: list[str] | None) -> api.NamespaceEgress:
        """Narrow the operator's ``http.fetch`` hosts for a namespace (admin token): ``[]`` allows none, ``None``
        drops its own list. A pattern wider than the operator's is refused (422 ``invalid_pattern``)."""
        return await self._send(_Calls.set_namespace_egress(namespace, hosts))

    async def workers(self) -> list[api.WorkerState]:
        """Every namespace's worker state, recent crashes and quarantine (admin token)."""
        return await self._send(_Calls.workers())

    async def lift_quarantine(self, namespace: str) -> bool:
        """Let a quarantined namespace start workers again now (admin token); False if it was not quarantined."""
        return await self._send(_Calls.lift_quarantine(namespace))

    async def transcript(self, session_id: str) -> api.Transcript:
        """The conversation derived from the session's events: its messages, each with its content blocks."""
        return await self._send(_Calls.transcript(session_id))

    async def create_webhook(self, url: str, kinds: Sequence[str], *, namespace: str | None = None,
                             description: str = "", idempotency_key: str | None = None) -> api.WebhookCreated:
        """Register an endpoint for these kinds (``*``: all); the answer holds its ``whsec_…`` secret, shown once.
        A host the operator does not allow is ``InvalidRequest`` (422) naming what to allow (docs/webhooks.md)."""
        return await self._send(_Calls.create_webhook(url, kinds, namespace, description, idempotency_key))

    async def webhooks(self) -> list[api.Webhook]:
        """The webhooks this token sees."""
        return await self._send(_Calls.webhooks())

    async def webhook(self, webhook_id: str) -> api.Webhook:
        return await self._send(_Calls.webhook(webhook_id))

    async def delete_webhook(self, webhook_id: str) -> None:
        """Remove a webhook, and its deliveries not yet sent."""
        await self._send(_Calls.delete_webhook(webhook_id))

    async def rotate_webhook_secret(self, webhook_id: str, *, end_overlap: bool = False) -> api.RotatedSecret:
        """A new secret; the previous one still signs beside it until ``previous_valid_until``. ``Conflict``
        (``rotation_overlaps``) while an earlier rotation's overlap runs, unless ``end_overlap``: the secret it
        rotated out then stops signing at once."""
        return await self._send(_Calls.rotate_webhook_secret(webhook_id, end_overlap))

    async def test_webhook(self, webhook_id: str) -> api.Delivery:
        """Send a ``webhook.test`` delivery; follow it with ``delivery``."""
        return await self._send(_Calls.test_webhook(webhook_id))

    async def deliveries(self, webhook_id: str, state: str | None = None) -> list[api.Delivery]:
        """A webhook's 100 newest deliveries, newest first (``state``: pending, delivered or dead); older ones
        through ``list_deliveries``."""
        return await self._send(_Calls.deliveries(webhook_id, state))

    async def list_deliveries(self, webhook_id: str, *, state: str | None = None, before: str | None = None,
                              limit: int | None = None) -> api.DeliveryList:
        """One page of a webhook's deliveries, newest first (at most ``limit``, default 100); while ``has_more``,
        the next page is ``before=page.next_before``."""
        return await self._send(_Calls.list_deliveries(webhook_id, state, before, limit))

    async def delivery(self, webhook_id: str, delivery_id: str) -> api.Delivery:
        """One delivery with its attempts."""
        return await self._send(_Calls.delivery(webhook_id, delivery_id))

    async def redeliver(self, webhook_id: str, delivery_id: str) -> api.Delivery:
        """Send a delivery again now, with the same id."""
        return await self._send(_Calls.redeliver(webhook_id, delivery_id))

    async def bundle(self, session_id: str, into: IO[bytes]) -> int:
        """Write the session's support bundle (a .tar.gz, secrets redacted) to ``into``; returns its size."""
        return await self._save(f"/v1/sessions/{_q(session_id)}/bundle", into)

    async def download(self, session_id: str, ref: str, into: IO[bytes]) -> int:
        """Write a blob the session's events name (a ``*_ref`` value: a tool's result, a compiled input, a raw
        message) to ``into``, as it streams in; returns its size. ``NotFound`` if the session names no such blob."""
        return await self._save(_blob_path(session_id, ref), into)

    async def _save(self, path: str, into: IO[bytes]) -> int:
        written = 0
        try:
            async with self._http.stream("GET", path, timeout=httpx.Timeout(30.0, read=None)) as response:
                if response.status_code >= 400:
                    await response.aread()
                    _raise_for(response)
                async for chunk in response.aiter_bytes():
                    into.write(chunk)
                    written += len(chunk)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise ServiceUnreachable(self._where, exc) from exc
        return written

    async def stream(self, session_id: str, *, after_seq: int = 0, until_terminal: bool = False,
                     task_id: str | None = None) -> AsyncIterator[NormalizedEvent]:
        """The session's events after ``after_seq``, live; resumes by Last-Event-ID when the connection drops, or
        when the service ends the stream early (its store failing: an ``error`` frame says so), a little later each
        time. ``ApiError`` (``stream_lost``, or the service's last error) once ``MAX_RECONNECTS`` + 1 connections in a
        row brought nothing new. ``task_id``: only that task's events, and (``until_terminal``) up to its own end."""
        follow = _Follow(session_id, after_seq, until_terminal, task_id)
        while (delay := follow.next_connection()) is not None:
            await anyio.sleep(delay)
            params, headers = follow.request()
            try:
                async with self._http.stream("GET", f"/v1/sessions/{_q(session_id)}/events/stream", params=params,
                                             headers=headers, timeout=httpx.Timeout(30.0, read=None)) as response:
                    if response.status_code >= 400:
                        await response.aread()
                        _raise_for(response)
                    async for line in response.aiter_lines():
                        if (event := follow.line(line)) is not None:
                            yield event
                if follow.finished:
                    return
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                follow.unreachable(self._where, exc)
            except (httpx.TransportError, httpx.StreamError):
                pass
        raise follow.lost()

    def run(self, session_id: str, prompt: str, *, approver: EventApprover | None = None,
            answerer: EventAnswerer | None = None,
            **task_args: Any) -> TaskRun:
        """Start a task: ``async for`` its events as they are stored, up to its terminal event; then ``.task`` is
        the task as it ended, with its ``result`` (final answer, tool calls, usage). ``await client.run(…).wait()``
        runs it to its end and returns that.

        With ``approver`` the task is interactive: each ``approval.requested`` is yielded, then answered with
        what ``approver`` returns (an approval that expired or was decided elsewhere meanwhile is left be). With
        ``answerer`` too: each ``question.requested`` is yielded, then answered with its reply.
        """
        return TaskRun(self, session_id, prompt, approver, task_args, answerer)


class TaskRun:
    """A task ``AsyncClient.run`` starts: its events (``async for``, once), then ``task``, with its result."""

    def __init__(self, client: AsyncClient, session_id: str, prompt: str, approver: EventApprover | None,
                 task_args: dict[str, Any], answerer: EventAnswerer | None = None) -> None:
        self._client, self._session_id, self._prompt = client, session_id, prompt
        self._approver, self._task_args, self._answerer = approver, task_args, answerer
        #: The task as it ended, with its ``result``: set once its events are all read.
        self.task: api.Task | None = None

    def __aiter__(self) -> AsyncIterator[NormalizedEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[NormalizedEvent]:
        client, approver, task_args = self._client, self._approver, dict(self._task_args)
        answerer = self._answerer
        before = (await client.get_session(self._session_id)).last_seq
        if approver is not None or answerer is not None:
            task_args["interactive"] = True
        task = await client.start_task(self._session_id, self._prompt, **task_args)
        # this task's events only: starting it may first end a task left running there (a namespace taken over
        # from a supervisor that is gone), whose end is not this one's
        async for event in client.stream(self._session_id, after_seq=before, until_terminal=True,
                                         task_id=task.task_id):
            yield event
            if approver is not None and event.type == EventType.APPROVAL_REQUESTED:
                given = await self._unless_settled(event, partial(approver, event))
                if given is not None:
                    decision = _as_decision(given)
                    try:
                        await client.decide(_approval_id(event), allow=decision.allow, reason=decision.reason,
                                            scope=decision.scope, pattern=decision.pattern, input=decision.input)
                    except Conflict:
                        pass
            if answerer is not None and event.type == EventType.QUESTION_REQUESTED \
                    and _asks_someone(event):
                replied = await self._unless_settled(event, partial(answerer, event))
                if replied is not None:
                    reply = _as_reply(replied)
                    try:
                        await client.reply(event, reply.answers, decline=reply.decline, reason=reply.reason)
                    except Conflict:
                        pass  # answered elsewhere, or expired, meanwhile
        self.task = await client.get_task(task.task_id)

    async def _unless_settled(self, asked: NormalizedEvent, ask: Callable[[], Awaitable[T]]) -> T | None:
        """What ``ask`` (a person, asked about ``asked``) returns — unless the request is settled first (decided
        or answered elsewhere, expired, its task ended): then ``ask`` is cancelled and this is None. Whether it is,
        is asked of the service meanwhile, less often as the wait grows (at most every ``SETTLED_POLL_MAX_S``); the
        settling events stay for the main stream to yield."""
        given: list[T] = []
        async with anyio.create_task_group() as race:
            async def asking() -> None:
                given.append(await ask())
                race.cancel_scope.cancel()

            async def watching() -> None:
                delay = 0.25
                while True:
                    await anyio.sleep(delay)
                    delay = min(delay * 2, SETTLED_POLL_MAX_S)
                    try:
                        if await self._settled(asked):
                            race.cancel_scope.cancel()
                            return
                    except ApiError:
                        pass  # the service is away for now: the person's answer may still end the wait

            race.start_soon(asking)
            race.start_soon(watching)
        return given[0] if given else None

    async def _settled(self, asked: NormalizedEvent) -> bool:
        """Whether the approval or question ``asked`` requested is no longer waiting."""
        payload = asked.payload
        if isinstance(payload, QuestionRequested):
            return (await self._client.question(payload.question_id)).state != QuestionState.PENDING
        if isinstance(payload, ApprovalRequested):
            return all(a.approval_id != payload.approval_id for a in await self._client.approvals("pending"))
        return False

    async def wait(self) -> api.Task:
        """Run it to its end (its events read and dropped); the task as it ended, with its result."""
        async for _ in self:
            pass
        assert self.task is not None
        return self.task


class BlockingTaskRun:
    """A task ``Client.run`` starts: its events (``for``, once), then ``task``, with its result."""

    def __init__(self, client: Client, session_id: str, prompt: str,
                 approver: Callable[[NormalizedEvent], Answer] | None, task_args: dict[str, Any],
                 answerer: Callable[[NormalizedEvent], Reply] | None = None) -> None:
        self._client, self._session_id, self._prompt = client, session_id, prompt
        self._approver, self._task_args, self._answerer = approver, task_args, answerer
        #: The task as it ended, with its ``result``: set once its events are all read.
        self.task: api.Task | None = None

    def __iter__(self) -> Iterator[NormalizedEvent]:
        client, approver, task_args = self._client, self._approver, dict(self._task_args)
        answerer = self._answerer
        before = client.get_session(self._session_id).last_seq
        if approver is not None or answerer is not None:
            task_args["interactive"] = True
        task = client.start_task(self._session_id, self._prompt, **task_args)
        for event in client.stream(self._session_id, after_seq=before, until_terminal=True, task_id=task.task_id):
            yield event
            if approver is not None and event.type == EventType.APPROVAL_REQUESTED:
                decision = _as_decision(approver(event))
                try:
                    client.decide(_approval_id(event), allow=decision.allow, reason=decision.reason,
                                  scope=decision.scope, pattern=decision.pattern, input=decision.input)
                except Conflict:
                    pass
            if answerer is not None and event.type == EventType.QUESTION_REQUESTED and _asks_someone(event):
                reply = _as_reply(answerer(event))
                try:
                    client.reply(event, reply.answers, decline=reply.decline, reason=reply.reason)
                except Conflict:
                    pass
        self.task = client.get_task(task.task_id)

    def wait(self) -> api.Task:
        """Run it to its end; the task as it ended, with its result."""
        for _ in self:
            pass
        assert self.task is not None
        return self.task


class Client:
    """The same API, blocking (for scripts and tests without an event loop): every method ``AsyncClient`` has."""

    def __init__(self, *, socket: str | Path | None = None, base_url: str | None = None, token: str,
                 timeout_s: float = 30.0) -> None:
        transport_args, url = _transport_args(socket, base_url)
        self._where = f"unix:{socket}" if socket is not None else url
        self._socket = Path(socket) if socket is not None else None
        self._http = httpx.Client(transport=httpx.HTTPTransport(**transport_args), base_url=url,
                                  headers={"Authorization": f"Bearer {token}"}, timeout=timeout_s)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _reachable(self) -> None:
        if self._socket is not None and not self._socket.exists():  # httpx's blocking transport leaks the socket
            raise ServiceUnreachable(self._where, FileNotFoundError(f"no such socket: {self._socket}"))

    def _send(self, call: _Call[T]) -> T:
        self._reachable()
        retry = _Retry()
        while True:
            try:
                response = self._http.request(call.method, call.path, json=call.json, params=call.params,
                                              headers=call.headers(), timeout=call.timeout or httpx.USE_CLIENT_DEFAULT)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                raise ServiceUnreachable(self._where, exc) from exc
            except _BROKEN as exc:
                if (wait := retry.after_break()) is None:
                    raise ServiceUnreachable(self._where, exc) from exc
                time.sleep(wait)
                continue
            if (wait := retry.after_answer(response)) is None:
                break
            time.sleep(wait)
        _raise_for(response)
        answer = response.json() if response.content else None  # 204: no body
        try:
            return call.read(answer)
        except ValidationError as exc:
            raise _unexpected(call, answer, exc) from exc

    def create_session(self, *, namespace: str = "default", runtime: str | None = None,
                       metadata: dict[str, Any] | None = None, workspace: str | Path | None = None,
                       title: str | None = None, idempotency_key: str | None = None,
                       isolation: api.IsolationLevel | str | None = None,
                       budget: Budget | None = None) -> api.Session:
        """As ``AsyncClient.create_session``."""
        return self._send(_Calls.create_session(namespace, runtime, metadata, workspace, idempotency_key, title,
                                                isolation, budget))

    def list_sessions(self, *, namespace: str | None = None, runtime: str | None = None, after: str | None = None,
                      limit: int | None = None, offset: int | None = None,
                      state: api.SessionFilter | str | None = None, q: str | None = None) -> api.SessionList:
        return self._send(_Calls.list_sessions(namespace, runtime, after, limit, offset, state, q))

    def get_session(self, session_id: str) -> api.Session:
        return self._send(_Calls.get_session(session_id))

    def update_session(self, session_id: str, *, title: str | None = None, archived: bool | None = None,
                       metadata: dict[str, Any] | None = None) -> api.Session:
        return self._send(_Calls.update_session(session_id, title, archived, metadata))

    def archive(self, session_id: str) -> api.Session:
        return self._send(_Calls.update_session(session_id, None, True, None))

    def unarchive(self, session_id: str) -> api.Session:
        return self._send(_Calls.update_session(session_id, None, False, None))

    def delete_session(self, session_id: str) -> api.DeletedSession:
        return self._send(_Calls.delete_session(session_id))

    def fork_session(self, session_id: str, *, at_seq: int | None = None, title: str | None = None,
                     metadata: dict[str, Any] | None = None, workspace: api.ForkWorkspace | str = "shared",
                     idempotency_key: str | None = None) -> api.Session:
        return self._send(_Calls.fork_session(session_id, at_seq, title, metadata, workspace, idempotency_key))

    def start_task(self, session_id: str, prompt: str, *, permission_mode: str | None = None,
                   runtime_config: dict[str, Any] | None = None, interactive: bool = False,
                   runtime: str | None = None, max_input_tokens: int | None = None,
                   timeout_s: float | None = None, idle_timeout_s: float | None = None,
                   idempotency_key: str | None = None, budget: Budget | None = None) -> api.Task:
        return self._send(_Calls.start_task(session_id, prompt, permission_mode, runtime_config, interactive, runtime,
                                            max_input_tokens, timeout_s, idle_timeout_s, idempotency_key, budget))

    def get_task(self, task_id: str) -> api.Task:
        return self._send(_Calls.get_task(task_id))

    def stop_task(self, task_id: str, reason: str | None = None, *,
                  idempotency_key: str | None = None) -> api.StoppedTask:
        return self._send(_Calls.stop_task(task_id, reason, idempotency_key))

    def send_input(self, task_id: str, text: TaskInputText, *, input_id: str | None = None,
                   idempotency_key: str | None = None) -> api.TaskInput:
        """Add a message to the running task (steering); see ``AsyncClient.send_input``."""
        return self._send(_Calls.send_input(task_id, text, input_id, idempotency_key))

    def events(self, session_id: str, *, after_seq: int = 0, limit: int = 500) -> list[NormalizedEvent]:
        return self._send(_Calls.events(session_id, after_seq, limit))

    def approvals(self, state: str = "pending") -> list[api.Approval]:
        return self._send(_Calls.approvals(state))

    def decide(self, approval_id: str, *, allow: bool, reason: str = "", scope: str = "once",
               pattern: Pattern | None = None, input: Mapping[str, Any] | None = None,
               idempotency_key: str | None = None) -> api.Approval:
        return self._send(_Calls.decide(approval_id, allow, reason, idempotency_key, scope, pattern, input))

    def decide_many(self, decisions: Sequence[Decision], *,
                    idempotency_key: str | None = None) -> list[api.DecisionResult]:
        return self._send(_Calls.decide_many(decisions, idempotency_key))

    def grants(self, session_id: str) -> list[api.Grant]:
        return self._send(_Calls.grants(session_id))

    def revoke_grant(self, session_id: str, grant_id: str) -> api.Grant:
        return self._send(_Calls.revoke_grant(session_id, grant_id))

    def answer(self, event: NormalizedEvent, *, allow: bool, reason: str = "") -> api.Approval:
        """Decide the approval an ``approval.requested`` event asks for."""
        return self.decide(_approval_id(event), allow=allow, reason=reason)

    def questions(self, state: str = "pending") -> list[api.AskedQuestion]:
        return self._send(_Calls.questions(state))

    def question(self, question_id: str) -> api.AskedQuestion:
        return self._send(_Calls.question(question_id))

    def answer_question(self, question_id: str, answers: Mapping[str, Any] | None = None, *, decline: bool = False,
                        reason: str = "", idempotency_key: str | None = None) -> api.AskedQuestion:
        return self._send(_Calls.answer_question(question_id, answers, decline, reason, idempotency_key))

    def reply(self, event: NormalizedEvent, answers: Mapping[str, Any] | None = None, *, decline: bool = False,
              reason: str = "") -> api.AskedQuestion:
        """Answer the question a ``question.requested`` event asks."""
        return self.answer_question(_question_id(event), answers, decline=decline, reason=reason)

    def me(self) -> api.Me:
        return self._send(_Calls.me())

    def namespaces(self) -> list[api.NamespaceInfo]:
        return self._send(_Calls.namespaces())

    def runtimes(self, namespace: str | None = None) -> list[RuntimeOffer]:
        return self._send(_Calls.runtimes(namespace))

    def auth_status(self, namespace: str, runtime: str) -> api.LoginState:
        return self._send(_Calls.auth_status(namespace, runtime))

    def runtime_env(self, namespace: str, *, session_id: str | None = None) -> api.RuntimeEnvView:
        return self._send(_Calls.runtime_env(namespace, session_id))

    def namespace_env(self, namespace: str) -> list[api.EnvVariable]:
        return self._send(_Calls.namespace_env(namespace))

    def update_namespace_env(self, namespace: str, *, set: dict[str, str] | None = None,
                             unset: list[str] | None = None) -> list[api.EnvVariable]:
        return self._send(_Calls.update_namespace_env(namespace, set, unset))

    def session_budget(self, session_id: str) -> api.SessionBudgetView:
        return self._send(_Calls.session_budget(session_id))

    def set_session_budget(self, session_id: str, limits: Budget) -> api.SessionBudgetView:
        return self._send(_Calls.set_session_budget(session_id, limits))

    def raise_budget(self, session_id: str, limits: Budget | None = None, *, continue_: bool = False,
                     task_budget: Budget | None = None, prompt: str | None = None,
                     idempotency_key: str | None = None) -> api.RaisedBudget:
        """As ``AsyncClient.raise_budget``."""
        return self._send(_Calls.raise_budget(session_id, limits, continue_, task_budget, prompt, idempotency_key))

    def namespace_budget(self, namespace: str) -> api.NamespaceBudget:
        return self._send(_Calls.namespace_budget(namespace))

    def set_namespace_budget(self, namespace: str, monthly_usd: float | None) -> api.NamespaceBudget:
        return self._send(_Calls.set_namespace_budget(namespace, monthly_usd))

    def namespace_egress(self, namespace: str) -> api.NamespaceEgress:
        return self._send(_Calls.namespace_egress(namespace))

    def set_namespace_egress(self, namespace: str, hosts: list[str] | None) -> api.NamespaceEgress:
        return self._send(_Calls.set_namespace_egress(namespace, hosts))

    def workers(self) -> list[api.WorkerState]:
        return self._send(_Calls.workers())

    def lift_quarantine(self, namespace: str) -> bool:
        return self._send(_Calls.lift_quarantine(namespace))

    def create_webhook(self, url: str, kinds: Sequence[str], *, namespace: str | None = None,
                       description: str = "", idempotency_key: str | None = None) -> api.WebhookCreated:
        return self._send(_Calls.create_webhook(url, kinds, namespace, description, idempotency_key))

    def webhooks(self) -> list[api.Webhook]:
        return self._send(_Calls.webhooks())

    def webhook(self, webhook_id: str) -> api.Webhook:
        return self._send(_Calls.webhook(webhook_id))

    def delete_webhook(self, webhook_id: str) -> None:
        self._send(_Calls.delete_webhook(webhook_id))

    def rotate_webhook_secret(self, webhook_id: str, *, end_overlap: bool = False) -> api.RotatedSecret:
        return self._send(_Calls.rotate_webhook_secret(webhook_id, end_overlap))

    def test_webhook(self, webhook_id: str) -> api.Delivery:
        return self._send(_Calls.test_webhook(webhook_id))

    def deliveries(self, webhook_id: str, state: str | None = None) -> list[api.Delivery]:
        return self._send(_Calls.deliveries(webhook_id, state))

    def list_deliveries(self, webhook_id: str, *, state: str | None = None, before: str | None = None,
                        limit: int | None = None) -> api.DeliveryList:
        return self._send(_Calls.list_deliveries(webhook_id, state, before, limit))

    def delivery(self, webhook_id: str, delivery_id: str) -> api.Delivery:
        return self._send(_Calls.delivery(webhook_id, delivery_id))

    def redeliver(self, webhook_id: str, delivery_id: str) -> api.Delivery:
        return self._send(_Calls.redeliver(webhook_id, delivery_id))

    def transcript(self, session_id: str) -> api.Transcript:
        return self._send(_Calls.transcript(session_id))

    def bundle(self, session_id: str, into: IO[bytes]) -> int:
        """Write the session's support bundle (a .tar.gz, secrets redacted) to ``into``; returns its size."""
        return self._save(f"/v1/sessions/{_q(session_id)}/bundle", into)

    def download(self, session_id: str, ref: str, into: IO[bytes]) -> int:
        """As ``AsyncClient.download``: a blob the session's events name, written to ``into``."""
        return self._save(_blob_path(session_id, ref), into)

    def _save(self, path: str, into: IO[bytes]) -> int:
        self._reachable()
        written = 0
        try:
            with self._http.stream("GET", path, timeout=httpx.Timeout(30.0, read=None)) as response:
                if response.status_code >= 400:
                    response.read()
                    _raise_for(response)
                for chunk in response.iter_bytes():
                    into.write(chunk)
                    written += len(chunk)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise ServiceUnreachable(self._where, exc) from exc
        return written

    def stream(self, session_id: str, *, after_seq: int = 0, until_terminal: bool = False,
               task_id: str | None = None) -> Iterator[NormalizedEvent]:
        """As ``AsyncClient.stream``: resumes where it left off when the connection drops or the service ends it."""
        self._reachable()
        follow = _Follow(session_id, after_seq, until_terminal, task_id)
        while (delay := follow.next_connection()) is not None:
            time.sleep(delay)
            params, headers = follow.request()
            try:
                with self._http.stream("GET", f"/v1/sessions/{_q(session_id)}/events/stream", params=params,
                                       headers=headers, timeout=httpx.Timeout(30.0, read=None)) as response:
                    if response.status_code >= 400:
                        response.read()
                        _raise_for(response)
                    for line in response.iter_lines():
                        if (event := follow.line(line)) is not None:
                            yield event
                if follow.finished:
                    return
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                follow.unreachable(self._where, exc)
            except (httpx.TransportError, httpx.StreamError):
                pass
        raise follow.lost()

    def run(self, session_id: str, prompt: str, *, approver: Callable[[NormalizedEvent], Answer] | None
            = None, answerer: Callable[[NormalizedEvent], Reply] | None = None,
            **task_args: Any) -> BlockingTaskRun:
        """As ``AsyncClient.run``: start a task; ``for`` its events up to its terminal event, then ``.task`` (or
        ``.wait()``); ``approver`` / ``answerer`` (plain functions here) answer each ``approval.requested`` /
        ``question.requested``."""
        return BlockingTaskRun(self, session_id, prompt, approver, task_args, answerer)
