"""Claude Code adapter: the SDK's client under trio, our tools as an in-process MCP server.

Tool calls: a PreToolUse hook sees every call with Claude's ``tool_use_id``. For CodeSDK's tools it emits
``tool.call.requested`` and waits for the supervisor: a denial becomes the hook's ``deny`` (Claude gets the
reason as the tool's error and carries on); a result is handed to the MCP tool handler, which returns it to
Claude. Built-in tools are off (``tools=[]``); a built-in call that still arrives is denied in the hook.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections import defaultdict, deque
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

import trio

from protocol import (
    AuthStatus,
    BlockKind,
    CancellationSupport,
    ErrorCode,
    EventType,
    ExecutedBy,
    ExitStatus,
    InteractionMode,
    IsolationMode,
    ModelOutputCompleted,
    ModelOutputDelta,
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

from ..._tool_calls import PendingToolCalls, ToolOutcome
from ..base import (
    Availability,
    RuntimeAdapter,
    RuntimeCrashed,
    StartTaskRefused,
    TaskHandle,
    TaskIO,
    TaskOutcome,
)
from . import _env

log = logging.getLogger("codesdk.worker.claude")

MCP_SERVER = "codesdk"
DEFAULT_MODEL = "claude-sonnet-4-5"
#: Claude's tool names must match this; ours may contain dots, so they are mapped.
_CLAUDE_TOOL_NAME = re.compile(r"[^A-Za-z0-9_-]")


def claude_tool_name(name: str) -> str:
    return _CLAUDE_TOOL_NAME.sub("_", name)[:64]


def _jsonable(value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        return {"type": type(value).__name__, **asdict(value)}
    return value


class ClaudeAdapter(RuntimeAdapter):
    name = "claude"

    def capabilities(self) -> RuntimeCapabilities:
        return RuntimeCapabilities(
            name=self.name, version=self._version(), isolation_modes=(IsolationMode.SUBPROCESS,),
            requires_auth=True, auth_methods=("oauth_local", "api_key"), streaming_text=True,
            streaming_thinking=True, tool_calls=True, parallel_tool_calls=True, tool_routing=(ToolRouting.MCP,),
            builtin_tools=("Bash", "Read", "Write", "Edit", "Glob", "Grep", "WebFetch", "WebSearch"),
            builtin_tools_default_enabled=False, permission_prompts=True,
            interaction_modes=(InteractionMode.NON_INTERACTIVE,), session_create=True, session_resume=True,
            transcript_input=False, cancellation=CancellationSupport.COOPERATIVE, usage_reporting=True,
            cost_reporting=True, default_model=DEFAULT_MODEL)

    def _version(self) -> str:
        return _env.cli_version()

    def availability(self) -> Availability:
        path = _env.cli_path()
        if path is None:
            return Availability(False, "claude-agent-sdk is not installed (pip install 'codesdk[claude]')")
        return Availability(True)

    async def auth_status(self) -> AuthStatus:
        return _env.auth_status(os.environ)

    def start_task(self, params: StartTaskParams, io: TaskIO) -> TaskHandle:
        availability = self.availability()
        if not availability.available:
            raise StartTaskRefused(ErrorCode.RUNTIME_UNAVAILABLE, availability.reason or "claude is unavailable")
        prompt = params.last_user_text()  # earlier turns live in Claude's own session (resumed by id)
        if not prompt:
            raise StartTaskRefused(ErrorCode.INVALID_PARAMS, "startTask needs a user message for claude")
        if params.session.runtime_session_id:
            io.set_runtime_session_id(params.session.runtime_session_id)
        task = ClaudeTask(params, io, prompt)
        task.implicit_sources = _env.implicit_sources(os.environ, task.cwd)
        return task


class ClaudeTask(TaskHandle):
    stop_grace_s = 5.0

    def __init__(self, params: StartTaskParams, io: TaskIO, prompt: str) -> None:
        self.params = params
        self.io = io
        self.prompt = prompt
        self.tools = PendingToolCalls()
        self.by_claude_name: dict[str, ToolSpec] = {
            f"mcp__{MCP_SERVER}__{claude_tool_name(t.name)}": t for t in params.tool_manifest.tools}
        self._answers: dict[tuple[str, str], deque[ToolOutcome]] = defaultdict(deque)
        self._stop = trio.Event()
        self._stop_reason: str | None = None
        self._blocks: dict[int, tuple[str, BlockKind, list[str]]] = {}
        self._message_id: str | None = None
        self._raw: list[Any] = []
        self._stderr: deque[str] = deque(maxlen=400)  # the CLI's last stderr lines, for a crash report
        self.cwd = Path(params.workspace or os.environ.get("TMPDIR") or "/tmp")
        builtins = params.runtime_config.get("builtin_tools") or []
        if not isinstance(builtins, list) or not all(isinstance(b, str) for b in builtins):
            raise StartTaskRefused(ErrorCode.INVALID_PARAMS, "runtime_config.builtin_tools must be a list of names")
        #: Claude's own tools the operator enabled for this task; each call is still decided by the supervisor.
        self.builtins: list[str] = builtins

    # -- inputs ---------------------------------------------------------------------------------

    def send_tool_result(self, tool_call_id: str, result: Any, is_error: bool = False) -> None:
        self.tools.answer(tool_call_id, ToolOutcome(result=result, is_error=is_error))

    def send_tool_denied(self, tool_call_id: str, reason: str) -> None:
        self.tools.answer(tool_call_id, ToolOutcome(denied=True, reason=reason))

    def stop(self, reason: str | None) -> None:
        self._stop_reason = reason or "stop requested"
        self._stop.set()

    def _on_stderr(self, line: str) -> None:
        log.info("claude: %s", line.rstrip())
        self._stderr.append(line if line.endswith("\n") else line + "\n")

    # -- the run --------------------------------------------------------------------------------

    def _options(self) -> Any:
        from claude_agent_sdk import ClaudeAgentOptions, HookMatcher

        config = self.params.runtime_config
        cwd = self.cwd
        env = dict(_env.QUIET_ENV)
        return ClaudeAgentOptions(
            tools=list(self.builtins), allowed_tools=[*self.by_claude_name, *self.builtins],
            mcp_servers={MCP_SERVER: self._mcp_server()},
            strict_mcp_config=True, setting_sources=[], plugins=[], model=config.get("model") or DEFAULT_MODEL,
            resume=self.params.session.runtime_session_id, cwd=str(cwd), env=env, include_partial_messages=True,
            hooks={"PreToolUse": [HookMatcher(matcher=None, hooks=[self._pre_tool_use],  # type: ignore[list-item]
                                              timeout=24 * 3600)],
                   "PostToolUse": [HookMatcher(matcher=None, hooks=[self._post_tool_use])],  # type: ignore[list-item]
                   "PostToolUseFailure": [HookMatcher(matcher=None,
                                                      hooks=[self._post_tool_use])]},  # type: ignore[list-item]
            cli_path=str(_env.cli_path()), max_turns=int(config.get("max_turns", 50)),
            stderr=self._on_stderr,
        )

    def _mcp_server(self) -> Any:
        from claude_agent_sdk import SdkMcpTool, create_sdk_mcp_server

        tools = []
        for claude_name, spec in self.by_claude_name.items():
            tools.append(SdkMcpTool(name=claude_tool_name(spec.name), description=spec.description or spec.name,
                                    input_schema=spec.input_schema, handler=self._make_handler(claude_name)))
        return create_sdk_mcp_server(MCP_SERVER, "1.0.0", tools)

    def _make_handler(self, claude_name: str) -> Any:
        async def handler(args: dict[str, Any]) -> dict[str, Any]:
            queue = self._answers.get((claude_name, canonical_hash(args)))
            if queue:
                outcome = queue.popleft()
            else:  # no hook saw this call (should not happen): ask the supervisor from here
                outcome = await self._request(claude_name, args, f"mcp-{canonical_hash(args)[7:19]}")
            if outcome.denied:
                return {"content": [{"type": "text", "text": f"denied: {outcome.reason}"}], "is_error": True}
            result = outcome.result
            text = result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)
            return {"content": [{"type": "text", "text": text}], "is_error": outcome.is_error}

        return handler

    async def _request(self, claude_name: str, tool_input: dict[str, Any], tool_use_id: str) -> ToolOutcome:
        spec = self.by_claude_name.get(claude_name)
        self.tools.expect(tool_use_id)
        await self.io.emit(EventType.TOOL_CALL_REQUESTED, ToolCallRequested(
            tool_call_id=tool_use_id, runtime_tool_call_id=tool_use_id, input_hash=canonical_hash(tool_input),
            tool_name=spec.name if spec else claude_name, input=tool_input,
            executed_by=ExecutedBy.SUPERVISOR if spec else ExecutedBy.RUNTIME))
        return await self.tools.wait(tool_use_id)

    def send_tool_approved(self, tool_call_id: str, reason: str) -> None:
        self.tools.answer(tool_call_id, ToolOutcome(approved=True, reason=reason))

    def _identity(self, call_id: str, tool_input: dict[str, Any]) -> dict[str, Any]:
        return {"tool_call_id": call_id, "runtime_tool_call_id": call_id, "input_hash": canonical_hash(tool_input)}

    async def _post_tool_use(self, hook_input: Any, tool_use_id: str | None, context: Any) -> dict[str, Any]:
        """A built-in finished (or failed): report it; our own tools were reported by the supervisor."""
        name = hook_input.get("tool_name", "")
        if name not in self.builtins:
            return {}
        call_id = tool_use_id or hook_input.get("tool_use_id") or ""
        failed = hook_input.get("hook_event_name") == "PostToolUseFailure"
        response = hook_input.get("error") if failed else hook_input.get("tool_response")
        preview = response if isinstance(response, str) else json.dumps(response, ensure_ascii=False, default=str)
        await self.io.emit(EventType.TOOL_CALL_COMPLETED, ToolCallCompleted(
            **self._identity(call_id, hook_input.get("tool_input") or {}), tool_name=name, is_error=failed,
            executed_by=ExecutedBy.RUNTIME, execution_env="runtime:claude", result_preview=preview[:500]),
            raw={"tool_response": response})
        return {}

    async def _pre_tool_use(self, hook_input: Any, tool_use_id: str | None, context: Any) -> dict[str, Any]:
        name = hook_input.get("tool_name", "")
        tool_input = hook_input.get("tool_input") or {}
        call_id = tool_use_id or hook_input.get("tool_use_id") or f"call-{canonical_hash(tool_input)[7:19]}"
        if name not in self.by_claude_name and name not in self.builtins:
            return _deny(f"{name} is not enabled: CodeSDK runs this task with Claude's built-in tools off")
        outcome = await self._request(name, tool_input, call_id)
        if outcome.denied:
            return _deny(outcome.reason or "denied by policy")
        if name in self.builtins:  # approved: Claude runs its own tool now; PostToolUse reports the end
            await self.io.emit(EventType.TOOL_CALL_STARTED, ToolCallStarted(
                **self._identity(call_id, tool_input), tool_name=name, executed_by=ExecutedBy.RUNTIME,
                execution_env="runtime:claude"))
            return {"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "allow",
                                           "permissionDecisionReason": outcome.reason or "approved by CodeSDK"}}
        self._answers[(name, canonical_hash(tool_input))].append(outcome)
        return {"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "allow",
                                       "permissionDecisionReason": "approved by CodeSDK"}}

    async def run(self) -> TaskOutcome:
        from claude_agent_sdk import ClaudeSDKClient
        from claude_agent_sdk._errors import ClaudeSDKError

        outcome: TaskOutcome | None = None
        leftovers: list[Any] = []
        cli_pid: int | None = None
        try:
            async with ClaudeSDKClient(options=self._options()) as client:
                cli_pid = _cli_pid(client)
                try:
                    async with trio.open_nursery() as nursery:

                        async def interrupt_on_stop() -> None:
                            await self._stop.wait()
                            with trio.move_on_after(self.stop_grace_s):
                                await client.interrupt()

                        nursery.start_soon(interrupt_on_stop)
                        await client.query(self.prompt)
                        async for message in client.receive_response():
                            outcome = await self._handle(message)
                            if outcome is not None:
                                break
                        nursery.cancel_scope.cancel()
                finally:
                    # Seen while the CLI still runs: what it started (a built-in Bash's children) must end too.
                    leftovers = _descendants(cli_pid)
        except (ClaudeSDKError, ExceptionGroup) as exc:
            if self._stop.is_set():
                return TaskOutcome.stop(self._stop_reason or "stop requested")
            died = _process_error(exc)
            if died is not None and died.exit_code is not None:
                raise RuntimeCrashed("Claude Code", cli_pid, ExitStatus.from_returncode(died.exit_code),
                                     "".join(self._stderr)) from exc
            if isinstance(exc, ExceptionGroup):
                raise
            return TaskOutcome.failure(TaskFailureCode.RUNTIME_ERROR, f"Claude Code failed: {exc}", retryable=True)
        finally:
            _kill(leftovers)  # the SDK has ended the CLI itself by now (SIGTERM, then SIGKILL)
        if self._stop.is_set():
            return TaskOutcome.stop(self._stop_reason or "stop requested")
        return outcome or TaskOutcome.failure(TaskFailureCode.RUNTIME_ERROR,
                                              "Claude Code ended without a result", retryable=True)

    async def _handle(self, message: Any) -> TaskOutcome | None:
        from claude_agent_sdk import ResultMessage, StreamEvent, SystemMessage

        if isinstance(message, SystemMessage):
            if message.subtype == "init" and message.data.get("session_id"):
                self.io.set_runtime_session_id(str(message.data["session_id"]))
            return None
        if isinstance(message, StreamEvent):
            if message.parent_tool_use_id is None:
                await self._stream_event(message.event)
            return None
        if isinstance(message, ResultMessage):
            return await self._result(message)
        return None  # AssistantMessage/UserMessage: their content already arrived as stream events

    async def _stream_event(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        self._raw.append(event)
        if kind == "message_start":
            message = event.get("message") or {}
            self._message_id = str(message.get("id") or f"msg{len(self._raw)}")
            if message.get("model"):
                self.io.set_model(str(message["model"]))
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
            self._stop_reason_seen = (event.get("delta") or {}).get("stop_reason")
        elif kind == "message_stop":
            raw, self._raw = self._raw, []
            await self.io.emit(EventType.RUNTIME_REQUEST_COMPLETED, RuntimeRequestCompleted(
                request_id=self._message_id or "unknown", stop_reason=getattr(self, "_stop_reason_seen", None)),
                raw=raw)

    async def _result(self, result: Any) -> TaskOutcome:
        if result.session_id:
            self.io.set_runtime_session_id(str(result.session_id))
        usage = result.usage or {}
        await self.io.emit(EventType.USAGE_REPORTED, UsageReported(
            model=None, input_tokens=int(usage.get("input_tokens") or 0),
            output_tokens=int(usage.get("output_tokens") or 0),
            cache_read_tokens=int(usage.get("cache_read_input_tokens") or 0),
            cache_write_tokens=int(usage.get("cache_creation_input_tokens") or 0),
            cost_usd=result.total_cost_usd), raw=_jsonable(result))
        if self._stop.is_set():
            return TaskOutcome.stop(self._stop_reason or "stop requested")
        if result.is_error:
            return _failure_from(result)
        return TaskOutcome.success(result.stop_reason or "end_turn", (result.result or "")[-200:])


def _process_error(exc: BaseException) -> Any:
    """The SDK's ProcessError (the CLI exited under us) inside ``exc``, also inside exception groups."""
    from claude_agent_sdk._errors import ProcessError

    if isinstance(exc, BaseExceptionGroup):
        return next((found for inner in exc.exceptions if (found := _process_error(inner)) is not None), None)
    return exc if isinstance(exc, ProcessError) else None


def _cli_pid(client: Any) -> int | None:
    """The CLI's pid (the SDK keeps its process private; read defensively)."""
    process = getattr(getattr(client, "_transport", None), "_process", None)
    pid = getattr(process, "pid", None)
    return pid if isinstance(pid, int) else None


def _descendants(pid: int | None) -> list[Any]:
    import psutil

    if pid is None:
        return []
    try:
        return list(psutil.Process(pid).children(recursive=True))
    except psutil.Error:
        return []


def _kill(processes: list[Any]) -> None:
    import psutil

    for process in processes:
        try:
            process.kill()
        except psutil.Error:
            pass


def _deny(reason: str) -> dict[str, Any]:
    return {"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "deny",
                                   "permissionDecisionReason": reason}}


#: HTTP status of the failing API call -> (task.failed code, retryable)
_API_FAILURES = {
    400: ("INVALID_REQUEST", False), 401: (TaskFailureCode.AUTH_REQUIRED, False),
    403: (TaskFailureCode.AUTH_REQUIRED, False), 413: ("CONTEXT_TOO_LARGE", False), 429: ("RATE_LIMITED", True),
    500: ("API_ERROR", True), 502: ("API_ERROR", True), 503: ("API_ERROR", True), 504: ("API_ERROR", True),
    529: ("OVERLOADED", True),
}


def _failure_from(result: Any) -> TaskOutcome:
    text = (result.result or "; ".join(result.errors or []) or "Claude Code reported an error").strip()
    status = result.api_error_status
    if status is None and (match := re.search(r"\b(4\d\d|5\d\d)\b", text)):
        status = int(match.group(1))
    code, retryable = _API_FAILURES.get(status or 0, (TaskFailureCode.RUNTIME_ERROR, False))
    if "prompt is too long" in text.lower() or "context" in text.lower() and "too long" in text.lower():
        code, retryable = "CONTEXT_TOO_LARGE", False
    if code == TaskFailureCode.AUTH_REQUIRED:
        text += " — log in for this namespace (`claude login` with its HOME) or configure an API key for it"
    return TaskOutcome.failure(str(code), text[:2000], retryable, api_error_status=status, subtype=result.subtype)
