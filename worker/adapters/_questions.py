"""Questions of one task waiting for their user's answer: the runtime waits, the supervisor's answer wakes it.

An adapter reports its runtime's question as ``question.requested`` with an id of its own (``new_ask_id``) and
waits here; ``runtime.sendAnswer`` delivers the answer (checked by the supervisor against the question) or a
decline with its reason. Each question is answered at most once.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import trio

from codesdk.protocol import Answers


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


class AnswersQuestions:
    """The question half of a task handle whose runtime waits on ``PendingQuestions`` (``self.questions``)."""

    questions: PendingQuestions

    def send_answer(self, question_id: str, answer: QuestionAnswer) -> None:
        self.questions.answer(question_id, answer)
