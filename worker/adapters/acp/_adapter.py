"""The generic Agent Client Protocol adapter: any ACP agent, described by an ``AgentProfile``, driven over its
JSON-RPC stdio under trio.

One agent process per task (``RuntimeProcess``: its own process group, stderr tail, ended with the task):
``initialize`` (protocol version 1; no file system or terminal offered to it) → ``session/new`` with CodeSDK's tools
as an MCP server, or, for the session's next task, ``session/resume`` / ``session/load`` of the agent's own session
(the runtime session id) → ``session/prompt``; the turn's ``session/update`` notifications become normalized events
until the prompt is answered. Stop is ``session/cancel``, then the process group after the grace.

Tools: the agent spawns CodeSDK's MCP bridge (``codesdk.worker.mcp.bridge``), which connects back to this task over a
private unix socket with the task's token. Each ``tools/call`` becomes ``tool.call.requested`` and waits for the
supervisor's result or denial, whose reason the model reads as the tool's error — ACP's own permission answer can
carry no reason, and some agents send no arguments with it. So a permission request for one of CodeSDK's tools is
answered ``allow_once`` here and decided in the bridge, with the arguments the tool really gets. A permission
request for one of the agent's own tools (the profile keeps them hidden; one that slips through) goes before the
supervisor as a call the runtime executes, and is answered by option *kind*, never ``allow_always``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Awaitable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import trio

from codesdk.protocol import (
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
    CancellationSupport,
    ErrorCode,
    EventType,
    ExecutedBy,
    GrantScope,
    InteractionMode,
    IsolationMode,
    RuntimeCapabilities,
    RuntimeRequestCompleted,
    RuntimeRequestStarted,
    StartTaskParams,
    TaskFailureCode,
    ToolCallCompleted,
    ToolCallRequested,
    ToolCallStarted,
    ToolRouting,
    UsageReported,
    canonical_hash,
    utc_now,
)

from codesdk._version import __version__
from .._tool_calls import AnswersToolCalls, PendingToolCalls, ToolOutcome, call_identity
from ...mcp.bridge.endpoint import BridgeAnswer, BridgeCall, BridgeEndpoint, BridgeTool, serve_tools
from .._api_failures import api_failure, is_unreachable
from .._conversation import hold_conversation
from ..runtime_process import RuntimeProcess
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
from ._profile import MCP_SERVER_NAME, AcpSettings, AgentProfile, BadAcpConfig, UnsafeWorkspace, content_text
from ._updates import CHUNK_KINDS, OutputBlocks

log = logging.getLogger("codesdk.worker.acp")

#: The ACP version this adapter speaks.
PROTOCOL_VERSION = 1
#: SIGTERM -> SIGKILL when the agent's process group is ended.
TERM_GRACE_S = 1.0

T = TypeVar("T")


class AcpAdapter(RuntimeAdapter):
    """One ACP agent, as its profile describes it."""

    def __init__(self, profile: AgentProfile) -> None:
        self.profile = profile
        self.name = profile.name

    def capabilities(self) -> RuntimeCapabilities:
        return RuntimeCapabilities(
            name=self.name, version=self.profile.installed_version(os.environ) or self.profile.version,
            context_window_tokens=self.profile.context_window_tokens,
            isolation_modes=(IsolationMode.SUBPROCESS,), requires_auth=True, auth_methods=("api_key", "oauth_local"),
            streaming_text=True, streaming_thinking=True, tool_calls=True,
            parallel_tool_calls=self.profile.parallel_tool_calls,
            max_outstanding_tool_calls=None if self.profile.parallel_tool_calls else 1,
            tool_routing=(ToolRouting.MCP,), builtin_tools=(), builtin_tools_default_enabled=False,
            permission_prompts=True, interaction_modes=tuple(InteractionMode), session_create=True,
            session_resume=True, transcript_input=False, cancellation=CancellationSupport.COOPERATIVE,
            usage_reporting=True, cost_reporting=False, default_model=None,
            budget_gate=BudgetGate.AFTER_USAGE,  # usage comes with a prompt's answer: after the turn
            config_keys=self.profile.config_keys, auth_model=AuthModel.BOTH, tool_execution=ToolExecution.EXTERNAL,
            permission_model=PermissionModel.CODESDK, state_model=StateModel.LOCAL_DISK,
            resume_model=ResumeModel.NATIVE, tool_replay=ReplaySafety.SAFE_REPLAY, mcp_support=McpSupport.CLIENT_ONLY,
            mcp_transports=(McpTransport.STDIO,),  # what ACP has every agent take; http and sse are optional there
            cancellation_model=CancellationModel.BEST_EFFORT,
            # ACP v1 has no way into a running prompt (a second session/prompt would abort Gemini's first): an
            # input is queued (TaskHandle.send_input) and carried into the session's next task
            steering=SteeringSupport.NEXT_TURN,
            # The pinned agents have no elicitation method (ACP's elicitation/create is newer than their SDKs) and
            # session/request_permission carries only allow/reject: no question can travel to the user and back.
            user_questions=(),
            # Never allow_always: the agent would then run that tool unasked, unrecorded, and past a revocation
            approval_scopes=(GrantScope.ONCE,))

    def availability(self) -> Availability:
        refusal = self.profile.refusal(os.environ)
        return Availability(False, refusal) if refusal is not None else Availability(True)

    async def auth_status(self) -> AuthStatus:
        found = self.profile.credentials(os.environ)
        state = AuthState.AUTHENTICATED if found.method else AuthState.UNAUTHENTICATED
        return AuthStatus(runtime=self.name, state=state, method=found.method, checked_at=utc_now(),
                          message=found.message)

    def start_task(self, params: StartTaskParams, io: TaskIO) -> TaskHandle:
        program = self.profile.program(os.environ)
        refusal = self.profile.refusal(os.environ)
        if program is None or refusal is not None:
            raise StartTaskRefused(ErrorCode.RUNTIME_UNAVAILABLE, refusal or self.profile.missing_reason(os.environ))
        if not params.last_user_text():
            raise StartTaskRefused(ErrorCode.INVALID_PARAMS, f"startTask needs a user message for {self.name}")
        try:
            settings = self.profile.settings(params.runtime_config)
        except BadAcpConfig as exc:
            raise StartTaskRefused(ErrorCode.INVALID_RUNTIME_CONFIG, str(exc)) from exc
        cwd = Path(params.workspace) if params.workspace else Path(os.environ.get("HOME", "/"))
        try:
            self.profile.check_workspace(cwd)
        except UnsafeWorkspace as exc:
            raise StartTaskRefused(ErrorCode.UNSAFE_WORKSPACE, str(exc)) from exc
        # Earlier turns live in the agent's own session, taken up by id while the agent has it; else they are sent
        # as the first prompt of a new one.
        given = RuntimeInput.plan(params, lambda session_id: self.profile.stored_session(os.environ, cwd, session_id))
        if given.resume_id:
            io.set_runtime_session_id(given.resume_id)
        if settings.model:
            io.set_model(settings.model)
        task = AcpTask(self.profile, params, io, given, program, settings, cwd)
        task.implicit_sources = self.implicit_sources(cwd)
        return task

    def implicit_sources(self, cwd: Path) -> dict[str, Any]:
        return self.profile.implicit_sources(os.environ, cwd)


class AcpTask(AnswersToolCalls, TaskHandle):
    def __init__(self, profile: AgentProfile, params: StartTaskParams, io: TaskIO, given: RuntimeInput,
                 program: list[str], settings: AcpSettings, cwd: Path) -> None:
        self.profile = profile
        self.params = params
        self.io = io
        given.apply(self)
        self.prompt = given.text
        self.program = program
        self.settings = settings
        self.cwd = cwd
        self.stop_grace_s = settings.stop_grace_s
        self.by_visible = model_tool_names(params.tool_manifest.tools, profile.tool_prefix())
        self.tools = PendingToolCalls()
        self.blocks = OutputBlocks(io, f"{params.task_id}:acp")
        self._stop = trio.Event()
        self._stop_reason: str | None = None
        self._session_id: str | None = given.resume_id
        self._prompting = False
        self._model: str | None = settings.model
        #: Notifications the follower has handled, and an event set at each (see ``_caught_up``).
        self._handled = 0
        self._progress = trio.Event()
        self._following = True
        #: Calls of CodeSDK's tools the agent announced (tool_call, permission request) and no bridge call has
        #: taken yet: (ACP toolCallId, tool, arguments if known), oldest first; and every call id used so far.
        self._announced: list[tuple[str, str, dict[str, Any] | None]] = []
        self._call_ids: set[str] = set()
        self._bridge_calls = 0
        #: Agent-executed calls the supervisor approved: ACP toolCallId -> (tool, input).
        self._runtime_calls: dict[str, tuple[str, dict[str, Any]]] = {}
        self._raw: list[Any] = []

    # -- inputs (tool answers: AnswersToolCalls) ----------------------------------------------

    def stop(self, reason: str | None) -> None:
        self._stop_reason = self._stop_reason or reason or "stop requested"  # the first stop says why
        self._stop.set()

    # -- the run --------------------------------------------------------------------------------

    async def run(self) -> TaskOutcome:
        found = self.profile.credentials(os.environ)
        if found.method is None:
            return TaskOutcome.failure(TaskFailureCode.AUTH_REQUIRED, f"{self.profile.title}: {found.message}")
        try:
            self.profile.prepare(self.settings, os.environ)
        except BadAcpConfig as exc:
            return TaskOutcome.failure(TaskFailureCode.INVALID_RUNTIME_CONFIG, str(exc))
        if self._session_id:
            self.profile.prepare_session_reuse(os.environ, self.cwd, self._session_id)
        launch = self.profile.launch(self.program, self.settings, cwd=str(self.cwd), environ=os.environ)
        tools = [BridgeTool(name=name, description=spec.description or spec.name,
                            input_schema=dict(spec.input_schema)) for name, spec in self.by_visible.items()]
        async with serve_tools(tools, self._bridge_call) as endpoint, RuntimeProcess.open(
                launch.argv, env=launch.env, cwd=launch.cwd, name=self.profile.title,
                term_grace_s=TERM_GRACE_S) as process:
            peer = RpcPeer(process, self._answer, versioned=True)
            return await hold_conversation(
                process, peer, partial(self._converse, peer, endpoint),
                alongside=[partial(self._follow, peer), partial(self._stop_when_asked, peer)],
                exit_grace_s=self.profile.exit_grace_s, term_grace_s=TERM_GRACE_S,
                broke=f"{self.profile.title} broke the Agent Client Protocol", stopped=self._stopped)

    def _stopped(self) -> TaskOutcome | None:
        return TaskOutcome.stop(self._stop_reason or "stop requested") if self._stop.is_set() else None

    async def _converse(self, peer: RpcPeer, endpoint: BridgeEndpoint) -> TaskOutcome | None:
        """Handshake, session, prompt. None: the agent's output ended first."""
        title = self.profile.title
        try:
            with trio.fail_after(self.profile.handshake_timeout_s):
                failure = await self._open_session(peer, endpoint)
            if failure is not None:
                return failure
            await self._caught_up(peer)  # what came before the prompt (a load's replay) is not this turn's output
            if self._stop.is_set():  # stopped before the turn began: do not begin it
                return TaskOutcome.stop(self._stop_reason or "stop requested")
            self._prompting = True
            request_id = f"{self.params.task_id}:prompt"
            await self.io.emit(EventType.RUNTIME_REQUEST_STARTED, RuntimeRequestStarted(request_id=request_id,
                                                                                        model=self._model))
            try:
                answer = await peer.request("session/prompt", {
                    "sessionId": self._session_id, "prompt": [{"type": "text", "text": self.prompt}]})
            except PeerError as exc:
                await self._end_request(peer, request_id, f"error: {exc.message}"[:500])
                return self._failure(exc, peer)
            answer = answer if isinstance(answer, dict) else {}
            stop_reason = str(answer.get("stopReason") or "end_turn")
            await self._end_request(peer, request_id, stop_reason)
            await self._report_usage(answer)
        except PeerClosed:
            return None
        except PeerError as exc:
            return TaskOutcome.failure(TaskFailureCode.RUNTIME_ERROR, f"{title} refused the task: {exc.message}",
                                       rpc_code=exc.code, rpc_data=exc.data, **_stderr_tail(peer))
        except trio.TooSlowError:
            return TaskOutcome.failure(TaskFailureCode.RUNTIME_ERROR, f"{title} did not answer its handshake within "
                                       f"{self.profile.handshake_timeout_s:.0f} s", retryable=True)
        except (KeyError, TypeError, ValueError) as exc:  # an answer without what it must carry
            return TaskOutcome.failure(TaskFailureCode.PROTOCOL_ERROR,
                                       f"{title} answered without its session: {type(exc).__name__}: {exc}")
        if stop_reason == "cancelled" or self._stop.is_set():
            return TaskOutcome.stop(self._stop_reason or f"{title} cancelled the turn")
        return TaskOutcome.success(stop_reason, self.blocks.last_text[-200:])

    async def _open_session(self, peer: RpcPeer, endpoint: BridgeEndpoint) -> TaskOutcome | None:
        """``initialize``, then a new session or the session's own taken up again; a failure if neither can be."""
        title = self.profile.title
        init = await peer.request("initialize", {
            "protocolVersion": PROTOCOL_VERSION,
            "clientCapabilities": {"fs": {"readTextFile": False, "writeTextFile": False}, "terminal": False},
            "clientInfo": {"name": "codesdk", "title": "CodeSDK", "version": __version__}})
        if not isinstance(init, dict) or init.get("protocolVersion") != PROTOCOL_VERSION:
            version = init.get("protocolVersion") if isinstance(init, dict) else None
            return TaskOutcome.failure(TaskFailureCode.PROTOCOL_ERROR, f"{title} speaks ACP version {version!r}; "
                                       f"CodeSDK speaks {PROTOCOL_VERSION}")
        capabilities = init.get("agentCapabilities") or {}
        common = {"cwd": str(self.cwd), "mcpServers": [endpoint.mcp_server(MCP_SERVER_NAME)]}
        if self._session_id is not None:
            taken_up = {"sessionId": self._session_id, **common}
            try:
                if isinstance((capabilities.get("sessionCapabilities") or {}).get("resume"), dict):
                    await peer.request("session/resume", taken_up)
                elif capabilities.get("loadSession"):
                    loaded = await peer.request("session/load", taken_up)
                    await self._past_replay(peer, loaded if isinstance(loaded, dict) else {})
                else:
                    return TaskOutcome.failure(TaskFailureCode.RUNTIME_ERROR, f"{title} cannot take up its session "
                                               f"{self._session_id} again (it offers neither session/resume nor load)")
                return None
            except PeerError as exc:
                # Whatever the agent's reason (it never stored the session, or it refuses the one it stored: a
                # first turn stopped or failed leaves Gemini a transcript it calls an "Invalid session identifier"),
                # the session goes on: a new one, given the session's transcript, takes its place.
                why = ("does not have it any more (or never stored it)"
                       if self.profile.session_never_stored(exc.code, exc.message, exc.data)
                       else f"refused to take it up ({exc.code}: {_inner_message(exc.message)[:200]})")
                log.warning("%s: session %s %s: a new one, given the session's transcript, takes its place; "
                            "model.input says %s", title, self._session_id, why, self.resume)
                self.prompt = RuntimeInput.rebuilt(self.params).text
        session = await peer.request("session/new", common)
        self._session_id = str(session["sessionId"])
        self.io.set_runtime_session_id(self._session_id)
        return None

    async def _past_replay(self, peer: RpcPeer, loaded: dict[str, Any]) -> None:
        """Make sure a load's replay of the session's history is behind us, so none of it is taken for this turn's
        output. An agent may stream the replay after answering ``session/load`` (Gemini does, in one burst of
        writes); the answer to a request sent after the load can only come once the agent has read that request,
        which is after the burst: setting the session's mode to the one it has is such a request, and harmless."""
        mode = (loaded.get("modes") or {}).get("currentModeId") if isinstance(loaded.get("modes"), dict) else None
        if isinstance(mode, str):
            with contextlib.suppress(PeerError):
                await peer.request("session/set_mode", {"sessionId": self._session_id, "modeId": mode})

    async def _end_request(self, peer: RpcPeer, request_id: str, stop_reason: str) -> None:
        """The prompt is answered: handle every update sent before the answer, then close the turn's request."""
        await self._caught_up(peer)
        await self.blocks.close()
        raw, self._raw = self._raw, []
        await self.io.emit(EventType.RUNTIME_REQUEST_COMPLETED, RuntimeRequestCompleted(
            request_id=request_id, stop_reason=stop_reason), raw=raw)

    async def _report_usage(self, answer: dict[str, Any]) -> None:
        usage = answer.get("usage") if isinstance(answer.get("usage"), dict) else None
        quota = ((answer.get("_meta") or {}).get("quota") or {}) if isinstance(answer.get("_meta"), dict) else {}
        tokens: dict[str, int] = {}
        if usage:
            for key, ours in (("inputTokens", "input"), ("outputTokens", "output"),
                              ("cachedReadTokens", "cache_read"), ("cachedWriteTokens", "cache_write")):
                if isinstance(usage.get(key), int):
                    tokens[ours] = usage[key]
        elif isinstance(quota.get("token_count"), dict):
            count = quota["token_count"]
            for key, ours in (("input_tokens", "input"), ("output_tokens", "output")):
                if isinstance(count.get(key), int):
                    tokens[ours] = count[key]
            models = quota.get("model_usage")
            if isinstance(models, list) and models and isinstance(models[0], dict) and models[0].get("model"):
                self._model = self._model or str(models[0]["model"])
        await self.io.emit(EventType.USAGE_REPORTED, UsageReported(
            model=self._model or f"{self.profile.name}-default", input_tokens=tokens.get("input", 0),
            output_tokens=tokens.get("output", 0), cache_read_tokens=tokens.get("cache_read", 0),
            cache_write_tokens=tokens.get("cache_write", 0)), raw={"answer": answer})

    def _failure(self, exc: PeerError, peer: RpcPeer) -> TaskOutcome:
        """The prompt's error answer: the model API's failure when the agent tells its HTTP status."""
        message = _inner_message(exc.message)
        detail = exc.data.get("message") if isinstance(exc.data, dict) else None
        if isinstance(detail, str) and detail.strip() and detail not in message:  # JSON-RPC's place for details
            message = f"{message}: {detail}"
        status = self.profile.http_status(exc.code, exc.message, exc.data)
        code, retryable, where = api_failure(
            status, is_unreachable(f"{exc.message} {json.dumps(exc.data, default=str)}"),
            self.profile.api_base_url(self.settings, os.environ))
        message += where
        if code == TaskFailureCode.AUTH_REQUIRED:
            found = self.profile.credentials(os.environ)
            message += f" — the model API refused this namespace's credentials ({found.message}): " \
                       f"{found.how_to_configure}"
        return TaskOutcome.failure(code, f"{self.profile.title}: {message}"[:2000], retryable, rpc_code=exc.code,
                                   api_error_status=status, **({} if status else _stderr_tail(peer)))

    async def _stop_when_asked(self, peer: RpcPeer) -> None:
        """On stop: cancel the turn (pending permission requests answer ``cancelled`` by themselves); whatever still
        runs after the grace ends with the process group. Before the turn began there is nothing to cancel."""
        await self._stop.wait()
        if self._prompting and self._session_id is not None:
            with trio.move_on_after(self.stop_grace_s):
                try:
                    await peer.notify("session/cancel", {"sessionId": self._session_id})
                except PeerClosed:
                    pass
                await trio.sleep_forever()  # the prompt's answer ("cancelled") ends the conversation first
        await peer.process.end(TERM_GRACE_S)

    # -- the agent's notifications ----------------------------------------------------------------

    async def _follow(self, peer: RpcPeer) -> None:
        """Handle the agent's notifications in order, for the whole conversation (a load's replay may be long:
        nobody reading it would stall the agent)."""
        try:
            async for method, params in peer.notifications:
                if method == "session/update" and params.get("sessionId") in (None, self._session_id):
                    update = params.get("update")
                    if isinstance(update, dict) and self._prompting:
                        self._raw.append(update)
                        await self._update(update)
                else:
                    log.debug("%s sent %s", self.profile.title, method)
                self._handled += 1
                progress, self._progress = self._progress, trio.Event()
                progress.set()
        finally:
            self._following = False
            self._progress.set()

    async def _caught_up(self, peer: RpcPeer) -> None:
        """Wait until every notification the agent sent before now has been handled."""
        target = peer.notified
        while self._handled < target and self._following:
            await self._progress.wait()

    async def _update(self, update: dict[str, Any]) -> None:
        kind = update.get("sessionUpdate")
        if kind in CHUNK_KINDS:
            await self.blocks.chunk(update)
        elif kind in ("tool_call", "tool_call_update"):
            await self.blocks.close()
            await self._tool_update(update)
        elif kind == "plan":
            await self.blocks.close()

    async def _tool_update(self, update: dict[str, Any]) -> None:
        call_id = str(update.get("toolCallId") or "")
        own = self.profile.own_tool(update, self.by_visible)
        if own is not None:
            self._announce(call_id, own, self.profile.tool_arguments(update))
            return
        if update.get("status") in ("completed", "failed") and call_id in self._runtime_calls:
            tool, tool_input = self._runtime_calls.pop(call_id)
            await self.io.emit(EventType.TOOL_CALL_COMPLETED, ToolCallCompleted(
                **call_identity(call_id, tool_input), tool_name=tool, is_error=update.get("status") == "failed",
                executed_by=ExecutedBy.RUNTIME, execution_env=f"runtime:{self.profile.name}",
                result_preview=content_text(update)[:500]), raw={"update": update})

    # -- the agent's requests -------------------------------------------------------------------

    async def _answer(self, method: str, params: dict[str, Any]) -> Any:
        if method == "session/request_permission":
            return await self._permission(params)
        raise PeerError(METHOD_NOT_FOUND, f"CodeSDK does not serve {method}")

    async def _permission(self, params: dict[str, Any]) -> dict[str, Any]:
        found = params.get("toolCall")
        tool_call: dict[str, Any] = found if isinstance(found, dict) else {}
        options = [o for o in params.get("options") or [] if isinstance(o, dict)]
        call_id = str(tool_call.get("toolCallId") or "")
        own = self.profile.own_tool(tool_call, self.by_visible)
        if self._stop.is_set():
            return {"outcome": {"outcome": "cancelled"}}
        if own is not None:  # decided in the bridge, with the arguments the tool gets
            self._announce(call_id, own, self.profile.tool_arguments(tool_call))
            return _choose(options, "allow_once")
        tool = str(tool_call.get("title") or tool_call.get("kind") or "tool")
        tool_input = self.profile.tool_arguments(tool_call) or {}
        call_id = self._fresh_id(call_id or f"{self.params.task_id}-runtime-{canonical_hash(tool_call)[7:19]}")
        outcome = await self._until_stopped(self._request_call(tool, tool_input, call_id, ExecutedBy.RUNTIME))
        if outcome is None:
            return {"outcome": {"outcome": "cancelled"}}
        if outcome.denied:
            return _choose(options, "reject_once")
        self._runtime_calls[call_id] = (tool, tool_input)
        await self.io.emit(EventType.TOOL_CALL_STARTED, ToolCallStarted(
            **call_identity(call_id, tool_input), tool_name=tool, executed_by=ExecutedBy.RUNTIME,
            execution_env=f"runtime:{self.profile.name}"))
        return _choose(options, "allow_once")

    async def _until_stopped(self, waiting: Awaitable[T]) -> T | None:
        """``waiting``'s result, or None once the task is stopped first."""
        result: list[T] = []
        async with trio.open_nursery() as nursery:
            async def wait() -> None:
                result.append(await waiting)
                nursery.cancel_scope.cancel()

            async def stopped() -> None:
                await self._stop.wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(wait)
            nursery.start_soon(stopped)
        return result[0] if result else None

    # -- CodeSDK's tools, called through the bridge ---------------------------------------------

    async def _bridge_call(self, call: BridgeCall) -> BridgeAnswer:
        spec = self.by_visible.get(call.name)
        if spec is None:
            return BridgeAnswer(f"{call.name} is not a tool of this task", is_error=True)
        outcome = await self._until_stopped(self._request_call(spec.name, call.arguments, self._call_id_for(call),
                                                               ExecutedBy.SUPERVISOR))
        if outcome is None:  # the agent's turn is being cancelled: it should not wait for this call
            return BridgeAnswer("the task was stopped", is_error=True)
        if outcome.denied:
            return BridgeAnswer(outcome.reason or "denied by policy", is_error=True)
        result = outcome.result
        text = result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)
        return BridgeAnswer(text, is_error=outcome.is_error)

    def _announce(self, call_id: str, tool: str, arguments: dict[str, Any] | None) -> None:
        """The agent named a call of one of CodeSDK's tools (before its bridge call, or after): remember its id,
        so that the bridge call that matches it carries it; arguments learnt later fill in missing ones."""
        if not call_id or call_id in self._call_ids:
            return
        for index, (known, name, args) in enumerate(self._announced):
            if known == call_id:
                if args is None and arguments:
                    self._announced[index] = (known, name, arguments)
                return
        self._announced.append((call_id, tool, arguments or None))

    def _call_id_for(self, call: BridgeCall) -> str:
        """The agent's own id for this call when it announced one that matches (same tool, same or unknown
        arguments), else one of ours."""
        for index, (call_id, tool, args) in enumerate(self._announced):
            if tool == call.name and (args is None or canonical_hash(args) == canonical_hash(call.arguments)):
                del self._announced[index]
                return self._fresh_id(call_id)
        self._bridge_calls += 1
        return self._fresh_id(f"{self.params.task_id}-mcp-{self._bridge_calls}")

    def _fresh_id(self, call_id: str) -> str:
        while call_id in self._call_ids:
            call_id += "'"
        self._call_ids.add(call_id)
        return call_id

    async def _request_call(self, tool_name: str, tool_input: dict[str, Any], call_id: str,
                            executed_by: ExecutedBy) -> ToolOutcome:
        self.tools.expect(call_id)
        await self.io.emit(EventType.TOOL_CALL_REQUESTED, ToolCallRequested(
            **call_identity(call_id, tool_input), tool_name=tool_name, input=tool_input, executed_by=executed_by))
        return await self.tools.wait(call_id)


def _choose(options: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    """The permission answer selecting the first option of ``kind`` (a reject when it has none; never an
    ``allow_always``, whose grant would outlive this call)."""
    for wanted in (kind, "reject_once"):
        for option in options:
            if option.get("kind") == wanted and option.get("optionId") is not None:
                return {"outcome": {"outcome": "selected", "optionId": option["optionId"]}}
    return {"outcome": {"outcome": "cancelled"}}


def _inner_message(message: str) -> str:
    """An agent may pass the model API's error body on as its message: its own message then."""
    with contextlib.suppress(ValueError):
        body = json.loads(message)
        if isinstance(body, dict) and isinstance(body.get("error"), dict) and body["error"].get("message"):
            return str(body["error"]["message"])
    return message


def _stderr_tail(peer: RpcPeer) -> dict[str, Any]:
    """The agent's stderr tail as a failure's detail (where an agent's "Internal error" says what went wrong; the
    supervisor stores it as a blob), or nothing when it wrote none."""
    tail = peer.process.stderr.text()[-2000:]
    return {"stderr_tail": tail} if tail.strip() else {}
