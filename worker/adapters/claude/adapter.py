"""Claude Code adapter: the pinned CLI driven over its stream-json control protocol, under trio.

One CLI process per task (``RuntimeProcess``: its own process group, stderr tail, ended with the task), started
as soon as the task runs. No ``claude_agent_sdk`` import at run time: its wheel is only how the pinned binary is
installed (``home.cli_path``), and its import costs ~1.2 s — more than a whole one-turn run of the CLI.

Tool calls: a PreToolUse hook (registered with ``onFailure: "block"``, so a failing answer blocks the call) sees
every call with Claude's ``tool_use_id`` and asks the supervisor (``tool.call.requested``). Approved: the hook
answers ``allow``; our tool's result then goes back through the in-process MCP server (``codesdk.worker.mcp.server``), a built-in runs
inside Claude Code and is reported by a PostToolUse hook. Denied: the hook answers ``ask`` and the permission
request that follows (``can_use_tool``, routed to us by ``--permission-prompt-tool stdio``) is answered ``deny``
with the supervisor's reason — Claude gets that reason as the tool's error, verbatim (a hook's own ``deny`` would
reach the model as "PreToolUse:… hook error: …").
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections import defaultdict, deque
from pathlib import Path
from typing import Any

import trio

from codesdk.protocol import (
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
    InputDelivery,
    GrantScope,
    InteractionMode,
    QuestionSource,
    IsolationMode,
    ModelOutputCompleted,
    ModelOutputDelta,
    RuntimeCapabilities,
    RuntimeRequestCompleted,
    RuntimeRequestStarted,
    SendInputParams,
    StartTaskParams,
    SteeringSupport,
    TaskFailureCode,
    ToolCallCompleted,
    ToolCallRequested,
    ToolCallStarted,
    ToolRouting,
    ToolSpec,
    UsageReported,
    canonical_hash,
)

from codesdk.procs.launch import Launch
from .._questions import AnswersQuestions, PendingQuestions, form_answer
from .._tool_calls import AnswersToolCalls, PendingToolCalls, ToolOutcome, call_identity
from .._steering import InputInbox, delivered
from ...mcp.server import McpServer, McpTool, ToolCallResult
from .._api_failures import api_failure, is_unreachable, shown_url
from ..runtime_process import RuntimeAhead, RuntimeProcess
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
from .questions import ask_user_input, ask_user_questions, elicitation_questions
from ._control import ChannelClosed, ControlChannel, ControlError
from .launch import (
    ASK_USER_QUESTION,
    CLAUDE_CONFIG_KEYS,
    INITIALIZE_REQUEST_ID,
    MCP_SERVER,
    POST_TOOL_USE,
    PRE_TOOL_USE,
    BadClaudeConfig,
    ClaudeSettings,
    claude_launch,
    cli_path,
    cli_version,
    default_cwd,
)

log = logging.getLogger("codesdk.worker.claude")

#: Claude's tool names must match this; ours may contain dots, so they are mapped.
_CLAUDE_TOOL_NAME = re.compile(r"[^A-Za-z0-9_-]")
#: Bound on the CLI's answer to ``initialize`` (it starts in well under a second).
INITIALIZE_TIMEOUT_S = 60.0
#: Seconds a turn that ended with inputs written after its last model request waits for the turn Claude Code runs
#: for them (it runs one: they are queued commands); then the task ends, and the supervisor carries them.
FOLLOW_UP_S = 60.0
#: After the turn, stdin is closed and the CLI gets this long to flush its transcript and exit by itself.
EXIT_GRACE_S = 5.0
#: SIGTERM -> SIGKILL when we end the CLI's process group (stop after its grace, cancellation, crash report).
TERM_GRACE_S = 1.0


def claude_tool_name(name: str) -> str:
    return _CLAUDE_TOOL_NAME.sub("_", name)[:64]


class ClaudeAdapter(RuntimeAdapter):
    name = "claude"

    def __init__(self, ahead: RuntimeAhead | None = None) -> None:
        #: The CLI started ahead of this worker's first task, if asked (``worker._ahead``).
        self.ahead = ahead

    def capabilities(self) -> RuntimeCapabilities:
        return RuntimeCapabilities(
            name=self.name, version=self._version(), isolation_modes=(IsolationMode.SUBPROCESS,),
            requires_auth=True, auth_methods=("oauth_local", "api_key", "oauth_token", "third_party"),
            streaming_text=True, streaming_thinking=True, tool_calls=True,
            # CodeSDK's tools carry no read-only hint, so Claude Code runs them one at a time (as the contract shows)
            parallel_tool_calls=False, max_outstanding_tool_calls=1,
            tool_routing=(ToolRouting.MCP,),
            builtin_tools=("Bash", "Read", "Write", "Edit", "Glob", "Grep", "WebFetch", "WebSearch"),
            builtin_tools_default_enabled=False, permission_prompts=True,
            interaction_modes=tuple(InteractionMode), session_create=True, session_resume=True,
            transcript_input=False, context_window_tokens=200_000, cancellation=CancellationSupport.COOPERATIVE, usage_reporting=True,
            budget_gate=BudgetGate.AFTER_USAGE,  # usage comes with its result: once per turn
            cost_reporting=True, default_model=ClaudeSettings().model,
            config_keys=CLAUDE_CONFIG_KEYS, auth_model=AuthModel.BOTH, tool_execution=ToolExecution.HYBRID,
            permission_model=PermissionModel.CODESDK, state_model=StateModel.LOCAL_DISK,
            resume_model=ResumeModel.NATIVE, tool_replay=ReplaySafety.REQUIRES_REAPPROVAL,
            mcp_support=McpSupport.CLIENT_ONLY, mcp_transports=(McpTransport.STDIO, McpTransport.SSE, McpTransport.HTTP),
            cancellation_model=CancellationModel.BEST_EFFORT,
            # a user message written on its open stdin mid-turn is folded in before its next model request
            steering=SteeringSupport.MID_TURN,
            # AskUserQuestion in interactive tasks; an MCP server's elicitation, forwarded by the CLI
            user_questions=(QuestionSource.CLAUDE_ASK_USER, QuestionSource.MCP_ELICITATION),
            # a session grant is told as a session-scoped permission update when Claude Code asks (never settings)
            approval_scopes=(GrantScope.ONCE, GrantScope.SESSION))

    def _version(self) -> str:
        return cli_version()

    def availability(self) -> Availability:
        path = cli_path()
        if path is None:
            return Availability(False, "claude-agent-sdk is not installed (pip install 'codesdk[claude]'): its "
                                       "wheel carries the pinned Claude Code CLI")
        return Availability(True)

    async def auth_status(self) -> AuthStatus:
        return home.auth_status(os.environ)

    def login_command(self) -> list[str] | None:
        path = cli_path()
        return [str(path), "auth", "login"] if path is not None else None

    def start_task(self, params: StartTaskParams, io: TaskIO) -> TaskHandle:
        cli = cli_path()
        if cli is None:
            raise StartTaskRefused(ErrorCode.RUNTIME_UNAVAILABLE, self.availability().reason or "claude is unavailable")
        if not params.last_user_text():
            raise StartTaskRefused(ErrorCode.INVALID_PARAMS, "startTask needs a user message for claude")
        cwd = Path(default_cwd(params.workspace))
        # Earlier turns live in Claude's own session, resumed by id while its transcript is there; else they are
        # sent as the first prompt of a new one.
        given = RuntimeInput.plan(params, lambda session_id: home.stored_session(os.environ, cwd, session_id))
        if given.resume_id:
            io.set_runtime_session_id(given.resume_id)
        task = ClaudeTask(params, io, given, cli, self.ahead)
        task.implicit_sources = self.implicit_sources(task.cwd)
        return task

    def implicit_sources(self, cwd: Path) -> dict[str, Any]:
        return home.implicit_sources(os.environ, cwd)


class ClaudeTask(AnswersToolCalls, AnswersQuestions, TaskHandle):
    def __init__(self, params: StartTaskParams, io: TaskIO, given: RuntimeInput, cli: Path,
                 ahead: RuntimeAhead | None = None) -> None:
        self.params = params
        self.io = io
        self.given = given
        given.apply(self)
        self.prompt = given.text
        self.cli = cli
        self.ahead = ahead
        try:
            self.settings = ClaudeSettings.from_config(params.runtime_config)
        except BadClaudeConfig as exc:
            raise StartTaskRefused(ErrorCode.INVALID_RUNTIME_CONFIG, str(exc)) from exc
        self.stop_grace_s = self.settings.stop_grace_s
        #: Claude's own tools the operator enabled for this task; each call is still decided by the supervisor.
        self.builtins: tuple[str, ...] = self.settings.builtins
        self.cwd = Path(default_cwd(params.workspace))
        self.by_claude_name: dict[str, ToolSpec] = {
            f"mcp__{MCP_SERVER}__{claude_tool_name(t.name)}": t for t in params.tool_manifest.tools}
        self.mcp = McpServer(MCP_SERVER, "1.0.0", [
            McpTool(claude_tool_name(t.name), t.description or t.name, dict(t.input_schema))
            for t in params.tool_manifest.tools], self._call_tool)
        self.tools = PendingToolCalls()
        self.questions = PendingQuestions("claude-ask")
        #: An interactive task offers ``AskUserQuestion``; its questions reach the user through CodeSDK.
        self.asks_user = params.interaction_mode == InteractionMode.INTERACTIVE
        #: Every call the PreToolUse hook decided, by tool_use_id: (allowed, reason) — what can_use_tool answers.
        self._decisions: dict[str, tuple[bool, str]] = {}
        self._session_grants: set[str] = set()  # calls allowed for the session: Claude is told so if it asks
        #: The supervisor's answers to approved calls of our tools, waiting for Claude's tools/call.
        self._results: dict[str, ToolOutcome] = {}
        self._approved_by_input: dict[tuple[str, str], deque[str]] = defaultdict(deque)
        self._stop = trio.Event()
        self._stop_reason: str | None = None
        self._blocks: dict[int, tuple[str, BlockKind, list[str]]] = {}
        self._message_id: str | None = None
        self._message_stop_reason: str | None = None
        self._served_model: str | None = None
        self._assistant_error: str | None = None
        self._raw: list[Any] = []
        #: Inputs (steering) received, to be written to the CLI; and those written, waiting for its next request.
        self.inbox = InputInbox()
        self._written: list[SendInputParams] = []
        self._prompt_sent = trio.Event()  # inputs follow the prompt on stdin, never come before it
        self._last_tool_call: str | None = None

    # -- inputs (tool answers: AnswersToolCalls) ----------------------------------------------

    def send_input(self, params: SendInputParams) -> InputDelivery:
        self.inbox.put(params)  # written to the CLI's stdin at once (``_write_inputs``)
        return InputDelivery.MID_TURN

    def stop(self, reason: str | None) -> None:
        self._stop_reason = self._stop_reason or reason or "stop requested"  # the first stop says why
        self._stop.set()

    # -- the CLI --------------------------------------------------------------------------------

    def launch(self) -> Launch:
        """How the CLI is started for this task (``_launch.claude_launch``; the same for a CLI started ahead)."""
        return claude_launch(self.cli, self.settings, cwd=str(self.cwd),
                             resume=self.given.resume_id, environ=os.environ, questions=self.asks_user)

    # -- the run --------------------------------------------------------------------------------

    async def run(self) -> TaskOutcome:
        launch = self.launch()
        started = await self.ahead.take("claude", launch) if self.ahead is not None else None
        # Ended on the way out, with what it started (a built-in Bash's children), even outside its group.
        async with RuntimeProcess.open(launch.argv, env=launch.env, cwd=launch.cwd, name="Claude Code",
                                       term_grace_s=TERM_GRACE_S, started=started) as process:
            return await self._session(process, launch.opening if started is None else b"")

    async def _session(self, process: RuntimeProcess, opening: bytes) -> TaskOutcome:
        """The launch's ``initialize`` was written already when the CLI was started ahead; else ``opening`` is."""
        channel = ControlChannel(process, self._answer, sent=(INITIALIZE_REQUEST_ID,))
        if opening:
            try:
                await process.send(opening)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass  # it is gone already: its output ends, which the channel reports
        async with trio.open_nursery() as nursery:
            nursery.start_soon(channel.run)
            nursery.start_soon(self._stop_when_asked, channel)
            nursery.start_soon(self._write_inputs, channel)
            outcome = await self._converse(channel)
            channel.messages.close()
            if outcome is not None:
                await process.close_stdin()  # the turn is over: the CLI writes its transcript and exits
            with trio.move_on_after(EXIT_GRACE_S):
                await process.wait()
            nursery.cancel_scope.cancel()
        if outcome is not None:
            return outcome
        if self._stop.is_set():
            return TaskOutcome.stop(self._stop_reason or "stop requested")
        if process.returncode is None:  # its output ended but it lives on: end it, then report
            await process.end(TERM_GRACE_S)
        raise process.crashed()

    async def _converse(self, channel: ControlChannel) -> TaskOutcome | None:
        """Initialize, send the prompt, follow the turn to its result. None: the CLI's output ended first."""
        try:
            with trio.fail_after(INITIALIZE_TIMEOUT_S):
                ready = await channel.answer_to(INITIALIZE_REQUEST_ID)
        except ChannelClosed:
            return None
        except ControlError as exc:
            return TaskOutcome.failure(TaskFailureCode.RUNTIME_ERROR, f"Claude Code refused the session: {exc}")
        except trio.TooSlowError:
            return TaskOutcome.failure(TaskFailureCode.RUNTIME_ERROR, "Claude Code did not answer initialize "
                                       f"within {INITIALIZE_TIMEOUT_S:.0f} s", retryable=True)
        if not ready.get("hook_on_failure_supported") or ready.get("hooks_applied") is False:
            return TaskOutcome.failure(
                TaskFailureCode.RUNTIME_ERROR, "this Claude Code cannot make a failing PreToolUse hook block the "
                "call (no hook_on_failure_supported), so tool calls could run undecided; refusing to run it")
        if self._stop.is_set():  # stopped before the turn began: do not begin it
            return TaskOutcome.stop(self._stop_reason or "stop requested")
        try:
            await channel.send({"type": "user", "message": {"role": "user", "content": self.prompt},
                                "parent_tool_use_id": None, "session_id": "default"})
        except ChannelClosed:
            return None
        self._prompt_sent.set()
        outcome: TaskOutcome | None = None
        async for message in channel.messages:
            got = await self._handle(message)
            if got is None:
                continue
            outcome = got
            if not (self._written and got.completed is not None and not self._stop.is_set()):
                return got
            break  # inputs written after its last request: it takes them up in a turn of their own
        if outcome is None:
            return None
        with trio.move_on_after(FOLLOW_UP_S):  # that turn's result ends the task (else the first one's)
            async for message in channel.messages:
                got = await self._handle(message)
                if got is not None:
                    outcome = got
                    if not (self._written and got.completed is not None):
                        return got
        return outcome

    async def _write_inputs(self, channel: ControlChannel) -> None:
        """Each input, as another user message on the CLI's open stdin: Claude Code queues it (priority ``next``)
        and folds it into the running turn at its next tool boundary, before its next model request — where it is
        reported delivered (``_stream_event``)."""
        await self._prompt_sent.wait()
        written = 0
        while True:
            await self.inbox.wait(written + 1)
            for params in self.inbox.take():
                written += 1
                try:
                    await channel.send({"type": "user", "message": {"role": "user", "content": params.text()},
                                        "parent_tool_use_id": None, "session_id": "default", "priority": "next"})
                except ChannelClosed:
                    return  # the CLI is gone: the supervisor records the input as not delivered
                self._written.append(params)

    async def _stop_when_asked(self, channel: ControlChannel) -> None:
        """On stop: interrupt the turn; whatever is still running after the grace ends with the process group."""
        await self._stop.wait()
        deadline = trio.current_time() + self.stop_grace_s
        with trio.move_on_at(deadline):
            try:
                await channel.request({"subtype": "interrupt"})
            except (ChannelClosed, ControlError) as exc:
                log.info("interrupting Claude Code: %s", exc)
            await trio.sleep_until(deadline)
        await channel.process.end(TERM_GRACE_S)

    # -- the CLI's requests ---------------------------------------------------------------------

    async def _answer(self, request: dict[str, Any]) -> dict[str, Any]:
        subtype = request.get("subtype")
        if subtype == "hook_callback":
            hook_input = request.get("input") or {}
            tool_use_id = request.get("tool_use_id") or hook_input.get("tool_use_id")
            if request.get("callback_id") == PRE_TOOL_USE:
                return await self._pre_tool_use(hook_input, tool_use_id)
            if request.get("callback_id") == POST_TOOL_USE:
                return await self._post_tool_use(hook_input, tool_use_id)
            raise LookupError(f"no hook callback {request.get('callback_id')!r}")
        if subtype == "can_use_tool":
            if request.get("tool_name") == ASK_USER_QUESTION and self.asks_user:
                return await self._ask_user_question(request)
            return self._can_use_tool(request)
        if subtype == "elicitation":
            return await self._elicitation(request)
        if subtype == "mcp_message":
            message = request.get("message")
            if request.get("server_name") != MCP_SERVER:
                response: dict[str, Any] | None = {
                    "jsonrpc": "2.0", "id": message.get("id") if isinstance(message, dict) else None,
                    "error": {"code": -32601, "message": f"Server '{request.get('server_name')}' not found"}}
            else:
                response = await self.mcp.handle(message)
            # A notification gets no JSON-RPC answer, but the control request carrying it is acknowledged.
            return {"mcp_response": response if response is not None else {"jsonrpc": "2.0", "result": {}}}
        raise LookupError(f"unsupported control request {subtype!r}")

    async def _pre_tool_use(self, hook_input: dict[str, Any], tool_use_id: str | None) -> dict[str, Any]:
        name = str(hook_input.get("tool_name", ""))
        tool_input = hook_input.get("tool_input") or {}
        call_id = tool_use_id or f"call-{canonical_hash(tool_input)[7:19]}"
        if name == ASK_USER_QUESTION and self.asks_user:  # not a tool call: a question, asked at can_use_tool
            return _hook_decision("ask", "CodeSDK asks the user")
        if name not in self.by_claude_name and name not in self.builtins:
            return self._deny(call_id, f"{name} is not enabled: CodeSDK runs this task with Claude's built-in "
                                       "tools off")
        outcome = await self._request(name, tool_input, call_id)
        if outcome.denied:
            return self._deny(call_id, outcome.reason or "denied by policy")
        reason = outcome.reason or "approved by CodeSDK"
        self._decisions[call_id] = (True, reason)
        if outcome.scope is GrantScope.SESSION:
            self._session_grants.add(call_id)
        if name in self.builtins:  # approved: Claude runs its own tool now; PostToolUse reports the end
            await self.io.emit(EventType.TOOL_CALL_STARTED, ToolCallStarted(
                **call_identity(call_id, tool_input), tool_name=name, executed_by=ExecutedBy.RUNTIME,
                execution_env="runtime:claude"))
        else:  # our tool: the result is handed over when Claude calls it through MCP
            self._results[call_id] = outcome
            self._approved_by_input[(name, canonical_hash(tool_input))].append(call_id)
        return _hook_decision("allow", reason)

    def _deny(self, call_id: str, reason: str) -> dict[str, Any]:
        """Answer "ask": the CLI then asks us (can_use_tool), and our deny reaches the model as the plain reason."""
        self._decisions[call_id] = (False, reason)
        return _hook_decision("ask", reason)

    def _can_use_tool(self, request: dict[str, Any]) -> dict[str, Any]:
        call_id = request.get("tool_use_id")
        decision = self._decisions.get(call_id) if isinstance(call_id, str) else None
        if decision is None:
            return {"behavior": "deny", "message": f"{request.get('tool_name')} was not decided by CodeSDK"}
        allowed, reason = decision
        if allowed:  # the CLI wants a prompt although the hook allowed it: the supervisor has decided already
            tool_input = request.get("input")
            answer: dict[str, Any] = {"behavior": "allow",
                                      "updatedInput": tool_input if isinstance(tool_input, dict) else {}}
            if call_id in self._session_grants and request.get("tool_name"):
                answer["updatedPermissions"] = [session_rule(str(request["tool_name"]))]
            return answer
        return {"behavior": "deny", "message": reason}

    async def _ask_user_question(self, request: dict[str, Any]) -> dict[str, Any]:
        """``AskUserQuestion`` wants its user: the questions are asked through CodeSDK; answered, the call is
        allowed with the answers in its input (what the CLI's own prompt would do); declined, denied saying why."""
        tool_input = request.get("input") if isinstance(request.get("input"), dict) else {}
        assert isinstance(tool_input, dict)
        try:
            questions = ask_user_questions(tool_input)
        except ValueError as exc:
            return {"behavior": "deny", "message": f"CodeSDK cannot ask this: {exc}"}
        answer = await self.questions.ask(self.io.emit, QuestionSource.CLAUDE_ASK_USER, questions)
        if answer.declined:
            return {"behavior": "deny", "message": f"The user declined to answer: {answer.reason or 'declined'}"}
        return {"behavior": "allow", "updatedInput": ask_user_input(tool_input, questions, answer)}

    async def _elicitation(self, request: dict[str, Any]) -> dict[str, Any]:
        """An MCP server asks the user (form mode) through Claude Code: asked as a question. A URL cannot be shown
        here: declined (CodeSDK's own MCP server never elicits)."""
        try:
            questions = elicitation_questions(request)
        except ValueError as exc:
            self._raw.append({"control_request": request, "codesdk": f"declined: {exc}"})
            return {"action": "decline"}
        answer = await self.questions.ask(self.io.emit, QuestionSource.MCP_ELICITATION, questions,
                                          str(request.get("message") or ""), str(request.get("mcp_server_name") or ""))
        return form_answer(answer)

    async def _call_tool(self, name: str, arguments: dict[str, Any], meta: dict[str, Any]) -> ToolCallResult:
        """MCP tools/call: hand over the supervisor's answer to the call the hook approved (Claude Code names it in
        ``_meta["claudecode/toolUseId"]``; without that, the oldest approved call with the same input)."""
        claude_name = f"mcp__{MCP_SERVER}__{name}"
        waiting = self._approved_by_input[(claude_name, canonical_hash(arguments))]
        call_id = meta.get("claudecode/toolUseId")
        if not isinstance(call_id, str):
            call_id = waiting[0] if waiting else None
        if call_id is not None and call_id in waiting:
            waiting.remove(call_id)
        outcome = self._results.pop(call_id, None) if call_id is not None else None
        if outcome is None:
            if call_id is not None and call_id in self._decisions:  # denied, or answered once already
                allowed, reason = self._decisions[call_id]
                return ToolCallResult("this call was answered already" if allowed else reason, is_error=True)
            # No hook saw this call (it should not happen): ask the supervisor from here.
            outcome = await self._request(claude_name, arguments, call_id or f"mcp-{canonical_hash(arguments)[7:19]}")
        if outcome.denied:
            return ToolCallResult(outcome.reason or "denied by policy", is_error=True)
        result = outcome.result
        text = result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)
        return ToolCallResult(text, outcome.is_error)

    async def _request(self, claude_name: str, tool_input: dict[str, Any], tool_use_id: str) -> ToolOutcome:
        spec = self.by_claude_name.get(claude_name)
        self.tools.expect(tool_use_id)
        self._last_tool_call = tool_use_id
        await self.io.emit(EventType.TOOL_CALL_REQUESTED, ToolCallRequested(
            **call_identity(tool_use_id, tool_input), tool_name=spec.name if spec else claude_name, input=tool_input,
            executed_by=ExecutedBy.SUPERVISOR if spec else ExecutedBy.RUNTIME))
        return await self.tools.wait(tool_use_id)

    async def _post_tool_use(self, hook_input: dict[str, Any], tool_use_id: str | None) -> dict[str, Any]:
        """A built-in finished (or failed): report it; our own tools were reported by the supervisor."""
        name = str(hook_input.get("tool_name", ""))
        if name not in self.builtins:
            return {}
        call_id = tool_use_id or ""
        failed = hook_input.get("hook_event_name") == "PostToolUseFailure"
        response = hook_input.get("error") if failed else hook_input.get("tool_response")
        preview = response if isinstance(response, str) else json.dumps(response, ensure_ascii=False, default=str)
        await self.io.emit(EventType.TOOL_CALL_COMPLETED, ToolCallCompleted(
            **call_identity(call_id, hook_input.get("tool_input") or {}), tool_name=name, is_error=failed,
            executed_by=ExecutedBy.RUNTIME, execution_env="runtime:claude", result_preview=preview[:500]),
            raw={"tool_response": response})
        return {}

    # -- the CLI's messages ---------------------------------------------------------------------

    async def _handle(self, message: dict[str, Any]) -> TaskOutcome | None:
        kind = message.get("type")
        if kind == "stream_event":
            if message.get("parent_tool_use_id") is None:
                await self._stream_event(message.get("event") or {})
        elif kind == "system":
            if message.get("subtype") == "init" and message.get("session_id"):
                self.io.set_runtime_session_id(str(message["session_id"]))
        elif kind == "assistant":  # its content already arrived as stream events; an error does not
            if message.get("error") and message.get("parent_tool_use_id") is None:
                self._assistant_error = str(message["error"])
        elif kind == "result":
            return await self._result(message)
        return None

    async def _stream_event(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        self._raw.append(event)
        if kind == "message_start":
            message = event.get("message") or {}
            self._message_id = str(message.get("id") or f"msg{len(self._raw)}")
            if message.get("model"):
                self._served_model = str(message["model"])
                self.io.set_model(self._served_model)
            if self._written:  # what was written since its last request went into this one
                taken, self._written = self._written, []
                await delivered(self.io, taken, before_request_id=self._message_id,
                                after_tool_call_id=self._last_tool_call)
            await self.io.emit(EventType.RUNTIME_REQUEST_STARTED, RuntimeRequestStarted(
                request_id=self._message_id, model=message.get("model")))
        elif kind == "content_block_start":
            block = event.get("content_block") or {}
            block_kind = {"text": BlockKind.TEXT, "thinking": BlockKind.THINKING}.get(block.get("type", ""))
            if block_kind is not None:
                index = int(event.get("index", 0))
                self._blocks[index] = (f"{self.params.task_id}:{self._message_id}:{index}", block_kind, [])
        elif kind == "content_block_delta":
            delta = event.get("delta") or {}
            entry = self._blocks.get(int(event.get("index", 0)))
            text = delta.get("text") if delta.get("type") == "text_delta" else delta.get("thinking")
            if entry is not None and text:
                block_id, block_kind, parts = entry
                await self.io.emit(EventType.MODEL_OUTPUT_DELTA, ModelOutputDelta(
                    block_id=block_id, kind=block_kind, delta=text, index=len(parts)))
                parts.append(text)
        elif kind == "content_block_stop":
            entry = self._blocks.pop(int(event.get("index", 0)), None)
            if entry is not None:
                block_id, block_kind, parts = entry
                await self.io.emit(EventType.MODEL_OUTPUT_COMPLETED, ModelOutputCompleted(
                    block_id=block_id, kind=block_kind, text="".join(parts)))
        elif kind == "message_delta":
            self._message_stop_reason = (event.get("delta") or {}).get("stop_reason")
        elif kind == "message_stop":
            raw, self._raw = self._raw, []
            await self.io.emit(EventType.RUNTIME_REQUEST_COMPLETED, RuntimeRequestCompleted(
                request_id=self._message_id or "unknown", stop_reason=self._message_stop_reason), raw=raw)

    async def _result(self, result: dict[str, Any]) -> TaskOutcome:
        if result.get("session_id"):
            self.io.set_runtime_session_id(str(result["session_id"]))
        usage = result.get("usage") or {}
        cost = result.get("total_cost_usd")
        await self.io.emit(EventType.USAGE_REPORTED, UsageReported(
            model=self._served_model or self.settings.model, input_tokens=int(usage.get("input_tokens") or 0),
            output_tokens=int(usage.get("output_tokens") or 0),
            cache_read_tokens=int(usage.get("cache_read_input_tokens") or 0),
            cache_write_tokens=int(usage.get("cache_creation_input_tokens") or 0),
            cost_usd=float(cost) if isinstance(cost, int | float) and cost >= 0 else None), raw=result)
        if self._stop.is_set():
            return TaskOutcome.stop(self._stop_reason or "stop requested")
        if self._assistant_error == "authentication_failed":
            return _auth_failure(result)
        if result.get("is_error"):
            return _failure_from(result)
        return TaskOutcome.success(str(result.get("stop_reason") or "end_turn"), str(result.get("result") or "")[-200:])


def session_rule(tool_name: str) -> dict[str, Any]:
    """A permission update that lets Claude Code run ``tool_name`` unasked for the rest of its session, and no
    longer: destination ``session`` only (any other destination writes a settings file)."""
    return {"type": "addRules", "rules": [{"toolName": tool_name}], "behavior": "allow", "destination": "session"}


def _hook_decision(decision: str, reason: str) -> dict[str, Any]:
    return {"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": decision,
                                   "permissionDecisionReason": reason}}


def _result_text(result: dict[str, Any]) -> str:
    errors = result.get("errors") or []
    text = result.get("result") or "; ".join(str(e) for e in errors if e) or "Claude Code reported an error"
    return str(text).strip()


def _base_url() -> str:
    """The Anthropic API the CLI calls."""
    return os.environ.get("ANTHROPIC_BASE_URL") or "https://api.anthropic.com"


def _auth_failure(result: dict[str, Any]) -> TaskOutcome:
    """Claude Code had no usable login ("Not logged in · Please run /login", no request made) or the API
    refused its credentials: the namespace's own login instructions."""
    text = _result_text(result)
    status = home.auth_status(os.environ)
    if status.state == AuthState.UNAUTHENTICATED:
        message = status.message
    else:
        url = shown_url(_base_url())
        message = (f"{text} — the model API{f' at {url}' if url else ''} refused the credentials of this namespace: "
                   f"{home.login_instructions(os.environ)}")
    return TaskOutcome.failure(TaskFailureCode.AUTH_REQUIRED, message[:2000], False, runtime_message=text[:500],
                               api_error_status=result.get("api_error_status"), subtype=result.get("subtype"))


def _failure_from(result: dict[str, Any]) -> TaskOutcome:
    text = _result_text(result)
    status = result.get("api_error_status")
    if not isinstance(status, int):
        status = int(match.group(1)) if (match := re.search(r"\b(4\d\d|5\d\d)\b", text)) else None
    code, retryable, where = api_failure(status, status is None and is_unreachable(text), _base_url())
    text += where
    if "prompt is too long" in text.lower() or "context" in text.lower() and "too long" in text.lower():
        code, retryable = TaskFailureCode.CONTEXT_TOO_LARGE, False
    if code == TaskFailureCode.AUTH_REQUIRED:
        text += " — " + home.login_instructions(os.environ)
    return TaskOutcome.failure(code, text[:2000], retryable, api_error_status=status,
                               subtype=result.get("subtype"))
