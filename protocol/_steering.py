"""Steering: a user's message added to a running task (``runtime.sendInput``, ``model.input.appended``).

A runtime either takes it into the turn it is running (``mid_turn``: Claude Code's streaming input, Codex's
``turn/steer``, the scripted runtime) or keeps it for its next turn (``next_turn``: ACP v1 has no way in). Every
task here is one turn, so an input a runtime could not deliver before its task ended is carried into the session's
next task: it opens that task's prompt. The worker reports each input once, when it is delivered or carried.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import Field, field_validator

from ._base import Model
from ._canonical import canonical_hash
from ._transcript import CodeBlock, TextBlock

#: The most characters one input may carry (its text blocks together): a message, not a file.
MAX_INPUT_CHARS = 100_000


class SteeringSupport(StrEnum):
    """What a runtime does with an input sent while its turn runs (capability ``steering``)."""

    MID_TURN = "mid_turn"  # delivered into the running turn, at its next model request
    NEXT_TURN = "next_turn"  # kept for its next turn: the session's next task


class InputDelivery(StrEnum):
    """How one input reaches the runtime: into the running turn, or queued for the next one."""

    MID_TURN = "mid_turn"
    QUEUED = "queued"


#: A block of an input: text or code, as a task's prompt messages hold them.
InputBlock = Annotated[TextBlock | CodeBlock, Field(discriminator="type")]


def input_text(value: str | tuple[TextBlock | CodeBlock, ...]) -> str:
    """An input's text: the string itself, or its blocks' text joined by blank lines."""
    if isinstance(value, str):
        return value
    return "\n\n".join(block.text if isinstance(block, TextBlock) else block.code for block in value)


def input_hash(value: str | tuple[TextBlock | CodeBlock, ...]) -> str:
    """The canonical hash of an input as it was given (a string, or its blocks)."""
    return canonical_hash(value if isinstance(value, str) else [block.to_json_obj() for block in value])


class SendInputParams(Model):
    """``runtime.sendInput``: add ``input`` to the running task ``task_id``; ``input_id`` names it (unique in the
    session) in the event that reports its delivery."""

    task_id: str
    input_id: str = Field(min_length=1, max_length=200)
    input: str | tuple[InputBlock, ...]

    @field_validator("input")
    @classmethod
    def _not_empty(cls, value: str | tuple[TextBlock | CodeBlock, ...]) -> str | tuple[TextBlock | CodeBlock, ...]:
        text = input_text(value)
        if not text.strip():
            raise ValueError("an input must hold some text")
        if len(text) > MAX_INPUT_CHARS:
            raise ValueError(f"an input holds at most {MAX_INPUT_CHARS} characters (this one {len(text)})")
        return value

    def text(self) -> str:
        return input_text(self.input)

    def hash(self) -> str:
        return input_hash(self.input)


class SendInputResult(Model):
    """How the runtime will take the input: now, into the running turn, or queued for its next turn."""

    input_id: str
    delivery: InputDelivery


class ModelInputAppended(Model):
    """An input the runtime was given while its task ran (``mid_turn``: before request ``before_request_id``,
    after tool call ``after_tool_call_id`` where the runtime tells), or that it could not take before the task
    ended (``queued``: carried into the session's next task, whose prompt it opens)."""

    input_id: str
    text: str
    input_hash: str
    delivery: InputDelivery
    before_request_id: str | None = None
    after_tool_call_id: str | None = None
