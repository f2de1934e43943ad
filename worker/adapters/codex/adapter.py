"""Codex adapter: the pinned ``codex app-server`` driven over its JSON-RPC stdio protocol, under trio.

One app-server process per task (``RuntimeProcess``: its own process group, stderr tail, ended with the task):
``initialize`` (experimental API: dynamic tools need it) → ``thread/start`` (or ``thread/resume`` of the session's
thread: native resume, the thread id is the runtime session id) → ``turn/start``; the turn's notifications become
normalized events until ``turn/completed``. Stop is ``turn/interrupt``, then the process group after the grace.

Tools: CodeSDK's tools reach the model as Codex's *dynamic tools*; each call arrives as the server's
``item/tool/call`` request, becomes ``tool.call.requested`` and is answered with the supervisor's result or denial
(its reason is what the model reads). Codex's own tools are switched off (``_launch.DISABLED_FEATURES``); an
approval request that still comes (a command, a file change) is put before the supervisor like any call
(``executed_by: runtime``) and never approved by the adapter itself.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
from functools import partial
from pathlib import Path
from typing import Any

import trio

from codesdk.protocol import (
    InputDelivery,
    SendInputParams,
    SteeringSupport,
    BudgetGate,
    AuthModel,
    CancellationModel,
    McpSupport,
    McpTransport,
    PermissionModel,
    ReplaySafety,
    ResumeModel,
    StateModel,
    ToolExecution,
    AuthState,
    AuthStatus,
    BlockKind,
    CancellationSupport,
    ErrorCode,
    EventType,
    ExecutedBy,
    GrantScope,
    InteractionMode,
    IsolationMode,
    ModelOutputCompleted,
    ModelOutputDelta,
    QuestionSource,
    RuntimeCapabilities,
    RuntimeRequestCompleted,
    RuntimeRequestStarted,
    StartTaskParams,
    TaskFailureCode,
    ToolCallCompleted,
    ToolCallRequested,
    ToolCallStarted,
    ToolRouting,
    ToolSpec,
    UsageReported,
    canonical_hash,
)

from .._steering import InputInbox, delivered
from .._questions import AnswersQuestions, PendingQuestions, form_answer
from .._tool_calls import AnswersToolCalls, PendingToolCalls, ToolOutcome, call_identity
from .._api_failures import api_failure, is_unreachable
from .._conversation import hold_conversation
from .._installed import install_hint, runtimes_dir
from ..runtime_process import RuntimeAhead, RuntimeProcess
from .._rpc_peer import METHOD_NOT_FOUND, PeerClosed, PeerError, RpcPeer
from .._tool_names import model_tool_names
from ..base import (
    Availability,
    RuntimeAdapter,
    RuntimeInput,
    StartTaskRefused,
    TaskHandle,
    TaskIO,
    TaskOutcome,
)
from . import home
from .questions import elicitation_questions, user_input_answer, user_input_questions
from .launch import (
    CODEX_CONFIG_KEYS,
    CODEX_VERSION,
    DEFAULT_BASE_URL,
    INITIALIZE_REQUEST_ID,
    BadCodexConfig,
    CodexSettings,
    codex_launch,
    codex_path,
    codex_version,
    prepare_codex_home,
)

log = logging.getLogger("codesdk.worker.codex")

#: Bound on each of the app-server's answers before the turn runs (a fresh CODEX_HOME takes ~0.5 s).
HANDSHAKE_TIMEOUT_S = 60.0
#: After the turn, stdin is closed and app-server gets this long to exit by itself (it takes ~50 ms).
EXIT_GRACE_S = 5.0
#: SIGTERM -> SIGKILL when we end its process group.
TERM_GRACE_S = 1.0
#: Codex's approval requests for its own tools: method -> the tool name recorded for the call.
_APPROVALS = {"item/commandExecution/requestApproval": "commandExecution",
              "item/fileChange/requestApproval": "fileChange", "execCommandApproval": "commandExecution",
              "applyPatchApproval": "fileChange"}
#: The first protocol's approvals, answered with its own ``ReviewDecision`` words (the others: v2's).
_V1_APPROVALS = frozenset({"execCommandApproval", "applyPatchApproval"})


def approval_answer(method: str, allowed: bool) -> dict[str, str]:
    """The answer to one of Codex's approval requests in its protocol's words: v2's ``accept``/``decline``, v1's
    ``approved``/``denied`` (a v2 word to a v1 request would not parse there)."""
    if method in _V1_APPROVALS:
        return {"decision": "approved" if allowed else "denied"}
    return {"decision": "accept" if allowed else "decline"}


class CodexAdapter(RuntimeAdapter):
    name = "codex"

    def __init__(self, ahead: RuntimeAhead | None = None) -> None:
        #: The app-server started ahead of this worker's first task, if asked (``worker._ahead``).
        self.ahead = ahead

    def capabilities(self) -> RuntimeCapabilities:
        return RuntimeCapabilities(
            name=self.name, version=codex_version() or CODEX_VERSION, isolation_modes=(IsolationMode.SUBPROCESS,),
            requires_auth=True, auth_methods=("api_key", "oauth_local"), streaming_text=True,
            streaming_thinking=True, tool_calls=True, parallel_tool_calls=True, tool_routing=(ToolRouting.IN_BAND,),
            builtin_tools=(), builtin_tools_default_enabled=False, permission_prompts=True,
            interaction_modes=tuple(InteractionMode), session_create=True, session_resume=True,
            transcript_input=False, context_window_tokens=272_000, cancellation=CancellationSupport.COOPERATIVE, usage_reporting=True,
            budget_gate=BudgetGate.AFTER_USAGE,  # usage is reported at turn/completed
            cost_reporting=False, default_model=None, config_keys=CODEX_CONFIG_KEYS, auth_model=AuthModel.BOTH,
            tool_execution=ToolExecution.EXTERNAL, permission_model=PermissionModel.CODESDK,
            state_model=StateModel.LOCAL_DISK, resume_model=ResumeModel.NATIVE, tool_replay=ReplaySafety.SAFE_REPLAY,
            mcp_support=McpSupport.CLIENT_ONLY, mcp_transports=(McpTransport.STDIO, McpTransport.HTTP),
            cancellation_model=CancellationModel.BEST_EFFORT,
            steering=SteeringSupport.MID_TURN,  # turn/steer: taken at the running turn's next model request
            user_questions=(QuestionSource.CODEX_USER_INPUT, QuestionSource.MCP_ELICITATION),
            # Never acceptForSession: Codex would then run those commands unasked, unrecorded, and past a revocation
            approval_scopes=(GrantScope.ONCE,))

    def availability(self) -> Availability:
        if codex_path() is None:
            return Availability(False, f"Codex {CODEX_VERSION} is not installed in {runtimes_dir()}: {install_hint()}")
        return Availability(True)

    async def auth_status(self) -> AuthStatus:
        return home.auth_status(os.environ)

    def login_command(self) -> list[str] | None:
        path = codex_path()
        return [str(path), "login", "--device-auth"] if path is not None else None

    def start_task(self, params: StartTaskParams, io: TaskIO) -> TaskHandle:
        binary = codex_path()
        if binary is None:
            raise StartTaskRefused(ErrorCode.RUNTIME_UNAVAILABLE, self.availability().reason or "codex is unavailable")
        if not params.last_user_text():
            raise StartTaskRefused(ErrorCode.INVALID_PARAMS, "startTask needs a user message for codex")
        try:
            settings = CodexSettings.from_config(params.runtime_config)
        except BadCodexConfig as exc:
            raise StartTaskRefused(ErrorCode.INVALID_RUNTIME_CONFIG, str(exc)) from exc
        # Earlier turns live in Codex's own thread, resumed by id while its rollout is there; else they are sent as
        # the first prompt of a new thread.
        given = RuntimeInput.plan(params, lambda thread_id: home.stored_thread(os.environ, thread_id))
        if given.resume_id:
            io.set_runtime_session_id(given.resume_id)
        task = CodexTask(params, io, given, binary, settings, self.ahead)
        task.implicit_sources = self.implicit_sources(task.cwd)
        return task

    def implicit_sources(self, cwd: Path) -> dict[str, Any]:
        return home.implicit_sources(os.environ, cwd)


class CodexTask(AnswersToolCalls, AnswersQuestions, TaskHandle):
    def __init__(self, params: StartTaskParams, io: TaskIO, given: RuntimeInput, binary: Path,
                 settings: CodexSettings, ahead: RuntimeAhead | None = None) -> None:
        self.params = params
        self.ahead = ahead
        self.io = io
        given.apply(self)
        self.prompt = given.text
        self.binary = binary
        self.settings = settings
        self.stop_grace_s = settings.stop_grace_s
        self.cwd = Path(params.workspace) if params.workspace else Path(os.environ.get("HOME", "/"))
        self.by_codex_name: dict[str, ToolSpec] = model_tool_names(params.tool_manifest.tools)
        self.tools = PendingToolCalls()
        self.questions = PendingQuestions("codex-ask")
        self._stop = trio.Event()
        self._stop_reason: str | None = None
        self._thread_id: str | None = given.resume_id
        self._turn_id: str | None = None
        self._turn_started = trio.Event()
        self._model: str | None = settings.model
        #: The model request in flight (Codex reports none: one opens at the turn's start and again at the first
        #: item after a usage report, and closes at each usage report).
        self._request: str | None = None
        self._requests = 0
        self._retries = 0
        self._usage: dict[str, int] = {}
        self._blocks: dict[tuple[str, str], tuple[str, BlockKind, list[str]]] = {}
        self._runtime_calls: dict[str, tuple[str, dict[str, Any]]] = {}
        self._error: dict[str, Any] | None = None
        self._last_text = ""
        self._raw: list[Any] = []
        #: Inputs (steering): received; sent by turn/steer and waiting for their userMessage item (by client id).
        self.inbox = InputInbox()
        self._active = trio.Event()  # the turn has started (turn/started): only then does Codex take a steer
        self._steered: dict[str, SendInputParams] = {}
        self._last_tool_call: str | None = None

    # -- inputs (tool answers: AnswersToolCalls) ----------------------------------------------

    def send_input(self, params: SendInputParams) -> InputDelivery:
        self.inbox.put(params)  # sent by turn/steer once the turn is active (``_steer``)
        return InputDelivery.MID_TURN

    def stop(self, reason: str | None) -> None:
        self._stop_reason = self._stop_reason or reason or "stop requested"  # the first stop says why
        self._stop.set()

    # -- the run --------------------------------------------------------------------------------

    async def run(self) -> TaskOutcome:
        auth = home.auth_status(os.environ)
        if auth.state != AuthState.AUTHENTICATED:  # Codex would try its default provider without credentials
            return TaskOutcome.failure(TaskFailureCode.AUTH_REQUIRED, auth.message)
        prepare_codex_home(os.environ)
        launch = codex_launch(self.binary, self.settings, cwd=str(self.cwd), environ=os.environ)
        started = await self.ahead.take("codex", launch) if self.ahead is not None else None
        async with RuntimeProcess.open(launch.argv, env=launch.env, cwd=launch.cwd, name="Codex",
                                       term_grace_s=TERM_GRACE_S, started=started) as process:
            # The launch opens with initialize: written already to an app-server started ahead, else now.
            peer = RpcPeer(process, self._answer, versioned=False, sent=(INITIALIZE_REQUEST_ID,))
            if started is None:
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    await process.send(launch.opening)  # if it is gone already, its output ends: reported below
            return await hold_conversation(
                process, peer, partial(self._converse, peer), alongside=[partial(self._stop_when_asked, peer), partial(self._steer, peer)],
                exit_grace_s=EXIT_GRACE_S, term_grace_s=TERM_GRACE_S, broke="Codex broke its protocol",
                stopped=self._stopped)

    def _stopped(self) -> TaskOutcome | None:
        return TaskOutcome.stop(self._stop_reason or "stop requested") if self._stop.is_set() else None

    async def _converse(self, peer: RpcPeer) -> TaskOutcome | None:
        """Handshake, thread, turn; then follow the turn to its end. None: Codex's output ended first."""
        try:
            with trio.fail_after(HANDSHAKE_TIMEOUT_S):
                await peer.answer_to(INITIALIZE_REQUEST_ID)  # the launch's opening
                thread = await self._open_thread(peer)
                self._thread_id = str(thread["thread"]["id"])
                self.io.set_runtime_session_id(self._thread_id)
                if thread.get("model"):
                    self._model = str(thread["model"])
                    self.io.set_model(self._model)
                if self._stop.is_set():  # stopped before the turn began: do not begin it
                    return TaskOutcome.stop(self._stop_reason or "stop requested")
                turn = await peer.request("turn/start", {"threadId": self._thread_id,
                                                         "input": [{"type": "text", "text": self.prompt}]})
                self._turn_id = str(turn["turn"]["id"])
                self._turn_started.set()
        except PeerClosed:
            return None
        except PeerError as exc:
            return TaskOutcome.failure(TaskFailureCode.RUNTIME_ERROR, f"Codex refused the task: {exc.message}",
                                       rpc_code=exc.code)
        except trio.TooSlowError:
            return TaskOutcome.failure(TaskFailureCode.RUNTIME_ERROR, "Codex did not answer its handshake within "
                                       f"{HANDSHAKE_TIMEOUT_S:.0f} s", retryable=True)
        except (KeyError, TypeError, ValueError) as exc:  # an answer without the thread or turn it must carry
            return TaskOutcome.failure(TaskFailureCode.PROTOCOL_ERROR, f"Codex answered without its thread or "
                                       f"turn: {type(exc).__name__}: {exc}")
        async for method, params in peer.notifications:
            outcome = await self._handle(method, params)
            if outcome is not None:
                return outcome
        return None

    async def _open_thread(self, peer: RpcPeer) -> dict[str, Any]:
        common: dict[str, Any] = {"cwd": str(self.cwd), "approvalPolicy": "untrusted", "sandbox": "read-only"}
        if self.settings.model:
            common["model"] = self.settings.model
        if self._thread_id:  # native resume: the thread keeps its dynamic tools
            return dict(await peer.request("thread/resume", {"threadId": self._thread_id, **common}))
        tools = [{"type": "function", "name": name, "description": spec.description or spec.name,
                  "inputSchema": dict(spec.input_schema)} for name, spec in self.by_codex_name.items()]
        return dict(await peer.request("thread/start", {**common, "dynamicTools": tools}))

    async def _steer(self, peer: RpcPeer) -> None:
        """Each input into the running turn: ``turn/steer`` with the turn's id, once Codex has said the turn started
        (a steer between turn/start's answer and turn/started is refused, "no active turn"). A refused steer (the
        turn ended, or is not steerable) leaves the input undelivered: the supervisor carries it into the session's
        next task. Delivered, Codex adds a ``userMessage`` item with its client id (``_user_message``)."""
        await self._active.wait()
        sent = 0
        while True:
            await self.inbox.wait(sent + 1)
            for params in self.inbox.take():
                sent += 1
                self._steered[params.input_id] = params
                try:
                    await peer.request("turn/steer", {
                        "threadId": self._thread_id, "expectedTurnId": self._turn_id,
                        "input": [{"type": "text", "text": params.text()}], "clientUserMessageId": params.input_id})
                except PeerError as exc:  # no active turn, another turn, a review/compact turn
                    self._steered.pop(params.input_id, None)
                    log.info("Codex did not take input %s: %s", params.input_id, exc.message)
                except PeerClosed:
                    return

    async def _user_message(self, item: dict[str, Any]) -> None:
        """A steered input in the turn (its client id): delivered, into the request it opens."""
        params = self._steered.pop(str(item.get("clientId") or ""), None)
        if params is None:
            return
        before = self._request or f"{self._turn_id}:{self._requests + 1}"
        await delivered(self.io, [params], before_request_id=before, after_tool_call_id=self._last_tool_call)
        await self._open_request()

    async def _stop_when_asked(self, peer: RpcPeer) -> None:
        """On stop: interrupt the turn; whatever still runs after the grace ends with the process group."""
        await self._stop.wait()
        deadline = trio.current_time() + self.stop_grace_s
        with trio.move_on_at(deadline):
            await self._turn_started.wait()  # a turn being started is interrupted once it is (until the deadline)
            if self._turn_id is not None:
                try:
                    await peer.request("turn/interrupt", {"threadId": self._thread_id, "turnId": self._turn_id})
                except (PeerClosed, PeerError) as exc:  # "no active turn": it ended meanwhile
                    log.info("interrupting Codex: %s", exc)
            await trio.sleep_until(deadline)
        await peer.process.end(TERM_GRACE_S)

    # -- the server's requests ------------------------------------------------------------------

    async def _answer(self, method: str, params: dict[str, Any]) -> Any:
        if method == "item/tool/call":
            return await self._tool_call(params)
        if method in _APPROVALS:
            return await self._approval(method, params)
        if method == "item/tool/requestUserInput":
            return await self._user_input(params)
        if method == "mcpServer/elicitation/request":
            return await self._elicitation(params)
        if method == "item/permissions/requestApproval":
            return await self._permissions(params)
        raise PeerError(METHOD_NOT_FOUND, f"CodeSDK does not serve {method}")

    async def _user_input(self, params: dict[str, Any]) -> dict[str, Any]:
        """The model's ``request_user_input``: its questions are asked; their answers go back as Codex's lists."""
        try:
            questions = user_input_questions(params)
        except ValueError as exc:
            self._raw.append({"method": "item/tool/requestUserInput", "params": params, "codesdk": str(exc)})
            return {"answers": {}}
        return user_input_answer(await self.questions.ask(self.io.emit, QuestionSource.CODEX_USER_INPUT, questions))

    async def _elicitation(self, params: dict[str, Any]) -> dict[str, Any]:
        """An MCP server's form is asked as a question; Codex's own MCP-tool approval (``_meta``) is an approval;
        a URL (the user is to open a page) cannot be shown, so it is declined, the reason kept with the request's
        raw notifications."""
        server = str(params.get("serverName") or "")
        found = params.get("_meta")
        meta: dict[str, Any] = found if isinstance(found, dict) else {}
        if meta.get("codex_approval_kind") == "mcp_tool_call":
            call_id = f"codex-mcp-{canonical_hash(params)[7:19]}"
            tool_input = {"server": server, "message": params.get("message"), **meta}
            outcome = await self._request_call("mcpToolCall", tool_input, call_id, ExecutedBy.RUNTIME)
            return {"action": "decline" if outcome.denied else "accept"}
        if params.get("mode") == "url":
            self._raw.append({"method": "mcpServer/elicitation/request", "params": params,
                              "codesdk": "declined: a URL elicitation asks the user to open a page, which CodeSDK "
                                         "cannot show"})
            return {"action": "decline"}
        try:
            questions = elicitation_questions(params)
        except ValueError as exc:
            self._raw.append({"method": "mcpServer/elicitation/request", "params": params,
                              "codesdk": f"declined: {exc}"})
            return {"action": "decline"}
        return form_answer(await self.questions.ask(self.io.emit, QuestionSource.MCP_ELICITATION, questions,
                                                  str(params.get("message") or ""), server))

    async def _permissions(self, params: dict[str, Any]) -> dict[str, Any]:
        """Codex's ``request_permissions`` wants more access (network, paths) for the turn: an approval the
        supervisor's policy decides like Codex's command approvals. Granted: what it asked for, for the turn;
        denied: nothing (Codex has no decision word: what is left out is denied)."""
        call_id = str(params.get("itemId") or f"codex-{canonical_hash(params)[7:19]}")
        tool_input = {k: v for k, v in params.items() if k in ("permissions", "reason", "cwd", "environmentId")}
        outcome = await self._request_call("requestPermissions", tool_input, call_id, ExecutedBy.RUNTIME)
        granted = params.get("permissions") if not outcome.denied and isinstance(params.get("permissions"), dict) \
            else {}
        return {"permissions": granted, "scope": "turn"}

    async def _tool_call(self, params: dict[str, Any]) -> dict[str, Any]:
        name, call_id = str(params.get("tool", "")), str(params.get("callId", ""))
        arguments = params.get("arguments")
        tool_input: dict[str, Any] = arguments if isinstance(arguments, dict) else {"arguments": arguments}
        spec = self.by_codex_name.get(name)
        if spec is None or not call_id:
            return _tool_answer(f"{name} is not a tool of this task", success=False)
        outcome = await self._request_call(spec.name, tool_input, call_id, ExecutedBy.SUPERVISOR)
        if outcome.denied:
            return _tool_answer(outcome.reason or "denied by policy", success=False)
        result = outcome.result
        text = result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)
        return _tool_answer(text, success=not outcome.is_error)

    async def _approval(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """One of Codex's own tools wants to run: the supervisor decides; approved, Codex runs it."""
        tool = _APPROVALS[method]
        call_id = str(params.get("itemId") or params.get("callId") or f"codex-{canonical_hash(params)[7:19]}")
        tool_input = {k: v for k, v in params.items() if k not in ("threadId", "turnId", "itemId", "callId",
                                                                     "availableDecisions", "startedAtMs")}
        outcome = await self._request_call(tool, tool_input, call_id, ExecutedBy.RUNTIME)
        if outcome.denied:
            return approval_answer(method, allowed=False)
        self._runtime_calls[call_id] = (tool, tool_input)
        await self.io.emit(EventType.TOOL_CALL_STARTED, ToolCallStarted(
            **call_identity(call_id, tool_input), tool_name=tool, executed_by=ExecutedBy.RUNTIME,
            execution_env="runtime:codex"))
        return approval_answer(method, allowed=True)

    async def _request_call(self, tool_name: str, tool_input: dict[str, Any], call_id: str,
                            executed_by: ExecutedBy) -> ToolOutcome:
        self.tools.expect(call_id)
        self._last_tool_call = call_id
        await self.io.emit(EventType.TOOL_CALL_REQUESTED, ToolCallRequested(
            **call_identity(call_id, tool_input), tool_name=tool_name, input=tool_input, executed_by=executed_by))
        return await self.tools.wait(call_id)

    # -- the turn's notifications ---------------------------------------------------------------

    async def _handle(self, method: str, params: dict[str, Any]) -> TaskOutcome | None:
        if params.get("threadId") not in (None, self._thread_id):
            return None  # another thread's (none are started by us)
        self._raw.append({"method": method, "params": params})
        if method == "turn/started":
            if (params.get("turn") or {}).get("id") in (None, self._turn_id):
                self._active.set()
            await self._open_request()
        elif method in ("item/started", "item/completed") and (params.get("item") or {}).get("type") == "userMessage":
            await self._user_message(params.get("item") or {})
        elif method == "item/started":
            if (params.get("item") or {}).get("type") is not None:
                await self._open_request()
        elif method == "item/agentMessage/delta":
            await self._delta((str(params.get("itemId")), "text"), BlockKind.TEXT, params.get("delta"))
        elif method == "item/reasoning/summaryTextDelta":
            await self._delta((str(params.get("itemId")), f"summary:{params.get('summaryIndex', 0)}"),
                              BlockKind.THINKING, params.get("delta"))
        elif method == "item/reasoning/textDelta":
            await self._delta((str(params.get("itemId")), f"content:{params.get('contentIndex', 0)}"),
                              BlockKind.THINKING, params.get("delta"))
        elif method == "item/completed":
            await self._item_completed(params.get("item") or {})
        elif method == "thread/tokenUsage/updated":
            await self._usage_reported(params.get("tokenUsage") or {})
        elif method == "error":
            error = params.get("error") or {}
            if not params.get("willRetry"):
                self._error = error
            else:
                return await self._retrying(error)
        elif method == "warning":
            log.info("Codex: %s", params.get("message"))
        elif method == "turn/completed":
            turn = params.get("turn") or {}
            if turn.get("id") == self._turn_id:
                return await self._turn_completed(turn)
        return None

    async def _retrying(self, error: dict[str, Any]) -> TaskOutcome | None:
        """Codex failed a model request and will try again: that request ends (its stop reason says why) and the
        next attempt is a request of its own, so the stream shows each one; past ``max_retries`` the task fails
        instead of waiting on Codex's schedule."""
        self._retries += 1
        message = str(error.get("message") or "the model request failed")
        if self._retries <= self.settings.retries_allowed:
            await self._close_request(f"error, retrying: {message}"[:500])
            await self._open_request()
            return None
        await self._close_request(f"error: {message}"[:500])
        failed = _failure(error).failed
        assert failed is not None
        code, retryable = failed.code, failed.retryable
        if code == TaskFailureCode.RUNTIME_ERROR:  # Codex's catch-all, on a request it was retrying
            code, retryable = TaskFailureCode.API_ERROR, True
        return TaskOutcome.failure(code, f"the model request failed {self._retries} times; Codex would keep "
                                   f"retrying: {failed.message}"[:2000], retryable, **failed.details)

    async def _open_request(self) -> None:
        if self._request is None:
            self._requests += 1
            self._request = f"{self._turn_id}:{self._requests}"
            await self.io.emit(EventType.RUNTIME_REQUEST_STARTED, RuntimeRequestStarted(
                request_id=self._request, model=self._model))

    async def _close_request(self, stop_reason: str | None) -> None:
        if self._request is not None:
            request, self._request = self._request, None
            raw, self._raw = self._raw, []
            await self.io.emit(EventType.RUNTIME_REQUEST_COMPLETED, RuntimeRequestCompleted(
                request_id=request, stop_reason=stop_reason), raw=raw)

    async def _delta(self, key: tuple[str, str], kind: BlockKind, delta: object) -> None:
        if not isinstance(delta, str) or not delta:
            return
        block = self._blocks.get(key)
        if block is None:
            block = self._blocks[key] = (f"{self.params.task_id}:{self._turn_id}:{':'.join(key)}", kind, [])
        block_id, _, parts = block
        await self.io.emit(EventType.MODEL_OUTPUT_DELTA, ModelOutputDelta(
            block_id=block_id, kind=kind, delta=delta, index=len(parts)))
        parts.append(delta)

    async def _item_completed(self, item: dict[str, Any]) -> None:
        kind, item_id = item.get("type"), str(item.get("id"))
        if kind == "agentMessage":
            text = str(item.get("text") or "")
            await self._complete_block((item_id, "text"), BlockKind.TEXT, text)
            self._last_text = text or self._last_text
        elif kind == "reasoning":
            for index, text in enumerate(item.get("summary") or []):
                await self._complete_block((item_id, f"summary:{index}"), BlockKind.THINKING, str(text))
            for index, text in enumerate(item.get("content") or []):
                await self._complete_block((item_id, f"content:{index}"), BlockKind.THINKING, str(text))
        elif item_id in self._runtime_calls:  # one of Codex's own tools that the supervisor approved
            tool, tool_input = self._runtime_calls.pop(item_id)
            failed = item.get("status") != "completed" or bool(item.get("exitCode"))
            output = item.get("aggregatedOutput") or item.get("changes") or ""
            preview = output if isinstance(output, str) else json.dumps(output, ensure_ascii=False)
            await self.io.emit(EventType.TOOL_CALL_COMPLETED, ToolCallCompleted(
                **call_identity(item_id, tool_input), tool_name=tool, is_error=failed, executed_by=ExecutedBy.RUNTIME,
                execution_env="runtime:codex", result_preview=preview[:500]), raw={"item": item})

    async def _complete_block(self, key: tuple[str, str], kind: BlockKind, text: str) -> None:
        """The block's text is what was streamed; an item that came whole (no deltas) is streamed as one."""
        block = self._blocks.pop(key, None)
        if block is None:
            if not text:
                return
            await self._delta(key, kind, text)
            block = self._blocks.pop(key)
        block_id, block_kind, parts = block
        await self.io.emit(EventType.MODEL_OUTPUT_COMPLETED, ModelOutputCompleted(
            block_id=block_id, kind=block_kind, text="".join(parts)))

    async def _usage_reported(self, token_usage: dict[str, Any]) -> None:
        last = token_usage.get("last") or {}
        for key in ("inputTokens", "cachedInputTokens", "cacheWriteInputTokens", "outputTokens",
                    "reasoningOutputTokens"):
            value = last.get(key)
            if isinstance(value, int):
                self._usage[key] = self._usage.get(key, 0) + value
        await self._close_request(None)

    async def _turn_completed(self, turn: dict[str, Any]) -> TaskOutcome:
        status = turn.get("status")
        await self._close_request(str(status))
        await self.io.emit(EventType.USAGE_REPORTED, UsageReported(
            model=self._model or "codex-default", input_tokens=self._usage.get("inputTokens", 0),
            output_tokens=self._usage.get("outputTokens", 0),
            cache_read_tokens=self._usage.get("cachedInputTokens", 0),
            cache_write_tokens=self._usage.get("cacheWriteInputTokens", 0)), raw={"turn": turn})
        if status == "interrupted" or self._stop.is_set():
            return TaskOutcome.stop(self._stop_reason or "Codex interrupted the turn")
        if status == "failed":
            return _failure(turn.get("error") or self._error or {})
        return TaskOutcome.success("end_turn", self._last_text[-200:])


def _tool_answer(text: str, *, success: bool) -> dict[str, Any]:
    return {"contentItems": [{"type": "inputText", "text": text}], "success": success}


#: ``codexErrorInfo`` values that are not an HTTP status -> (code, retryable).
_CODEX_ERRORS: dict[str, tuple[TaskFailureCode, bool]] = {
    "contextWindowExceeded": (TaskFailureCode.CONTEXT_TOO_LARGE, False),
    "unauthorized": (TaskFailureCode.AUTH_REQUIRED, False),
    "rateLimitExceeded": (TaskFailureCode.RATE_LIMITED, True),
    "usageLimitExceeded": (TaskFailureCode.RATE_LIMITED, False),
    "serverOverloaded": (TaskFailureCode.OVERLOADED, True),
    "internalServerError": (TaskFailureCode.API_ERROR, True),
    "responseStreamDisconnected": (TaskFailureCode.API_ERROR, True),
}


def _failure(error: dict[str, Any]) -> TaskOutcome:
    """A failed turn's error: ``codexErrorInfo`` is a name, or an object naming the failure with an HTTP status."""
    message = str(error.get("message") or "Codex reported an error")
    info = error.get("codexErrorInfo")
    status: int | None = None
    name = info if isinstance(info, str) else next(iter(info), None) if isinstance(info, dict) and info else None
    if isinstance(info, dict) and isinstance(detail := info.get(name), dict):
        found = detail.get("httpStatusCode")
        status = found if isinstance(found, int) else None
    if status is None and name == "other":  # Codex's catch-all: an HTTP status, if any, is only in the message
        found_status = re.search(r"\b(?:status|HTTP)[^0-9]{0,12}([45]\d\d)\b", message)
        status = int(found_status.group(1)) if found_status else None
    base_url = (os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL) if os.environ.get("OPENAI_API_KEY") else None
    if status is not None or is_unreachable(message):
        code, retryable, where = api_failure(status, status is None, base_url)
        message += where
    elif name == "other" and re.search(r"stream (?:closed|disconnected|error)|response\.failed", message, re.IGNORECASE):
        code, retryable = TaskFailureCode.API_ERROR, True
    else:
        code, retryable = _CODEX_ERRORS.get(str(name), (TaskFailureCode.RUNTIME_ERROR, False))
    if code == TaskFailureCode.RUNTIME_ERROR and "Missing environment variable" in message:
        code = TaskFailureCode.AUTH_REQUIRED
    if code == TaskFailureCode.AUTH_REQUIRED:
        message += " — " + home.login_instructions(os.environ)
    return TaskOutcome.failure(code, message[:2000], retryable, codex_error=name, api_error_status=status)

