"""A task's input, compiled from the session's transcript once its worker is known: calls that never finished
answered as interrupted, the whole fitted to the runtime's context budget, stored before it is sent.

The worker's adapter then decides what its runtime is given (its own session taken up again, or this input
rendered as the first prompt of a new one) and says so; the engine records both in ``model.input``.
"""

from __future__ import annotations

from typing import Protocol

from codesdk.protocol import (
    ContextReport,
    Message,
    ModelInput,
    StartTaskParams,
    ToolUseBlock,
    canonical_json,
    fit_to_budget,
    input_budget,
    repair_unfinished_calls,
    sha256_hex,
)

from ..store import BlobStore, StoreReader
from ._ports import WorkerLink
from ._transcript import carried_inputs, derive_transcript


def context_window(worker: WorkerLink, runtime: str) -> int | None:
    """The window the worker's runtime declares (None: it declares none, or the worker does not host it)."""
    info = worker.info
    offer = next((o for o in info.runtimes if o.name == runtime), None) if info is not None else None
    return offer.capabilities.context_window_tokens if offer is not None else None


class StoreForInput(StoreReader, BlobStore, Protocol):
    """What compiling needs of the store: the transcript's events and blobs, and a place for the result."""


async def compile_input(store: StoreForInput, params: StartTaskParams, prompt: str, *, window_tokens: int | None,
                        max_input_tokens: int | None, switched_from: str | None,
                        ) -> tuple[StartTaskParams, ModelInput]:
    """``params`` with the compiled messages, and the ``model.input`` to record (the worker adds how its runtime
    was given them). ``ContextTooLarge`` when the request alone exceeds the budget: nothing is stored then."""
    session_id = params.session.session_id
    transcript, interrupted = repair_unfinished_calls(await derive_transcript(store, session_id, queued=False))
    carried = await carried_inputs(store, session_id)  # what the last task's runtime never took opens this prompt
    messages = (*transcript, Message.user_text("\n\n".join([*(c.text for c in carried), prompt])))
    budget = input_budget(window_tokens, max_input_tokens)
    report: ContextReport | None = None
    sent = messages
    if budget is not None:
        sent, report = fit_to_budget(messages, budget, window_tokens=window_tokens, max_input_tokens=max_input_tokens)
    params = params.model_copy(update={"messages": sent})
    compiled_json = canonical_json(params.model_dump(mode="json", exclude={"trace"}))
    transcript_ref = None
    if sent != messages:  # the next task compiles from the whole transcript, not from what was sent of it
        transcript_ref = await store.put_blob(canonical_json({"messages": [m.to_json_obj() for m in messages]}),
                                              "application/json", session_id=params.session.session_id)
    sent_ids = {b.tool_call_id for m in sent for b in m.blocks if isinstance(b, ToolUseBlock)}
    model_input = ModelInput(
        input_ref=await store.put_blob(compiled_json, "application/json", session_id=params.session.session_id),
        input_hash=sha256_hex(compiled_json),
        message_count=len(sent), tool_names=tuple(params.tool_manifest.names()), switched_from=switched_from,
        interrupted_calls=tuple(c for c in interrupted if c.tool_call_id in sent_ids), context=report,
        transcript_ref=transcript_ref, carried_inputs=tuple(c.input_id for c in carried))
    return params, model_input

