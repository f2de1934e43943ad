"""Transcript messages sent to a runtime in ``runtime.startTask`` and derived from stored events."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import Field

from ._base import Model


class Role(StrEnum):
    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


class TextBlock(Model):
    type: Literal["text"] = "text"
    text: str


class CodeBlock(Model):
    type: Literal["code"] = "code"
    code: str
    language: str | None = None


class ThinkingBlock(Model):
    type: Literal["thinking"] = "thinking"
    text: str


class ToolUseBlock(Model):
    type: Literal["tool_use"] = "tool_use"
    tool_call_id: str
    name: str
    input: dict[str, Any] = Field(default_factory=dict)


class ToolResultBlock(Model):
    type: Literal["tool_result"] = "tool_result"
    tool_call_id: str
    content: Any = None
    is_error: bool = False
    denied: bool = False
    #: The call never finished (its task ended first); this result was written when the transcript was compiled.
    interrupted: bool = False
    #: The blob holding the whole output, when ``content`` is the output itself or stands for it.
    content_ref: str | None = None


ContentBlock = Annotated[
    TextBlock | CodeBlock | ThinkingBlock | ToolUseBlock | ToolResultBlock,
    Field(discriminator="type"),
]


class Message(Model):
    role: Role
    blocks: tuple[ContentBlock, ...] = ()

    @classmethod
    def user_text(cls, text: str) -> Message:
        return cls(role=Role.USER, blocks=(TextBlock(text=text),))

    def text(self) -> str:
        """Concatenated text of the message's text and code blocks."""
        parts: list[str] = []
        for block in self.blocks:
            if isinstance(block, TextBlock):
                parts.append(block.text)
            elif isinstance(block, CodeBlock):
                parts.append(block.code)
        return "".join(parts)
