"""CodeSDK's sessions, events and approvals as Agent Client Protocol messages, sans-IO.

Pure functions from the service's answers (``codesdk.protocol.api``, ``NormalizedEvent``) to the JSON objects ACP
v1 defines (``PROTOCOL_VERSION``, schema ``SCHEMA_RELEASE``: the stable ``schema/v1/schema.json`` of
agentclientprotocol/agent-client-protocol), and from the client's answers back to decisions. The I/O loop
(``server``) only moves what these return; the tests check every value against the official SDK's models.
"""

from __future__ import annotations

import json
import math
import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from codesdk._version import __version__
from codesdk.protocol import (
    ApprovalRequested,
    BlockKind,
    EventType,
    ModelOutputCompleted,
    ModelOutputDelta,
    NormalizedEvent,
    Question,
    QuestionReply,
    QuestionRequested,
    TaskCompleted,
    TaskFailed,
    TaskStarted,
    TaskStopped,
    ToolCallCompleted,
    ToolCallDenied,
    ToolCallRequested,
    ToolCallStarted,
    UsageReported,
    answer_problems,
    api,
)

#: The ACP protocol version spoken (``initialize``'s ``protocolVersion``): 1, the stable one (2 is a draft).
PROTOCOL_VERSION: Final = 1
#: The schema release whose stable methods and shapes this module follows (``schema-v1.21.0``, 2026-08-20).
SCHEMA_RELEASE: Final = "1.21.0"
#: The key of CodeSDK's own fields inside ACP's ``_meta`` objects.
META_KEY: Final = "codesdk"

#: The one authentication method: the service's bearer token (``--token``/``CODESDK_TOKEN``; an embedded
#: supervisor needs none).
AUTH_METHOD_ID: Final = "codesdk-token"


class ErrorCode:
    """ACP's JSON-RPC error codes (``ErrorCode`` in the schema)."""

    PARSE_ERROR: Final = -32700
    INVALID_REQUEST: Final = -32600
    METHOD_NOT_FOUND: Final = -32601
    INVALID_PARAMS: Final = -32602
    INTERNAL_ERROR: Final = -32603
    REQUEST_CANCELLED: Final = -32800
    AUTH_REQUIRED: Final = -32000
    RESOURCE_NOT_FOUND: Final = -32002


@dataclass(frozen=True)
class AcpError(Exception):
    """A request refused as ACP expects: its JSON-RPC ``code``, a message that says what to do, optional ``data``."""

    code: int
    message: str
    data: Any = None

    def __str__(self) -> str:
        return self.message

    def to_json(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return error


def error_for_status(status: int, code: str, message: str) -> AcpError:
    """A service refusal (HTTP status and its code) as the ACP error a client understands."""
    if status == 401:
        return AcpError(ErrorCode.AUTH_REQUIRED, f"the service refused the token: {message}; give a valid one "
                        "(--token or CODESDK_TOKEN)", {"status": status, "code": code})
    if status in (403, 404):  # another tenant's session is "not found", never "forbidden": it reveals nothing
        return AcpError(ErrorCode.RESOURCE_NOT_FOUND, message, {"status": status, "code": code})
    if status in (400, 409, 422):
        return AcpError(ErrorCode.INVALID_PARAMS, message, {"status": status, "code": code})
    return AcpError(ErrorCode.INTERNAL_ERROR, message, {"status": status, "code": code})


# -- initialize --------------------------------------------------------------------------------------


def requested_version(value: object) -> int | None:
    """The version an ``initialize`` asks for: an integer — or its digits as a string, as some clients send it
    (the answer is the integer either way); None for anything else."""
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 5:
        return int(value)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def initialize_result(*, needs_token: bool) -> dict[str, Any]:
    """``initialize``'s answer. Sessions are the service's (load, resume, list); prompts are text (and resource
    text); MCP servers from the client are not taken: the tools are CodeSDK's, decided by its policy."""
    return {
        "protocolVersion": PROTOCOL_VERSION,
        "agentCapabilities": {
            "loadSession": True,
            "promptCapabilities": {"image": False, "audio": False, "embeddedContext": True},
            "mcpCapabilities": {"http": False, "sse": False},
            "sessionCapabilities": {"list": {}, "resume": {}},
        },
        "authMethods": [{"id": AUTH_METHOD_ID, "name": "CodeSDK token",
                         "description": "the service's bearer token, given as --token or CODESDK_TOKEN"}]
        if needs_token else [],
        "agentInfo": {"name": "codesdk", "title": "CodeSDK", "version": __version__},
        "_meta": {META_KEY: {"schema": SCHEMA_RELEASE}},
    }


# -- sessions ------------------------------------------------------------------------------------------


def session_info(session: api.Session, cwd: str | None = None) -> dict[str, Any]:
    """One ``SessionInfo`` of ``session/list``: its workspace as ``cwd`` (or the one the client gave)."""
    info: dict[str, Any] = {"sessionId": session.session_id, "cwd": session.workspace or cwd or "/",
                            "_meta": {META_KEY: {"runtime": session.runtime, "namespace": session.namespace,
                                                 "createdAt": session.created_at.isoformat(),
                                                 "lastSeq": session.last_seq, "state": session.state.value}}}
    if session.title:
        info["title"] = session.title
    return info


#: The permission modes a session's prompts may run with (``protocol.PermissionMode``), as a config option.
PERMISSION_MODES: Final = (("ask", "Ask", "ask before tools that change something"),
                           ("auto", "Auto", "the policy decides; asks only where it says ask"),
                           ("yolo", "Yolo", "allow every tool the policy does not deny"))


#: The value of the ``model`` option that leaves the choice to the runtime.
DEFAULT_MODEL: Final = "default"


def config_options(mode: str, runtime: str, runtimes: Sequence[str], model: str | None = None,
                   default_model: str | None = None, takes_model: bool = False,
                   known_models: Sequence[str] = ()) -> list[dict[str, Any]]:
    """The session's config options: its permission mode, its runtime (the next prompt moves it there), and the
    model where its runtime takes one (``default``: the runtime's own choice, ``default_model`` when it says; the
    models it names, and any other name it takes)."""
    options: list[dict[str, Any]] = [
        {"id": "mode", "name": "Permission mode", "category": "mode", "type": "select", "currentValue": mode,
         "options": [{"value": value, "name": name, "description": text} for value, name, text in PERMISSION_MODES]},
        {"id": "runtime", "name": "Runtime", "category": "model", "type": "select", "currentValue": runtime,
         "options": [{"value": name, "name": name} for name in dict.fromkeys([runtime, *runtimes])]},
    ]
    if takes_model:
        default = {"value": DEFAULT_MODEL, "name": f"the runtime's default ({default_model or 'its own choice'})"}
        chosen = [{"value": name, "name": name} for name in dict.fromkeys([*known_models, *([model] if model else [])])
                  if name != DEFAULT_MODEL]
        options.append({"id": "model", "name": "Model", "category": "model", "type": "select",
                        "description": "any model name the runtime takes may be set", "currentValue":
                        model or DEFAULT_MODEL, "options": [default, *chosen]})
    return options


def prompt_text(blocks: object) -> str:
    """A ``session/prompt``'s content as the task's prompt: text blocks, and the text of embedded resources and
    resource links (named); ``AcpError`` for a prompt with none, or a kind the capabilities did not offer."""
    if not isinstance(blocks, list):
        raise AcpError(ErrorCode.INVALID_PARAMS, "prompt must be a list of content blocks")
    parts: list[str] = []
    for block in blocks:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            parts.append(block["text"])
        elif kind == "resource" and isinstance(block.get("resource"), dict):
            resource = block["resource"]
            if isinstance(resource.get("text"), str):
                parts.append(f"<resource uri={json.dumps(resource.get('uri', ''))}>\n{resource['text']}\n</resource>")
        elif kind == "resource_link" and isinstance(block.get("uri"), str):
            parts.append(f"[{block.get('name') or block['uri']}]({block['uri']})")
        else:
            raise AcpError(ErrorCode.INVALID_PARAMS, f"prompt content of type {str(kind)[:40]!r} is not supported: send text "
                           "(images and audio are not offered in promptCapabilities)")
    text = "\n\n".join(part for part in parts if part)
    if not text.strip():
        raise AcpError(ErrorCode.INVALID_PARAMS, "the prompt has no text")
    return text


# -- events -> session/update -----------------------------------------------------------------------------

#: ACP's tool kinds for CodeSDK's tools (anything else is ``other``).
TOOL_KINDS: Final = {"workspace.read": "read", "workspace.list": "search", "workspace.write": "edit",
                     "patch.apply": "edit", "workspace.exec": "execute", "http.fetch": "fetch"}


def tool_kind(tool_name: str) -> str:
    return TOOL_KINDS.get(tool_name, "other")


def tool_locations(tool_input: Mapping[str, Any] | None, workspace: str | None = None) -> list[dict[str, Any]]:
    """Where a call works, as ACP locations (absolute paths): its ``path`` input, inside the session's workspace
    when relative; none when it names none, or a relative one with no workspace known."""
    path = tool_input.get("path") if tool_input else None
    if not isinstance(path, str) or not path:
        return []
    if not path.startswith("/"):
        if not workspace:
            return []
        path = posixpath.join(workspace, path)
    return [{"path": posixpath.normpath(path)}]


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _content(text: str) -> list[dict[str, Any]]:
    return [{"type": "content", "content": _text(text)}] if text else []


def _chunk(kind: BlockKind, text: str) -> dict[str, Any]:
    update = "agent_thought_chunk" if kind == BlockKind.THINKING else "agent_message_chunk"
    return {"sessionUpdate": update, "content": _text(text)}


class PromptTexts:
    """The whole text of replayed prompts: ``task.started`` keeps the first 200 characters; the session's transcript
    has each user message whole, in order. Each preview takes the next unused message that starts with it (a
    message the transcript lacks keeps its preview)."""

    def __init__(self, texts: Sequence[str]) -> None:
        self._texts = list(texts)
        self._next = 0

    def whole(self, preview: str) -> str:
        for index in range(self._next, len(self._texts)):
            if self._texts[index].startswith(preview):
                self._next = index + 1
                return self._texts[index]
        return preview


def event_updates(event: NormalizedEvent, *, replay: bool, workspace: str | None = None,
                  context_window: int | None = None, prompts: PromptTexts | None = None) -> list[dict[str, Any]]:
    """The ``session/update`` objects one stored event becomes. Live, text streams by its deltas; replayed
    (``session/load``), by each completed block, and the user's prompts are sent back as user message chunks;
    usage is a ``usage_update`` where the runtime's context window is known (``context_window``, tokens).
    Each update carries the event's ``seq`` in ``_meta`` (the cursor a client resumes from)."""
    payload = event.payload
    updates: list[dict[str, Any]] = []
    if isinstance(payload, TaskStarted) and replay and payload.prompt_preview:
        text = prompts.whole(payload.prompt_preview) if prompts is not None else payload.prompt_preview
        updates.append({"sessionUpdate": "user_message_chunk", "content": _text(text)})
    elif isinstance(payload, ModelOutputDelta) and not replay and payload.delta:
        updates.append(_chunk(payload.kind, payload.delta))
    elif isinstance(payload, ModelOutputCompleted) and replay and payload.text:
        updates.append(_chunk(payload.kind, payload.text))
    elif isinstance(payload, ToolCallRequested):
        updates.append({"sessionUpdate": "tool_call", "toolCallId": payload.tool_call_id, "title": payload.tool_name,
                        "kind": tool_kind(payload.tool_name), "status": "pending",
                        "locations": tool_locations(payload.input, workspace), "rawInput": payload.input or {}})
    elif isinstance(payload, ToolCallStarted):
        updates.append({"sessionUpdate": "tool_call_update", "toolCallId": payload.tool_call_id,
                        "status": "in_progress"})
    elif isinstance(payload, ToolCallDenied):
        updates.append({"sessionUpdate": "tool_call_update", "toolCallId": payload.tool_call_id, "status": "failed",
                        "content": _content(f"denied: {payload.reason}")})
    elif isinstance(payload, ToolCallCompleted):
        updates.append({"sessionUpdate": "tool_call_update", "toolCallId": payload.tool_call_id,
                        "status": "failed" if payload.is_error else "completed",
                        "content": _content(payload.result_preview), "rawOutput": {"preview": payload.result_preview}})
    elif isinstance(payload, UsageReported) and context_window:
        used = payload.input_tokens + payload.cache_read_tokens + payload.cache_write_tokens + payload.output_tokens
        usage: dict[str, Any] = {"sessionUpdate": "usage_update", "used": used, "size": context_window}
        if payload.cost_usd is not None:
            usage["cost"] = {"amount": payload.cost_usd, "currency": "USD"}
        updates.append(usage)
    for update in updates:
        update["_meta"] = {META_KEY: {"seq": event.seq, "type": event.type.value}}
    return updates


# -- the end of a prompt -------------------------------------------------------------------------------

#: A completed task's ``stop_reason`` (its runtime's word) as ACP's ``StopReason``.
_STOP_REASONS: Final = {"end_turn": "end_turn", "max_tokens": "max_tokens", "refusal": "refusal",
                        "max_turn_requests": "max_turn_requests", "cancelled": "cancelled"}


def prompt_result(terminal: NormalizedEvent, usage: Sequence[UsageReported] = ()) -> dict[str, Any]:
    """``session/prompt``'s answer once its task ended with ``terminal``: a completed task's stop reason, a
    stopped one's ``cancelled`` (with the stop's receipt). A failed task is an ``AcpError`` (raised): the client
    shows its message; ``AUTH_REQUIRED`` is ACP's auth_required."""
    payload = terminal.payload
    meta: dict[str, Any] = {"taskId": terminal.trace.task_id, "seq": terminal.seq}
    if usage:
        meta["usage"] = {"inputTokens": sum(u.input_tokens for u in usage),
                         "outputTokens": sum(u.output_tokens for u in usage),
                         "cachedReadTokens": sum(u.cache_read_tokens for u in usage),
                         "cachedWriteTokens": sum(u.cache_write_tokens for u in usage)}
    if isinstance(payload, TaskFailed):
        code = ErrorCode.AUTH_REQUIRED if payload.code == "AUTH_REQUIRED" else ErrorCode.INTERNAL_ERROR
        raise AcpError(code, f"the task failed ({payload.code}): {payload.message}",
                       {META_KEY: {**meta, "code": str(payload.code), "retryable": payload.retryable}})
    if isinstance(payload, TaskCompleted):
        stop = _STOP_REASONS.get(payload.stop_reason, "end_turn")
    else:
        stop = "cancelled"
        if isinstance(payload, TaskStopped):
            meta["reason"] = payload.reason
            if payload.receipt is not None:
                meta["receipt"] = payload.receipt.to_json_obj()
    return {"stopReason": stop, "_meta": {META_KEY: meta}}


# -- approvals <-> session/request_permission -------------------------------------------------------------

#: The options offered for every approval: once (the call), always (a grant for the session's calls of the tool
#: that the policy would ask about), or no. Their ids are what the answer names.
PERMISSION_OPTIONS: Final = (
    {"optionId": "allow_once", "name": "Allow once", "kind": "allow_once"},
    {"optionId": "allow_session", "name": "Always allow in this session", "kind": "allow_always"},
    {"optionId": "reject_once", "name": "Reject", "kind": "reject_once"},
)


def permission_request(session_id: str, event: NormalizedEvent, tool_input: Mapping[str, Any] | None,
                       workspace: str | None = None) -> dict[str, Any]:
    """``session/request_permission``'s params for an ``approval.requested`` event (``tool_input``: the call's
    input from its ``tool.call.requested``, when known)."""
    payload = event.payload
    if not isinstance(payload, ApprovalRequested):
        raise TypeError(f"not an approval: {event.type}")
    return _permission(session_id, payload.approval_id, payload.tool_call_id, payload.tool_name, payload.reason,
                       payload.expires_at.isoformat(), tool_input, event.seq, workspace)


def pending_permission_request(session_id: str, approval: api.Approval,
                               workspace: str | None = None) -> dict[str, Any]:
    """``session/request_permission``'s params for an approval found pending (a task this connection follows)."""
    return _permission(session_id, approval.approval_id, approval.tool_call_id, approval.tool_name, approval.reason,
                       approval.expires_at.isoformat(), approval.input, None, workspace)


def _permission(session_id: str, approval_id: str, tool_call_id: str, tool_name: str, reason: str, expires_at: str,
                tool_input: Mapping[str, Any] | None, seq: int | None, workspace: str | None) -> dict[str, Any]:
    return {"sessionId": session_id,
            "toolCall": {"toolCallId": tool_call_id, "title": tool_name, "kind": tool_kind(tool_name),
                         "status": "pending", "locations": tool_locations(tool_input, workspace),
                         "rawInput": dict(tool_input or {}), "content": _content(reason)},
            "options": [dict(option) for option in PERMISSION_OPTIONS],
            "_meta": {META_KEY: {"approvalId": approval_id, "reason": reason, "expiresAt": expires_at,
                                 "seq": seq}}}


@dataclass(frozen=True)
class Decision:
    """What the client's answer decides: allow or not, the grant's scope, and why (the runtime reads a denial's)."""

    allow: bool
    scope: str = "once"
    reason: str = ""


def decision_of(answer: object) -> Decision:
    """The client's ``RequestPermissionResponse`` as a decision. Anything but a selected allow option is a
    denial: a cancelled request, an unknown option, a malformed answer."""
    outcome = answer.get("outcome") if isinstance(answer, dict) else None
    if not isinstance(outcome, dict) or outcome.get("outcome") != "selected":
        return Decision(False, reason="the ACP client cancelled the permission request")
    chosen = outcome.get("optionId")
    if chosen == "allow_once":
        return Decision(True)
    if chosen == "allow_session":
        return Decision(True, scope="session")
    if chosen == "reject_once":
        return Decision(False, reason="rejected in the ACP client")
    return Decision(False, reason=f"the ACP client chose an option not offered ({str(chosen)[:80]!r})")


# -- questions <-> elicitation/create ------------------------------------------------------------------

#: The string formats an ACP form may name (``StringFormat``); another is left out (the answer is checked anyway).
_FORMATS: Final = ("email", "uri", "date", "date-time")


def _texts(values: Sequence[object]) -> list[str]:
    return [str(v) for v in values]


def question_property(question: Question) -> dict[str, Any]:
    """One question as a property of an ACP form (``ElicitationPropertySchema``): its schema's type and bounds,
    its options as a closed set (several with ``multi_select``), else free text."""
    prop: dict[str, Any] = {"title": question.header or question.id}
    if question.text:
        prop["description"] = question.text
    schema = question.answer_schema
    labels = [o.label for o in question.options]
    if schema is not None and schema.type in ("boolean", "number", "integer"):
        prop["type"] = schema.type
        low, high = schema.minimum, schema.maximum
        if schema.type == "integer":  # ACP's integer bounds are integers: the whole numbers within
            low = math.ceil(low) if low is not None else None
            high = math.floor(high) if high is not None else None
        if schema.type != "boolean":
            prop.update({k: v for k, v in (("minimum", low), ("maximum", high)) if v is not None})
    elif schema is not None and schema.type == "array":
        items = schema.items.allowed() if schema.items is not None else None
        prop.update({"type": "array", "items": {"type": "string", "enum": _texts(items or [])}})
        prop.update({k: v for k, v in (("minItems", schema.min_items), ("maxItems", schema.max_items)) if v is not None})
    elif schema is not None:
        prop["type"] = "string"
        allowed = schema.allowed()
        if allowed is not None:
            prop["enum"] = _texts(allowed)
        prop.update({k: v for k, v in (("minLength", schema.min_length), ("maxLength", schema.max_length))
                     if v is not None})
        if schema.format in _FORMATS:
            prop["format"] = schema.format
    elif labels and question.multi_select:
        prop.update({"type": "array", "items": {"type": "string", "enum": labels}})
    elif labels and not question.allow_other:
        prop.update({"type": "string", "oneOf": [{"const": o.label, "title": o.label,
                                                  **({"description": o.description} if o.description else {})}
                                                 for o in question.options]})
    else:
        prop["type"] = "string"
        if labels:
            prop["description"] = f"{question.text} (for example: {', '.join(labels)})".strip()
    if isinstance(question.default, str) and prop["type"] == "string":
        prop["default"] = question.default
    if question.secret:
        prop["_meta"] = {META_KEY: {"secret": True}}
    return prop


def elicitation_request(session_id: str, event: NormalizedEvent) -> dict[str, Any]:
    """``elicitation/create``'s params for a ``question.requested`` event: one form, a property per question."""
    payload = event.payload
    if not isinstance(payload, QuestionRequested):
        raise TypeError(f"not a question: {event.type}")
    message = payload.message or "; ".join(q.text for q in payload.questions if q.text) or "the agent asks"
    return {"sessionId": session_id, "mode": "form", "message": message,
            "requestedSchema": {"type": "object",
                                "properties": {q.id: question_property(q) for q in payload.questions},
                                "required": [q.id for q in payload.questions if q.required]},
            "_meta": {META_KEY: {"questionId": payload.question_id, "seq": event.seq,
                                 "expiresAt": payload.expires_at.isoformat() if payload.expires_at else None}}}


def reply_of(answer: object, questions: Sequence[Question]) -> QuestionReply:
    """The client's ``CreateElicitationResponse`` as the question's reply: the accepted form's answers — a
    decline when it declined or cancelled, or when its answers do not fit the questions (saying which and why)."""
    action = answer.get("action") if isinstance(answer, dict) else None
    if action != "accept":
        why = "declined in the ACP client" if action == "decline" else "cancelled in the ACP client"
        return QuestionReply(decline=True, reason=why)
    content = answer.get("content") if isinstance(answer, dict) else None
    answers = {key: value for key, value in (content or {}).items() if any(q.id == key for q in questions)} \
        if isinstance(content, dict) else {}
    problems = answer_problems(questions, answers)
    if problems:
        field, why = problems[0]
        return QuestionReply(decline=True, reason=f"the ACP client's answer does not fit: {field} {why}"[:2000])
    try:
        return QuestionReply(answers=answers)
    except ValueError as exc:
        return QuestionReply(decline=True, reason=f"the ACP client's answer does not fit: {exc}"[:2000])


def is_terminal(event: NormalizedEvent) -> bool:
    return event.type in (EventType.TASK_COMPLETED, EventType.TASK_FAILED, EventType.TASK_STOPPED)
