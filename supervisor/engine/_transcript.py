"""A session's transcript, derived from its stored events (the store is the only source of truth).

The last task's compiled input (``model.input`` -> blob; its ``transcript_ref`` when the context budget left
part of the transcript out of what was sent) holds every message up to and including its prompt; the events
after it add the assistant's output and the tool calls and results. So the next task's messages are: that
input + what the last task produced. Only the events that make messages are read
(filtered in SQL, a page at a time): memory grows with the transcript, never with the session's deltas.
"""

from __future__ import annotations

import json
from typing import Any

from codesdk.protocol import (
    BlockKind,
    CodeBlock,
    ContentBlock,
    EventType,
    InputDelivery,
    Message,
    ModelInputAppended,
    ModelInput,
    ModelOutputCompleted,
    NormalizedEvent,
    Role,
    TextBlock,
    ToolCallCompleted,
    ToolCallDenied,
    ToolCallRequested,
    ToolResultBlock,
    ToolUseBlock,
)

from ..store import StoreReader

PAGE = 1000


async def session_events(store: StoreReader, session_id: str) -> list[NormalizedEvent]:
    events: list[NormalizedEvent] = []
    while True:
        page = await store.read(session_id, after_seq=events[-1].seq if events else 0, limit=PAGE)
        events += page
        if len(page) < PAGE:
            return events


#: The event types a transcript is made of (after the last model.input).
TRANSCRIPT_TYPES = (EventType.MODEL_OUTPUT_COMPLETED, EventType.TOOL_CALL_REQUESTED, EventType.TOOL_CALL_COMPLETED,
                    EventType.TOOL_CALL_DENIED, EventType.MODEL_INPUT_APPENDED)


async def derive_transcript(store: StoreReader, session_id: str, *, queued: bool = True) -> list[Message]:
    """The session's messages. A user's inputs are user messages where the runtime took them (steering); those it
    never took (``queued``, carried into the next task) close the transcript unless ``queued`` is false — the next
    task's compile puts them into its prompt instead (``carried_inputs``)."""
    last_input = await store.last_event_of_type(session_id, EventType.MODEL_INPUT)
    if last_input is None:
        return []
    payload = last_input.payload
    assert isinstance(payload, ModelInput)
    compiled = json.loads(await store.get_blob(payload.transcript_ref or payload.input_ref))
    messages = [Message.model_validate(m) for m in compiled.get("messages", [])]
    later: list[NormalizedEvent] = []
    after = last_input.seq
    while page := await store.read_types(session_id, TRANSCRIPT_TYPES, after, PAGE, task_id=last_input.trace.task_id):
        later += page
        after = page[-1].seq
    if not queued:
        later = [e for e in later if not _is_queued(e)]
    messages += await _messages_from(store, later)
    return messages


def _is_queued(event: NormalizedEvent) -> bool:
    return isinstance(event.payload, ModelInputAppended) and event.payload.delivery == InputDelivery.QUEUED


async def carried_inputs(store: StoreReader, session_id: str) -> list[ModelInputAppended]:
    """The inputs the session's last task did not deliver (``queued``), in the order they were sent: its next task
    carries them."""
    last_input = await store.last_event_of_type(session_id, EventType.MODEL_INPUT)
    if last_input is None:
        return []
    found: list[ModelInputAppended] = []
    after = last_input.seq
    while page := await store.read_types(session_id, (EventType.MODEL_INPUT_APPENDED,), after, PAGE,
                                         task_id=last_input.trace.task_id):
        after = page[-1].seq
        found += [e.payload for e in page if _is_queued(e) and isinstance(e.payload, ModelInputAppended)]
    return found


async def _messages_from(store: StoreReader, events: list[NormalizedEvent]) -> list[Message]:
    """Turn one task's output events into assistant messages and tool-result messages."""
    out: list[Message] = []
    assistant: list[ContentBlock] = []
    results: list[ContentBlock] = []

    def flush_assistant() -> None:
        if assistant:
            out.append(Message(role=Role.ASSISTANT, blocks=tuple(assistant)))
            assistant.clear()

    def flush_results() -> None:
        if results:
            out.append(Message(role=Role.TOOL, blocks=tuple(results)))
            results.clear()

    for event in events:
        payload = event.payload
        if isinstance(payload, ModelInputAppended):  # the user's, where the runtime took it
            flush_assistant()
            flush_results()
            out.append(Message.user_text(payload.text))
        elif isinstance(payload, ModelOutputCompleted) and payload.kind != BlockKind.THINKING:
            flush_results()
            if payload.kind == BlockKind.CODE:
                assistant.append(CodeBlock(code=payload.text, language=payload.language))
            else:
                assistant.append(TextBlock(text=payload.text))
        elif isinstance(payload, ToolCallRequested) and event.type == EventType.TOOL_CALL_REQUESTED:
            flush_results()
            tool_input = payload.input
            if tool_input is None and payload.input_ref:
                tool_input = json.loads(await store.get_blob(payload.input_ref))
            assistant.append(ToolUseBlock(tool_call_id=payload.tool_call_id, name=payload.tool_name,
                                          input=tool_input or {}))
        elif isinstance(payload, ToolCallCompleted):
            flush_assistant()
            content: Any = payload.result_preview
            if payload.result_ref:
                content = json.loads(await store.get_blob(payload.result_ref))
            results.append(ToolResultBlock(tool_call_id=payload.tool_call_id, content=content,
                                           is_error=payload.is_error, content_ref=payload.result_ref))
        elif isinstance(payload, ToolCallDenied):
            flush_assistant()
            results.append(ToolResultBlock(tool_call_id=payload.tool_call_id, content=payload.reason,
                                           denied=True, is_error=True))
    flush_assistant()
    flush_results()
    return out
