"""A runtime's question, asked on the terminal while its task streams: each question in turn, its choices numbered.

Type a choice's number or label (several, comma-separated, where several may be chosen), or text where any is
taken; an empty line takes the default (or skips a question that is not required); ``!`` declines the whole
request. An answer the question does not allow is said why and asked again. Used by ``codesdk run`` in-process
(the engine's answerer) and against a service (the client's).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence

from codesdk.protocol import AnswerValue, Question, QuestionReply, value_problem

from .common import LineReader, read_terminal

#: Tries at one question before the request is declined.
ATTEMPTS = 3
DECLINE = "!"


class Declined(Exception):
    """The user declined the request (``!``), or gave up on a question."""


def describe(question: Question) -> str:
    """The question as shown: its header and text, its numbered choices, and what an empty line means."""
    lines = [f"  {question.header}: {question.text}" if question.header else f"  {question.text}"]
    for number, option in enumerate(question.options, 1):
        lines.append(f"    {number}. {option.label}" + (f" — {option.description}" if option.description else ""))
    schema = question.answer_schema
    hints = []
    if question.multi_select:
        hints.append("several, comma-separated")
    if question.allow_other and question.options:
        hints.append("or type your own")
    if schema is not None and schema.type:
        hints.append(schema.type + (" true/false" if schema.type == "boolean" else ""))
    if question.default is not None:
        hints.append(f"empty: {question.default}")
    elif not question.required:
        hints.append("empty: skip")
    hints.append(f"{DECLINE} declines")
    return "\n".join(lines) + f"\n  ({'; '.join(hints)}) > "


def parse(question: Question, text: str) -> AnswerValue | None:
    """What a typed line means for ``question`` (None: no answer, for an empty line). Unchecked: ``value_problem``
    says whether the question allows it."""
    text = text.strip()
    if not text:
        return question.default
    labels = [o.label for o in question.options]
    kind = question.answer_schema.type if question.answer_schema is not None else None
    if question.multi_select or kind == "array":
        return [_choice(part.strip(), labels) for part in text.split(",") if part.strip()]
    if labels:
        return _choice(text, labels)
    if kind == "boolean":
        return {"y": True, "yes": True, "true": True, "n": False, "no": False, "false": False}.get(text.lower(), text)
    if kind in ("integer", "number"):
        try:
            number = float(text) if kind == "number" or "." in text else int(text)
        except ValueError:
            return text
        return number if not isinstance(number, float) or math.isfinite(number) else text
    return text


def _choice(text: str, labels: list[str]) -> str:
    """A choice by its number or its label; anything else as typed (the question says whether it takes it)."""
    if text.isdigit() and 1 <= int(text) <= len(labels) and text not in labels:
        return labels[int(text) - 1]
    return text


async def ask_on_terminal(message: str, questions: Sequence[Question],
                          read: LineReader = read_terminal) -> QuestionReply:
    """Ask each question in turn, each answer read by ``read``; the reply (a decline when the user types ``!``, gives
    up, or stdin ends)."""
    sys.stderr.write(f"\n? {message}\n" if message else "\n? the runtime asks:\n")
    answers: dict[str, AnswerValue] = {}
    try:
        for question in questions:
            answers.update(await _ask_one(question, read))
    except Declined as why:
        return QuestionReply(decline=True, reason=f"declined on the terminal ({why})")
    return QuestionReply(answers=answers)


async def _ask_one(question: Question, read: LineReader) -> dict[str, AnswerValue]:
    prompt = describe(question)
    for _ in range(ATTEMPTS):
        line = await read(prompt, question.secret)
        if line is None:
            raise Declined("stdin is closed")
        if line.strip() == DECLINE:
            raise Declined("declined")
        value = parse(question, line)
        if value is None:
            if not question.required:
                return {}
            sys.stderr.write("  an answer is needed\n")
            continue
        why = value_problem(question, value)
        if why is None:
            return {question.id: value}
        sys.stderr.write(f"  {why}\n")
        prompt = "  > "
    raise Declined(f"no answer {question.id!r} allows after {ATTEMPTS} tries")

