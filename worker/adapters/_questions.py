"""Questions of one task waiting for their user's answer: the runtime waits, the supervisor's answer wakes it.

An adapter reports its runtime's question as ``question.requested`` with an id of its own (``new_ask_id``) and
waits here; ``runtime.sendAnswer`` delivers the answer (checked by the supervisor against the question) or a
decline with its reason. Each question is answered at most once.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from collections.abc import Awaitable, Callable
from typing import Any

import trio
from pydantic import ValidationError

from codesdk.protocol import Answers, AnswerSchema, EventType, Question, QuestionRequested, QuestionSource

#: How a question is reported: the task's ``TaskIO.emit``.
Emit = Callable[[EventType, QuestionRequested], Awaitable[None]]


class UnknownQuestion(LookupError):
    """An answer named a question that isn't waiting for one."""


@dataclass(frozen=True)
class QuestionAnswer:
    """The supervisor's answer to one question: answers keyed by question id, or a decline with its reason."""

    answers: Answers = field(default_factory=dict)
    declined: bool = False
    reason: str = ""


class PendingQuestions:
    """Questions asked and not yet answered."""

    def __init__(self, prefix: str = "ask") -> None:
        self._prefix = prefix
        self._numbers = itertools.count(1)
        self._waiting: dict[str, trio.Event] = {}
        self._answers: dict[str, QuestionAnswer] = {}

    def new_ask_id(self) -> str:
        """An id for the next question, unique within the task (the supervisor gives it one of its own too)."""
        return f"{self._prefix}-{next(self._numbers)}"

    def expect(self, ask_id: str) -> None:
        if ask_id in self._waiting or ask_id in self._answers:
            raise ValueError(f"question {ask_id!r} is already known in this task")
        self._waiting[ask_id] = trio.Event()

    def answer(self, ask_id: str, answer: QuestionAnswer) -> None:
        event = self._waiting.get(ask_id)
        if event is None or event.is_set():
            raise UnknownQuestion(f"no pending question {ask_id!r}")
        self._answers[ask_id] = answer
        event.set()

    async def wait(self, ask_id: str) -> QuestionAnswer:
        try:
            await self._waiting[ask_id].wait()
        finally:
            self._waiting.pop(ask_id, None)
        return self._answers.pop(ask_id)

    def pending(self) -> list[str]:
        return [ask for ask, event in self._waiting.items() if not event.is_set()]

    async def ask(self, emit: Emit, source: QuestionSource, questions: list[Question], message: str = "",
                  origin: str = "") -> QuestionAnswer:
        """Put the runtime's question to its user (``question.requested``) and wait for the supervisor's answer."""
        ask_id = self.new_ask_id()
        self.expect(ask_id)
        await emit(EventType.QUESTION_REQUESTED, QuestionRequested(
            question_id=ask_id, source=source, message=message[:20_000], origin=origin[:200],
            questions=tuple(questions)))
        return await self.wait(ask_id)


class AnswersQuestions:
    """The question half of a task handle whose runtime waits on ``PendingQuestions`` (``self.questions``)."""

    questions: PendingQuestions

    def send_answer(self, question_id: str, answer: QuestionAnswer) -> None:
        self.questions.answer(question_id, answer)


def form_questions(schema: object) -> list[Question]:
    """An MCP form elicitation's ``requestedSchema`` (a flat object of primitive properties) as one question per
    property; ValueError for a schema CodeSDK cannot ask by."""
    if not isinstance(schema, dict) or not isinstance(schema.get("properties"), dict):
        raise ValueError("the elicitation has no requested schema with properties")
    required = set(schema.get("required") or [])
    questions = []
    for name, prop in schema["properties"].items():
        if not isinstance(prop, dict):
            raise ValueError(f"property {name!r} is not a schema")
        try:
            answer_schema = AnswerSchema.model_validate(prop)
        except ValidationError as exc:
            raise ValueError(f"property {name!r}: {exc.errors()[0]['msg']}") from None
        default = prop.get("default")
        questions.append(Question(
            id=str(name)[:200], header=str(prop.get("title") or "")[:1000],
            text=str(prop.get("description") or prop.get("title") or name)[:20_000], answer_schema=answer_schema,
            required=name in required, default=default if isinstance(default, (str, int, float, bool)) else None))
    if not questions:
        raise ValueError("the elicitation asks nothing")
    return questions


def form_answer(answer: QuestionAnswer) -> dict[str, Any]:
    """An elicitation's result: accepted with the answers as its content, or declined."""
    if answer.declined:
        return {"action": "decline"}
    return {"action": "accept", "content": dict(answer.answers)}
