"""``codesdk acp``'s connection: line-delimited JSON-RPC on stdin/stdout, each request served through the service's
API (``codesdk.client.AsyncClient``), under one trio nursery.

One reader (stdin: requests, notifications, the client's answers to our requests), one writer (stdout, fed by a
bounded channel: nothing else ever writes there), and a task per request (a prompt lasts its whole turn, while
``session/cancel`` and permission answers keep arriving). What is said is ``translate``'s; this module moves it.
A dropped connection leaves the service's tasks running: the sessions are the service's, and another connection
takes them up (``session/load``, or ``session/resume`` with ``_meta.codesdk.afterSeq``).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeGuard

import trio

from codesdk.client import ApiError, AsyncClient, ServiceUnreachable
from codesdk.protocol import (
    ApprovalRequested,
    BadFrame,
    LineFramer,
    NormalizedEvent,
    QuestionReply,
    QuestionRequested,
    Role,
    ToolCallRequested,
    UsageReported,
    api,
    decode_json,
    encode_message,
)

from . import translate as acp
from .translate import AcpError, ErrorCode

log = logging.getLogger("codesdk.acp")

#: Messages waiting for the writer: a client that stops reading slows the service's stream, never grows a queue.
OUTBOX_SIZE = 256
#: Events read per page when a session is replayed (``session/load``).
REPLAY_PAGE = 500
#: Bytes read from stdin at a time.
READ_SIZE = 65536
#: What a model name may be (the runtime checks it again): letters, digits and . _ : / @ + -, not starting with -.
_MODEL_NAME = re.compile(r"[A-Za-z0-9_.:/@+][A-Za-z0-9_.:/@+-]{0,199}")


@dataclass
class SessionState:
    """What this connection knows of one session: the choices its next prompt runs with, and the prompt running."""

    session_id: str
    runtime: str
    #: The session's workspace (tool calls' relative paths are shown inside it), when known.
    workspace: str | None = None
    mode: str = "ask"
    runtime_config: dict[str, Any] = field(default_factory=dict)
    runtimes: tuple[str, ...] = ()
    #: The runtimes that take a ``model``: each one's default (None: it does not say) and the models it names; and
    #: the model chosen for the next prompts (None: the runtime's default).
    models: dict[str, tuple[str | None, tuple[str, ...]]] = field(default_factory=dict)
    model: str | None = None
    #: Each runtime's context window in tokens, where it declares one (``usage_update``'s size).
    context_windows: dict[str, int] = field(default_factory=dict)
    #: A prompt of this connection runs: its task (None until its first event names it; ``started`` then), and
    #: whether the client asked to stop it.
    prompting: bool = False
    task_id: str | None = None
    started: trio.Event = field(default_factory=trio.Event)
    cancel: trio.Event = field(default_factory=trio.Event)
    #: A task started elsewhere (another connection, the API) whose events this connection streams.
    following: str | None = None

    def options(self) -> list[dict[str, Any]]:
        default, known = self.models.get(self.runtime, (None, ()))
        return acp.config_options(self.mode, self.runtime, self.runtimes, self.model, default,
                                  self.runtime in self.models, known)


@dataclass(frozen=True)
class Defaults:
    """How sessions are made when the client says nothing in ``_meta``."""

    #: None: the token is bound to several namespaces and none was named; ``unnamed`` says so.
    namespace: str | None = "default"
    unnamed: str = ""
    runtime: str | None = None
    #: The client's ``cwd`` becomes the session's workspace (an embedded supervisor, or an admin token); else the
    #: service gives the session one of its own.
    cwd_workspace: bool = False
    needs_token: bool = False


class Connection:
    """One ACP client on stdio."""

    def __init__(self, client: AsyncClient, defaults: Defaults, send: trio.MemorySendChannel[bytes]) -> None:
        self.client = client
        self.defaults = defaults
        self._send = send
        self._sessions: dict[str, SessionState] = {}
        self._next_id = 0
        self._waiting: dict[int, tuple[trio.Event, list[Any]]] = {}
        #: The client takes forms (``elicitation/create``): runtimes' questions are put to it; else they wait for
        #: an answer over the API, and the operator's fallback at their expiry.
        self.elicits = False
        #: ``initialize`` was answered: until then, it is the only request served.
        self.initialized = False
        self._nursery: trio.Nursery | None = None
        #: The agent's methods (ACP's ``agentMethods`` this agent serves); any other is -32601.
        self._handlers: dict[str, Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]] = {
            "initialize": self.initialize, "authenticate": self.authenticate, "session/new": self.new_session,
            "session/load": self.load_session, "session/resume": self.resume_session,
            "session/list": self.list_sessions, "session/set_config_option": self.set_config_option,
            "session/prompt": self.prompt}

    # -- the wire ------------------------------------------------------------------------------------

    async def write(self, message: dict[str, Any]) -> None:
        await self._send.send(encode_message({"jsonrpc": "2.0", **message}))

    async def notify(self, method: str, params: dict[str, Any]) -> None:
        await self.write({"method": method, "params": params})

    async def request(self, method: str, params: dict[str, Any]) -> Any:
        """Ask the client; its result (``AcpError`` for its error answer)."""
        self._next_id += 1
        request_id = self._next_id
        done, answer = trio.Event(), list[dict[str, Any]]()
        self._waiting[request_id] = (done, answer)
        try:
            await self.write({"id": request_id, "method": method, "params": params})
            await done.wait()
        except trio.Cancelled:  # settled elsewhere (the API, an expiry, the task's end): the client may stop asking
            self._cancel_request(request_id)
            raise
        finally:
            self._waiting.pop(request_id, None)
        message = answer[0]
        if "error" in message:
            error = message["error"] if isinstance(message["error"], dict) else {}
            code = error.get("code")
            raise AcpError(code if isinstance(code, int) and not isinstance(code, bool) else ErrorCode.INTERNAL_ERROR,
                           str(error.get("message", ""))[:2000])
        return message.get("result")

    def _cancel_request(self, request_id: int) -> None:
        """``$/cancel_request`` for one of our requests nobody waits for any more; dropped if the writer is full or
        gone (the client's late answer is dropped either way)."""
        line = encode_message({"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": request_id}})
        try:
            self._send.send_nowait(line)
        except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
            pass

    async def serve(self, receive: trio.abc.ReceiveStream) -> None:
        """Read stdin until it ends; each request is served in a task of its own."""
        framer = LineFramer()
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            while data := await receive.receive_some(READ_SIZE):
                for line in framer.feed(data):
                    await self._take(line, nursery)
            for line in framer.close():
                await self._take(line, nursery)
            nursery.cancel_scope.cancel()  # the client is gone: its prompts' tasks go on in the service

    async def _take(self, line: bytes | BadFrame, nursery: trio.Nursery) -> None:
        value = decode_json(line) if isinstance(line, bytes) else line
        if isinstance(value, BadFrame):
            await self.write({"id": value.id, "error": {"code": ErrorCode.PARSE_ERROR, "message": value.detail}})
            return
        if not isinstance(value, dict) or value.get("jsonrpc") != "2.0":
            await self._invalid(None, "expected a JSON-RPC 2.0 object")
            return
        method, request_id = value.get("method"), value.get("id")
        if not is_request_id(request_id):
            await self._invalid(None, "id must be a string, an integer or null")
            return
        if method is None:
            if "id" in value and ("result" in value) != ("error" in value):  # an answer to one of our requests
                waiting = self._waiting.get(request_id) if isinstance(request_id, int) else None
                if waiting is not None:
                    waiting[1].append(value)
                    waiting[0].set()
            else:
                await self._invalid(request_id, "a request needs a method; an answer an id and either result or "
                                    "error")
            return
        given = value.get("params")
        params: dict[str, Any] = given if isinstance(given, dict) else {}
        if not isinstance(method, str):
            await self._invalid(request_id, "method must be a string")
        elif "id" not in value:
            await self._notification(method, params)
        elif method == "initialize":  # served before the next line is read: what follows it finds it done
            await self._answer(request_id, method, params)
        else:
            nursery.start_soon(self._answer, request_id, method, params)

    async def _invalid(self, request_id: str | int | None, message: str) -> None:
        await self.write({"id": request_id, "error": {"code": ErrorCode.INVALID_REQUEST, "message": message}})

    async def _answer(self, request_id: Any, method: str, params: dict[str, Any]) -> None:
        try:
            handler = self._handlers.get(method)
            if handler is None:
                raise AcpError(ErrorCode.METHOD_NOT_FOUND, f"codesdk acp does not serve {method}")
            if not self.initialized and method != "initialize":
                raise AcpError(ErrorCode.INVALID_REQUEST, f"{method} before initialize: a connection starts with "
                               "initialize (protocolVersion 1), then its other requests")
            try:
                result = await handler(params)
            except ExceptionGroup as group:  # the client's task groups: a refusal inside one is still a refusal
                raise _leaf(group) from group
        except AcpError as exc:
            await self.write({"id": request_id, "error": exc.to_json()})
        except ServiceUnreachable as exc:
            await self.write({"id": request_id, "error": {"code": ErrorCode.INTERNAL_ERROR,
                                                          "message": f"the service is unreachable: {exc.message}"}})
        except ApiError as exc:
            error = acp.error_for_status(exc.status, exc.code, exc.message)
            await self.write({"id": request_id, "error": error.to_json()})
        except Exception as exc:  # a fault of ours: this request fails, the connection and its other requests go on
            log.exception("%s failed", method)
            await self.write({"id": request_id, "error": {
                "code": ErrorCode.INTERNAL_ERROR, "message": f"codesdk acp failed to serve {method}: "
                f"{type(exc).__name__}; run it with -v to see why (on its stderr)"}})
        else:
            await self.write({"id": request_id, "result": result})

    async def _notification(self, method: str, params: dict[str, Any]) -> None:
        if method == "session/cancel":
            state = self._sessions.get(str(params.get("sessionId")))
            if state is not None and state.prompting:
                state.cancel.set()
            elif state is not None and state.following and self._nursery is not None:
                self._nursery.start_soon(self._stop, state.following)
        else:
            log.debug("notification %s ignored", method)

    # -- the agent's methods ---------------------------------------------------------------------------

    async def initialize(self, params: dict[str, Any]) -> dict[str, Any]:
        if acp.requested_version(params.get("protocolVersion")) is None:
            raise AcpError(ErrorCode.INVALID_PARAMS, "protocolVersion must be an integer (1)")
        capabilities = params.get("clientCapabilities")
        elicitation = capabilities.get("elicitation") if isinstance(capabilities, dict) else None
        self.elicits = isinstance(elicitation, dict) and isinstance(elicitation.get("form"), dict)
        self.initialized = True
        return acp.initialize_result(needs_token=self.defaults.needs_token)

    async def authenticate(self, params: dict[str, Any]) -> dict[str, Any]:
        if params.get("methodId") != acp.AUTH_METHOD_ID:
            raise AcpError(ErrorCode.INVALID_PARAMS, f"unknown methodId; the one method is {acp.AUTH_METHOD_ID!r}")
        await self.client.namespaces()  # the token is the one given on the command line: check it now
        return {}

    async def new_session(self, params: dict[str, Any]) -> dict[str, Any]:
        cwd = _cwd(params)
        meta = _meta(params)
        runtime = _str(meta, "runtime") or self.defaults.runtime
        namespace = _str(meta, "namespace") or self.defaults.namespace
        if namespace is None:
            raise AcpError(ErrorCode.INVALID_PARAMS, self.defaults.unnamed)
        if params.get("mcpServers"):
            log.warning("the client's MCP servers are not used: a session's tools are CodeSDK's")
        session = await self.client.create_session(
            namespace=namespace, runtime=runtime, title=_str(meta, "title"),
            workspace=cwd if self.defaults.cwd_workspace else None)
        state = await self._adopt(session, meta)
        return {"sessionId": session.session_id, "configOptions": state.options(),
                "_meta": {acp.META_KEY: {"namespace": session.namespace, "workspace": session.workspace,
                                         "lastSeq": session.last_seq}}}

    async def load_session(self, params: dict[str, Any]) -> dict[str, Any]:
        session = await self._session(params)
        state = await self._adopt(session, _meta(params))
        last = await self._replay(state, 0)
        self._follow_later(state, session, last)
        return {"configOptions": state.options(),
                "_meta": {acp.META_KEY: {"lastSeq": last, "activeTaskId": session.active_task_id}}}

    async def resume_session(self, params: dict[str, Any]) -> dict[str, Any]:
        """Take the session up without its history — or, given ``_meta.codesdk.afterSeq`` (the last seq this
        client saw, from any update's ``_meta``), with the updates it missed since."""
        session = await self._session(params)
        meta = _meta(params)
        state = await self._adopt(session, meta)
        after = meta.get("afterSeq")
        last = session.last_seq
        if isinstance(after, int) and not isinstance(after, bool) and after >= 0:
            last = await self._replay(state, after)
        self._follow_later(state, session, last)
        return {"configOptions": state.options(),
                "_meta": {acp.META_KEY: {"lastSeq": last, "activeTaskId": session.active_task_id}}}

    async def list_sessions(self, params: dict[str, Any]) -> dict[str, Any]:
        cursor = params.get("cursor") if isinstance(params.get("cursor"), str) else None
        cwd = params.get("cwd") if isinstance(params.get("cwd"), str) else None
        page = await self.client.list_sessions(after=cursor, limit=100)
        sessions = [acp.session_info(s) for s in page.sessions if cwd is None or s.workspace == cwd]
        result: dict[str, Any] = {"sessions": sessions}
        if page.has_more and page.next_after:
            result["nextCursor"] = page.next_after
        return result

    async def set_config_option(self, params: dict[str, Any]) -> dict[str, Any]:
        state = await self._known(params)
        config_id, value = params.get("configId"), params.get("value")
        if config_id == "mode" and isinstance(value, str) and value in {m for m, _, _ in acp.PERMISSION_MODES}:
            state.mode = str(value)
        elif config_id == "runtime" and isinstance(value, str) and value in (state.runtime, *state.runtimes):
            if value != state.runtime:
                state.model = None  # a model is one runtime's word
            state.runtime = value
        elif config_id == "model" and state.runtime in state.models and isinstance(value, str) \
                and _MODEL_NAME.fullmatch(value):
            state.model = None if value == acp.DEFAULT_MODEL else value
        else:
            raise AcpError(ErrorCode.INVALID_PARAMS, f"no such option or value: {config_id!r} = {value!r} (see the "
                           "session's configOptions)")
        return {"configOptions": state.options()}

    async def prompt(self, params: dict[str, Any]) -> dict[str, Any]:
        state = await self._known(params)
        text = acp.prompt_text(params.get("prompt"))
        if state.prompting:
            raise AcpError(ErrorCode.INVALID_PARAMS, "this session's previous prompt is still running: cancel it "
                           "(session/cancel) or wait for its answer")
        config = {**state.runtime_config, **({"model": state.model} if state.model else {}),
                  **_object(_meta(params), "runtimeConfig")}
        state.prompting, state.task_id = True, None
        state.started, state.cancel = trio.Event(), trio.Event()
        outcome: list[dict[str, Any] | Exception] = []
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._stop_on_cancel, state)
                try:
                    outcome.append(await self._run(state, text, config))
                except (AcpError, ApiError) as exc:  # answered as the request's error, outside the nursery
                    outcome.append(exc)
                nursery.cancel_scope.cancel()
        finally:
            state.prompting = False
        if isinstance(outcome[0], Exception):
            raise outcome[0]
        return outcome[0]

    # -- prompts ----------------------------------------------------------------------------------------

    async def _run(self, state: SessionState, text: str, config: Mapping[str, Any]) -> dict[str, Any]:
        inputs: dict[str, dict[str, Any] | None] = {}
        usage: list[UsageReported] = []

        async def approve(event: NormalizedEvent) -> api.DecisionRequest:
            payload = event.payload
            tool_input = inputs.get(getattr(payload, "tool_call_id", ""))
            try:
                answer = await self.request("session/request_permission",
                                            acp.permission_request(state.session_id, event, tool_input,
                                                                    state.workspace))
            except AcpError as exc:
                answer = {"error": exc.message}
            decision = acp.decision_of(answer)
            return api.DecisionRequest(allow=decision.allow, reason=decision.reason, scope=decision.scope)

        async def answer(event: NormalizedEvent) -> QuestionReply:
            questions = event.payload.questions if isinstance(event.payload, QuestionRequested) else ()
            try:
                given = await self.request("elicitation/create", acp.elicitation_request(state.session_id, event))
            except AcpError as exc:
                given = {"action": "cancel", "error": exc.message}
            return acp.reply_of(given, questions)

        run = self.client.run(state.session_id, text, approver=approve, answerer=answer if self.elicits else None,
                              permission_mode=state.mode, runtime_config=dict(config) or None,
                              runtime=state.runtime)
        terminal: NormalizedEvent | None = None
        async for event in run:
            if state.task_id is None and event.trace.task_id:
                state.task_id = event.trace.task_id
                state.started.set()
            if isinstance(event.payload, ToolCallRequested):
                inputs[event.payload.tool_call_id] = event.payload.input
            if isinstance(event.payload, UsageReported):
                usage.append(event.payload)
            for update in acp.event_updates(event, replay=False, workspace=state.workspace,
                                                 context_window=state.context_windows.get(state.runtime)):
                await self.notify("session/update", {"sessionId": state.session_id, "update": update})
            if acp.is_terminal(event):
                terminal = event
        if terminal is None:
            raise AcpError(ErrorCode.INTERNAL_ERROR, "the task's events ended without its end")
        return acp.prompt_result(terminal, usage)

    async def _stop_on_cancel(self, state: SessionState) -> None:
        """``session/cancel`` stops the prompt's task (its answer is ``cancelled``, with the stop's receipt)."""
        await state.cancel.wait()
        await state.started.wait()  # a cancel before the task's first event stops it once it has an id
        assert state.task_id is not None
        await self._stop(state.task_id)  # its receipt comes with task.stopped, which ends the prompt

    async def _stop(self, task_id: str) -> None:
        try:
            await self.client.stop_task(task_id, "cancelled by the ACP client")
        except ApiError as exc:
            log.warning("stopping %s: %s", task_id, exc)

    def _follow_later(self, state: SessionState, session: api.Session, after: int) -> None:
        """A task of the session still runs (started by a connection that went away, or over the API): stream the
        rest of it to this client, and put its pending approvals to it, once the answer has gone out."""
        task_id = session.active_task_id
        if task_id is None or state.prompting or state.following or self._nursery is None:
            return
        state.following = task_id
        self._nursery.start_soon(self._follow, state, task_id, after)

    async def _follow(self, state: SessionState, task_id: str, after: int) -> None:
        asked: set[str] = set()

        def ask(nursery: trio.Nursery, pending: list[api.Approval]) -> None:
            for approval in pending:
                if approval.task_id == task_id and approval.approval_id not in asked:
                    asked.add(approval.approval_id)
                    nursery.start_soon(self._ask_pending, state, approval)

        try:
            async with trio.open_nursery() as asking:
                ask(asking, await self.client.approvals("pending"))
                async for event in self.client.stream(state.session_id, after_seq=after, until_terminal=True,
                                                      task_id=task_id):
                    for update in acp.event_updates(event, replay=False, workspace=state.workspace,
                                                    context_window=state.context_windows.get(state.runtime)):
                        await self.notify("session/update", {"sessionId": state.session_id, "update": update})
                    if isinstance(event.payload, ApprovalRequested):
                        ask(asking, await self.client.approvals("pending"))
                    if acp.is_terminal(event):
                        asking.cancel_scope.cancel()  # its approvals are settled with it
        except ApiError as exc:
            log.warning("following %s: %s", task_id, exc)
        except Exception:  # a fault of ours: the following stops, the connection goes on
            log.exception("following %s failed", task_id)
        finally:
            state.following = None

    async def _ask_pending(self, state: SessionState, approval: api.Approval) -> None:
        try:
            answer = await self.request("session/request_permission",
                                        acp.pending_permission_request(state.session_id, approval,
                                                                            state.workspace))
        except AcpError as exc:
            answer = {"error": exc.message}
        decision = acp.decision_of(answer)
        try:
            await self.client.decide(approval.approval_id, allow=decision.allow, reason=decision.reason,
                                     scope=decision.scope)
        except ApiError as exc:  # decided elsewhere, or expired, meanwhile
            log.info("approval %s: %s", approval.approval_id, exc)

    # -- sessions -----------------------------------------------------------------------------------------

    async def _session(self, params: dict[str, Any]) -> api.Session:
        session_id = params.get("sessionId")
        if not isinstance(session_id, str) or not session_id:
            raise AcpError(ErrorCode.INVALID_PARAMS, "sessionId must be a session's id")
        _cwd(params)
        return await self.client.get_session(session_id)

    async def _known(self, params: dict[str, Any]) -> SessionState:
        state = self._sessions.get(str(params.get("sessionId")))
        if state is None:
            raise AcpError(ErrorCode.RESOURCE_NOT_FOUND, "no such session on this connection: create it "
                           "(session/new) or load it (session/load, session/resume) first")
        return state

    async def _adopt(self, session: api.Session, meta: Mapping[str, Any]) -> SessionState:
        state = self._sessions.get(session.session_id) or SessionState(session.session_id, session.runtime,
                                                                        session.workspace)
        mode = meta.get("mode")
        if mode is not None:
            if not isinstance(mode, str) or mode not in {m for m, _, _ in acp.PERMISSION_MODES}:
                raise AcpError(ErrorCode.INVALID_PARAMS, "_meta.codesdk.mode must be ask, auto or yolo")
            state.mode = str(mode)
        if meta.get("runtimeConfig") is not None:
            state.runtime_config = _object(meta, "runtimeConfig")
        if not state.runtimes:
            try:
                offers = await self.client.runtimes(session.namespace)
                state.runtimes = tuple(o.name for o in offers if o.available)
                state.context_windows = {o.name: o.capabilities.context_window_tokens for o in offers
                                         if o.capabilities.context_window_tokens}
                state.models = {o.name: (o.capabilities.default_model, tuple(o.capabilities.models)) for o in offers
                                if "model" in (o.capabilities.config_keys or ())}
            except ApiError as exc:
                log.info("the namespace's runtimes are unknown (%s): only the session's is offered", exc)
        self._sessions[session.session_id] = state
        return state

    async def _replay(self, state: SessionState, after: int) -> int:
        """Send the session's stored events after ``after`` as updates; the last seq sent. From the start, the
        prompts are sent whole (from the transcript)."""
        prompts = None
        if after == 0:
            transcript = await self.client.transcript(state.session_id)
            prompts = acp.PromptTexts([m.text() for m in transcript.messages if m.role == Role.USER])
        while True:
            page = await self.client.events(state.session_id, after_seq=after, limit=REPLAY_PAGE)
            for event in page:
                for update in acp.event_updates(event, replay=True, workspace=state.workspace, prompts=prompts):
                    await self.notify("session/update", {"sessionId": state.session_id, "update": update})
                after = event.seq
            if len(page) < REPLAY_PAGE:
                return after




#: JSON-RPC ids ACP's schema takes (``RequestId``): a string, an int64, or null.
_ID_RANGE = range(-2**63, 2**63)


def is_request_id(value: object) -> TypeGuard[str | int | None]:
    """Whether ``value`` may be a message's ``id`` (a message without one has None here, and is a notification)."""
    return value is None or isinstance(value, str) or (type(value) is int and value in _ID_RANGE)


def _leaf(group: ExceptionGroup[Exception]) -> Exception:
    """The first refusal (ours or the service's) inside an exception group, else the group itself."""
    found: Exception | None = group.split((AcpError, ApiError))[0]
    while isinstance(found, ExceptionGroup):
        found = found.exceptions[0]
    return found if found is not None else group


def _meta(params: Mapping[str, Any]) -> dict[str, Any]:
    meta = params.get("_meta")
    ours = meta.get(acp.META_KEY) if isinstance(meta, dict) else None
    return ours if isinstance(ours, dict) else {}


def _object(meta: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = meta.get(key)
    if value is not None and not isinstance(value, dict):
        raise AcpError(ErrorCode.INVALID_PARAMS, f"_meta.{acp.META_KEY}.{key} must be an object")
    return dict(value or {})


def _str(meta: Mapping[str, Any], key: str) -> str | None:
    value = meta.get(key)
    if value is not None and not isinstance(value, str):
        raise AcpError(ErrorCode.INVALID_PARAMS, f"_meta.{acp.META_KEY}.{key} must be a string")
    return value


def _cwd(params: Mapping[str, Any]) -> str:
    cwd = params.get("cwd")
    if not isinstance(cwd, str) or not cwd.startswith("/"):
        raise AcpError(ErrorCode.INVALID_PARAMS, "cwd must be an absolute path")
    return cwd


async def run_connection(client: AsyncClient, defaults: Defaults, stdin: trio.abc.ReceiveStream,
                         stdout: trio.abc.SendStream) -> None:
    """Serve one ACP client until its stdin ends: one reader, one writer, a task per request."""
    send, receive = trio.open_memory_channel[bytes](OUTBOX_SIZE)
    connection = Connection(client, defaults, send)

    async def write_out() -> None:
        async with receive:
            async for line in receive:
                await stdout.send_all(line)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(write_out)
        async with send:
            await connection.serve(stdin)


