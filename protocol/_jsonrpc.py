"""JSON-RPC 2.0 message shapes and the worker protocol's methods, params, results and error codes.

Two readers share this module: ``parse_message`` classifies whatever a peer wrote (the supervisor reading a
worker's output), ``parse_request`` applies the rules a request to the worker must follow (§1.4 of
docs/protocol.md). ``METHOD_TABLE`` / ``Rpc`` type each method's params and result for both sides.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum, StrEnum
from typing import Any, Final, Generic, Literal, TypeVar

from pydantic import Field, JsonValue, ValidationError

from ._base import Model
from ._context import ResumeMode
from ._events import AnyWorkerEvent
from ._steering import SendInputParams, SendInputResult
from ._questions import AnswersField
from ._grants import GrantScope
from ._runtime import AuthStatus, InteractionMode, PermissionMode, RuntimeCapabilities, RuntimeEnv
from ._tools import ToolManifest
from ._transcript import Message, Role


class ErrorCode(IntEnum):
    """Standard JSON-RPC codes plus the worker protocol's application codes (-32001..-32099)."""

    PARSE_ERROR = -32700
    INVALID_REQUEST = -32600
    METHOD_NOT_FOUND = -32601
    INVALID_PARAMS = -32602
    INTERNAL_ERROR = -32603
    SERVER_ERROR = -32000  # the worker failed to answer a request (a bug of its own; never expected)
    FRAME_TOO_LARGE = -32001  # the line exceeded the frame limit; it was discarded unread
    NOT_INITIALIZED = -32002  # a method other than runtime.initialize before the handshake
    PROTOCOL_VERSION_MISMATCH = -32003
    UNKNOWN_RUNTIME = -32004
    RUNTIME_UNAVAILABLE = -32005  # the runtime is known but can't run here (binary missing, no auth)
    DUPLICATE_TASK = -32006  # task_id already in use in this worker
    SESSION_BUSY = -32007  # the session already has an active task in this worker
    UNKNOWN_TASK = -32008  # no such task, or it already ended
    UNKNOWN_TOOL_CALL = -32009  # no pending tool call with that id in the task
    SHUTTING_DOWN = -32010  # the worker is shutting down and accepts no new tasks
    INVALID_SCENARIO = -32011  # scripted runtime: scenario missing or malformed
    INVALID_RUNTIME_CONFIG = -32012  # the task's runtime_config is unusable for its runtime (the caller's to fix)
    UNSAFE_WORKSPACE = -32013  # the workspace holds what the runtime would load and obey (the caller's to fix)
    UNKNOWN_QUESTION = -32014  # no pending question with that id in the task


class Method(StrEnum):
    INITIALIZE = "runtime.initialize"
    GET_AUTH_STATUS = "runtime.getAuthStatus"
    ENSURE_LOGIN = "runtime.ensureLogin"
    START_TASK = "runtime.startTask"
    SEND_TOOL_RESULT = "runtime.sendToolResult"
    SEND_TOOL_DENIED = "runtime.sendToolDenied"
    SEND_TOOL_APPROVED = "runtime.sendToolApproved"  # for calls the runtime executes itself
    SEND_INPUT = "runtime.sendInput"  # a user's message into a running task (steering)
    SEND_ANSWER = "runtime.sendAnswer"  # the answer to a runtime's question (question.requested)
    STOP = "runtime.stop"
    SHUTDOWN = "runtime.shutdown"
    PING = "runtime.ping"  # liveness: answered at once by a worker whose loop runs
    DESCRIBE_ENV = "runtime.describeEnv"  # what each runtime would load on its own here (the runtime-env view)
    EVENT = "runtime.event"  # notification, worker -> supervisor


RequestId = int | str


# --- generic messages -----------------------------------------------------------------------------


class Request(Model):
    jsonrpc: Literal["2.0"] = "2.0"
    id: RequestId
    method: str
    params: dict[str, JsonValue] | list[JsonValue] | None = None


class Notification(Model):
    jsonrpc: Literal["2.0"] = "2.0"
    method: str
    params: dict[str, JsonValue] | list[JsonValue] | None = None


class ErrorObject(Model):
    code: int
    message: str
    data: JsonValue = None


class Response(Model):
    jsonrpc: Literal["2.0"] = "2.0"
    id: RequestId
    #: Any JSON: each method's result model reads it (``MethodSpec.parse_result``).
    result: JsonValue = None


class ErrorResponse(Model):
    jsonrpc: Literal["2.0"] = "2.0"
    id: RequestId | None
    error: ErrorObject

    def to_json_obj(self) -> dict[str, Any]:
        obj = super().to_json_obj()
        obj.setdefault("id", None)  # JSON-RPC requires "id": null when the id is unknown
        return obj


JsonRpcMessage = Request | Notification | Response | ErrorResponse


class InvalidMessage(Model):
    """A JSON value that is not a valid JSON-RPC 2.0 message. ``id`` is kept when it could be read."""

    reason: str
    id: RequestId | None = None


def readable_id(obj: object) -> RequestId | None:
    """The id of a (possibly invalid) message, when there is one an answer can carry: an integer (not a boolean)
    or a string of valid text. An error about a message whose id could be read is answered with that id, so
    the peer waiting for it gets its answer; only an unreadable id is answered with ``null``."""
    raw = obj.get("id") if isinstance(obj, dict) else None
    if isinstance(raw, bool) or not isinstance(raw, (int, str)):
        return None
    if isinstance(raw, str):
        try:
            raw.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: it could not be sent back
            return None
    return raw


def parse_message(obj: object) -> JsonRpcMessage | InvalidMessage:
    """Classify one decoded JSON value as a JSON-RPC message. Never raises."""
    if not isinstance(obj, dict):
        return InvalidMessage(reason=f"expected a JSON object, got {type(obj).__name__}")
    msg_id = readable_id(obj)
    if obj.get("jsonrpc") != "2.0":
        return InvalidMessage(reason='"jsonrpc" must be "2.0"', id=msg_id)
    try:
        if "method" in obj:
            return Request.model_validate(obj) if "id" in obj else Notification.model_validate(obj)
        if "error" in obj:
            return ErrorResponse.model_validate(obj)
        if "result" in obj:
            return Response.model_validate(obj)
    except ValidationError as exc:
        return InvalidMessage(reason=_first_error(exc), id=msg_id)
    return InvalidMessage(reason="neither a request, a notification nor a response", id=msg_id)


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(part) for part in err["loc"]) or "message"
    return f"{where}: {err['msg']}"


def error_response(msg_id: RequestId | None, code: ErrorCode | int, message: str,
                   data: JsonValue = None) -> ErrorResponse:
    return ErrorResponse(id=msg_id, error=ErrorObject(code=int(code), message=message, data=data))


# --- a request as the worker reads it -------------------------------------------------------------

#: What a request's ``id`` may be on the way in: JSON-RPC allows a fractional number or null too (they are
#: echoed; drivers must not use them). Booleans, objects and arrays are not ids.
IncomingId = int | float | str | None

_REQUEST_MEMBERS = frozenset({"jsonrpc", "method", "id", "params"})

#: The ``data`` of -32600 for an object that is not a valid request (kept from the worker's first release).
INVALID_REQUEST_DATA = "The request failed schema validation"


@dataclass(frozen=True, slots=True)
class IncomingRequest:
    """A request object that follows §1.4: the method and params are not checked yet (that is the table's job).

    ``params`` is None when the member is absent. Without an ``id`` member the request is a notification: it
    is executed and never answered."""

    method: str
    params: dict[str, JsonValue] | list[JsonValue] | None
    id: IncomingId = None
    notification: bool = False


def parse_request(obj: object) -> IncomingRequest | InvalidMessage:
    """Check one decoded value against the request rules; never raises.

    Exactly the members ``jsonrpc`` ("2.0"), ``method`` (a string), optional ``id`` (string, number or null,
    not a boolean) and optional ``params`` (object or array; null is not allowed). Anything else is an
    InvalidMessage carrying the id when it can be read."""
    if not isinstance(obj, dict):
        return InvalidMessage(reason=f"expected a JSON object, got {type(obj).__name__}")
    reason = _request_problem(obj)
    if reason is not None:
        return InvalidMessage(reason=reason, id=readable_id(obj))
    return IncomingRequest(method=obj["method"], params=obj.get("params"), id=obj.get("id"),
                           notification="id" not in obj)


def _request_problem(obj: dict[str, object]) -> str | None:
    extra = obj.keys() - _REQUEST_MEMBERS
    if extra:
        return f"unexpected member(s): {', '.join(sorted(extra))}"
    if obj.get("jsonrpc") != "2.0" or not isinstance(obj["jsonrpc"], str):
        return '"jsonrpc" must be "2.0"'
    if not isinstance(obj.get("method"), str):
        return '"method" must be a string'
    if "id" in obj and (isinstance(obj["id"], bool) or not isinstance(obj["id"], (int, float, str, type(None)))):
        return '"id" must be a string, a number or null'
    if "params" in obj and not isinstance(obj["params"], (dict, list)):
        return '"params" must be an object or an array'
    return None


def invalid_params_data(exc: ValidationError) -> dict[str, list[dict[str, str]]]:
    """The ``data`` of -32602 for params that failed their model: each error's location, message and type."""
    return {"errors": [{"loc": ".".join(str(part) for part in err["loc"]), "msg": err["msg"], "type": err["type"]}
                       for err in exc.errors(include_url=False)]}


# --- the worker protocol's params and results -----------------------------------------------------


class PeerInfo(Model):
    name: str
    version: str


class InitializeParams(Model):
    protocol_version: str
    supervisor: PeerInfo | None = None
    env: RuntimeEnv | None = None


class RuntimeOffer(Model):
    """One runtime a worker can host."""

    name: str
    version: str
    capabilities: RuntimeCapabilities
    available: bool = True
    unavailable_reason: str | None = None


class InitializeResult(Model):
    protocol_version: str
    worker: PeerInfo
    pid: int
    runtimes: tuple[RuntimeOffer, ...]


class GetAuthStatusParams(Model):
    runtime: str


class EnsureLoginResult(Model):
    """What an operator must do so the runtime can run in this namespace. Never opens a browser."""

    status: AuthStatus
    logged_in: bool
    instructions: str = ""
    #: The runtime's own interactive login, to be run by an operator with the namespace's environment
    #: (``codesdk auth login``); None when the runtime has none.
    login_command: tuple[str, ...] | None = None


class DescribeEnvParams(Model):
    """Where to look for project files: a session's workspace (None: none, only the user's own sources)."""

    cwd: str | None = Field(default=None, min_length=1, max_length=4096)


class ImplicitSource(Model):
    """A file or folder a runtime would read on its own, found where it looks. ``used``: the runtime loads it
    under CodeSDK (else CodeSDK turns it off); never its content, a hash at most."""

    kind: str
    path: str
    used: bool
    sha256: str | None = None


class RuntimeSources(Model):
    """One runtime's implicit sources in a worker's environment, and CodeSDK's policy for them."""

    runtime: str
    policy: str
    found: tuple[ImplicitSource, ...] = ()


class DescribeEnvResult(Model):
    runtimes: tuple[RuntimeSources, ...]


class SessionRef(Model):
    session_id: str = Field(min_length=1, max_length=200)
    runtime_session_id: str | None = None


class TraceContext(Model):
    request_id: str | None = None
    client_id: str | None = None
    user_id: str | None = None


class StartTaskParams(Model):
    runtime: str
    session: SessionRef
    task_id: str = Field(min_length=1, max_length=200)
    #: The session's workspace: where runtime-executed (built-in) tools work. Supervisor tools are confined to
    #: it by the supervisor whatever the runtime does.
    workspace: str | None = None
    messages: tuple[Message, ...] = ()
    tool_manifest: ToolManifest = Field(default_factory=ToolManifest)
    permission_mode: PermissionMode = PermissionMode.ASK
    interaction_mode: InteractionMode = InteractionMode.NON_INTERACTIVE
    runtime_config: dict[str, Any] = Field(default_factory=dict)
    trace: TraceContext = Field(default_factory=TraceContext)

    def last_user_text(self) -> str:
        """The text of the last user message: what the runtime is asked now ("" if there is none)."""
        for message in reversed(self.messages):
            if message.role == Role.USER:
                return message.text()
        return ""


class StartTaskResult(Model):
    accepted: bool = True
    task_id: str
    runtime_session_id: str | None = None
    #: What the runtime would load on its own (settings, memory files, MCP configs, plugins) and what the
    #: adapter did with each — paths and hashes, never contents or secrets. Recorded with model.input.
    implicit_sources: dict[str, Any] | None = None
    #: How the runtime got the session's earlier turns, and the sha256 of exactly what it was sent.
    resume: ResumeMode | None = None
    sent_hash: str | None = None


class SendToolResultParams(Model):
    task_id: str
    tool_call_id: str
    result: Any = None
    is_error: bool = False


class SendToolDeniedParams(Model):
    task_id: str
    tool_call_id: str
    reason: str = "denied"


class SendToolApprovedParams(Model):
    """Approval of a call with ``executed_by: runtime``: the runtime may now run its own tool."""

    task_id: str
    tool_call_id: str
    reason: str = "approved"
    #: How far the approver's answer reaches (``once``: this call). An adapter whose runtime honours it without
    #: losing sight of the calls (Claude's session permission updates: its hook still shows every call) tells it;
    #: the supervisor decides the calls a grant covers by the grant regardless.
    scope: GrantScope = GrantScope.ONCE


class SendAnswerParams(Model):
    """The answer to a runtime's ``question.requested``: answers keyed by question id (checked by the supervisor
    against the question), or a decline with its reason."""

    task_id: str
    question_id: str = Field(min_length=1, max_length=200)
    answers: AnswersField = Field(default_factory=dict)
    declined: bool = False
    reason: str = ""


class StopParams(Model):
    task_id: str
    reason: str | None = None


class Ack(Model):
    ok: bool = True


class RuntimeEventParams(Model):
    """Params of the ``runtime.event`` notification. ``n`` counts a task's events from 1, gap-free.

    ``event`` is the class of its type (narrow with ``params.event.type == EventType.X``)."""

    task_id: str
    n: int = Field(ge=1)
    event: AnyWorkerEvent


class NoParams(Model):
    """Params of a method that takes none (``runtime.shutdown``): sent without a ``params`` member."""


# --- the method table -----------------------------------------------------------------------------

P_co = TypeVar("P_co", bound=Model, covariant=True)
R_co = TypeVar("R_co", bound=Model, covariant=True)


@dataclass(frozen=True, slots=True)
class MethodSpec(Generic[P_co, R_co]):
    """One request of the worker protocol: its name, the model its params validate against, its result's model.

    The worker validates params once, with ``params``; the supervisor sends a ``params`` instance and reads the
    answer as ``result`` (``WorkerConnection.request(Rpc.START_TASK, params) -> StartTaskResult``)."""

    method: Method
    params: type[P_co]
    result: type[R_co]

    @property
    def takes_params(self) -> bool:
        return self.params is not NoParams

    def parse_result(self, value: object) -> R_co:
        """The answer as its model (ValidationError when the peer answered something else)."""
        return self.result.model_validate(value)


class Rpc:
    """The worker protocol's requests, typed. ``runtime.event`` is a notification, not a request: it has none."""

    INITIALIZE: Final = MethodSpec(Method.INITIALIZE, InitializeParams, InitializeResult)
    GET_AUTH_STATUS: Final = MethodSpec(Method.GET_AUTH_STATUS, GetAuthStatusParams, AuthStatus)
    ENSURE_LOGIN: Final = MethodSpec(Method.ENSURE_LOGIN, GetAuthStatusParams, EnsureLoginResult)
    START_TASK: Final = MethodSpec(Method.START_TASK, StartTaskParams, StartTaskResult)
    SEND_TOOL_RESULT: Final = MethodSpec(Method.SEND_TOOL_RESULT, SendToolResultParams, Ack)
    SEND_TOOL_DENIED: Final = MethodSpec(Method.SEND_TOOL_DENIED, SendToolDeniedParams, Ack)
    SEND_TOOL_APPROVED: Final = MethodSpec(Method.SEND_TOOL_APPROVED, SendToolApprovedParams, Ack)
    SEND_INPUT: Final = MethodSpec(Method.SEND_INPUT, SendInputParams, SendInputResult)
    SEND_ANSWER: Final = MethodSpec(Method.SEND_ANSWER, SendAnswerParams, Ack)
    STOP: Final = MethodSpec(Method.STOP, StopParams, Ack)
    SHUTDOWN: Final = MethodSpec(Method.SHUTDOWN, NoParams, Ack)
    PING: Final = MethodSpec(Method.PING, NoParams, Ack)
    DESCRIBE_ENV: Final = MethodSpec(Method.DESCRIBE_ENV, DescribeEnvParams, DescribeEnvResult)


#: Method name -> its spec: every request a worker serves.
METHOD_TABLE: Mapping[str, MethodSpec[Model, Model]] = {
    spec.method.value: spec for spec in vars(Rpc).values() if isinstance(spec, MethodSpec)
}
assert set(METHOD_TABLE) == {m.value for m in Method} - {Method.EVENT.value}
