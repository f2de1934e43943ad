"""Questions a runtime asks its user: one typed model for every source, and the check of an answer against it.

A runtime's question arrives in many shapes — Codex's ``requestUserInput`` (1-3 questions with options, free text
besides them, secret input), an MCP server's elicitation form (a flat JSON schema), Claude Code's
``AskUserQuestion`` (questions with options, several choosable). Each becomes one ``QuestionRequested``: a list of
``Question`` s, each answered by one value, keyed by the question's ``id``. ``answer_problems`` says what is wrong
with an answer (the field and why), so the API refuses it as 422 naming the field and the runtime only ever gets
answers its question allows. Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeAlias

from pydantic import (
    AliasChoices,
    ConfigDict,
    Field,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    confloat,
    conint,
)
from pydantic_core import PydanticCustomError

from ._base import Model

if TYPE_CHECKING:
    FiniteFloat: TypeAlias = float
    _Count: TypeAlias = int
else:  # constraints that property tests (hypothesis) generate within, not only check
    FiniteFloat = confloat(ge=-1e300, le=1e300)  # JSON has no NaN or infinity
    _Count = conint(ge=0, le=2**31)

def _one_answer(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    """One error saying what an answer may be, not one per kind it is not (``null``, an object)."""
    try:
        return handler(value)
    except ValidationError:
        raise PydanticCustomError(
            "answer_value", "must be text, a number, true/false or a list of text (a finite number at most 1e300)",
        ) from None


#: One question's answer: a choice's label or typed text, a number, a yes/no, or several labels.
#: (A smart union: a JSON value keeps its own type — ``true`` a bool, ``1`` an int, ``"1"`` text.)
AnswerValue: TypeAlias = Annotated[bool | int | FiniteFloat | str | list[str], WrapValidator(_one_answer)]
#: Answers keyed by question id.
Answers: TypeAlias = dict[str, AnswerValue]

#: The most questions one request holds, and the longest text of any one answer.
MAX_QUESTIONS = 32
MAX_ANSWER_CHARS = 20_000


class QuestionSource(StrEnum):
    """Where a question came from: what a runtime's ``user_questions`` capability lists."""

    CODEX_USER_INPUT = "codex.request_user_input"
    CLAUDE_ASK_USER = "claude.ask_user_question"
    MCP_ELICITATION = "mcp.elicitation"
    ACP_ELICITATION = "acp.elicitation"
    SCRIPTED = "scripted"


class QuestionState(StrEnum):
    """Where a question stands: pending until answered or declined, exactly once."""

    PENDING = "pending"
    ANSWERED = "answered"
    DECLINED = "declined"


class AnsweredVia(StrEnum):
    """Who settled a question: its user, the operator's fallback on expiry, the task's end, or CodeSDK refusing
    it outright (a task nobody can be asked in)."""

    USER = "user"
    FALLBACK = "fallback"
    TASK_END = "task_end"
    REFUSED = "refused"


class QuestionOption(Model):
    label: str = Field(min_length=1, max_length=1000)
    description: str = Field(default="", max_length=4000)


class Question(Model):
    """One question, answered by one value.

    The answer is checked against, in this order: ``answer_schema`` (a JSON schema of one primitive value, as an
    MCP elicitation form property: string / number / integer / boolean, ``enum`` / ``oneOf`` consts, or an array
    of such strings); else ``options`` (one label, a list of labels with ``multi_select``; any text too with
    ``allow_other``); else free text. ``default`` is what the operator's ``default`` fallback answers on expiry.
    """

    id: str = Field(min_length=1, max_length=200)
    text: str = Field(default="", max_length=20_000)
    header: str = Field(default="", max_length=1000)
    options: tuple[QuestionOption, ...] = Field(default=(), max_length=100)
    multi_select: bool = False
    allow_other: bool = False
    #: The answer is a secret (a password, a token): stored and streamed redacted, sent to the runtime as typed.
    secret: bool = False
    answer_schema: AnswerSchema | None = None
    required: bool = True
    default: AnswerValue | None = None


class QuestionRequested(Model):
    """A runtime asks its user something (``question.requested``): stored before anyone is asked, answered once
    (``question.answered``). A worker sends it with its own ``question_id`` and no ``expires_at``; the supervisor
    stores it with the time it expires at (None: refused at once, nobody was asked)."""

    question_id: str = Field(min_length=1, max_length=200)
    source: QuestionSource
    #: What the runtime said with its questions (an elicitation's message), and who asked (an MCP server's name).
    message: str = Field(default="", max_length=20_000)
    origin: str = Field(default="", max_length=200)
    #: (Their ids are unique: a request whose ids repeat is declined — ``duplicate_ids``.)
    questions: tuple[Question, ...] = Field(min_length=1, max_length=MAX_QUESTIONS)
    expires_at: datetime | None = None



class QuestionAnswered(Model):
    """The one answer to a ``question.requested``: answers keyed by question id, or a decline with its reason.
    A secret question's answer is stored as ``REDACTED``."""

    question_id: str
    answers: Answers = Field(default_factory=dict)
    declined: bool = False
    reason: str = ""
    answered_via: AnsweredVia
    #: Whose answer it is: ``api:<token name>``, ``terminal``, ``codesdk``.
    answered_by: str = ""


class QuestionEscalated(Model):
    """A question still unanswered ``pending_s`` after it was asked (``serve --escalate-after``): recorded once,
    between its ``question.requested`` and its ``question.answered``, so that a second target (a webhook subscribed
    to ``question.escalated``) is told. The question still settles at ``expires_at``."""

    question_id: str
    pending_s: float = Field(ge=0, le=1e9, allow_inf_nan=False)  # finite: JSON has no infinity
    expires_at: datetime


#: What a secret answer is stored and streamed as.
REDACTED = "[secret]"


class QuestionReply(Model):
    """An answer as whoever answers gives it (the API's body, a terminal, an embedding app): the answers, or a
    decline. The runtime gets exactly this."""

    answers: Answers = Field(default_factory=dict)
    decline: bool = False
    reason: str = Field(default="", max_length=2000)


def duplicate_ids(questions: Sequence[Question]) -> list[str]:
    """The question ids that occur more than once in a request (an answer could not say which it answers)."""
    ids = [q.id for q in questions]
    return sorted({i for i in ids if ids.count(i) > 1})


def answer_problems(questions: Sequence[Question], answers: Mapping[str, Any]) -> list[tuple[str, str]]:
    """What is wrong with ``answers`` to ``questions``: (the field, ``answers.<question id>``, and why) for each
    answer of a question not asked, each required question left unanswered, each answer its question does not
    allow. Empty: the answers are good."""
    asked = {q.id: q for q in questions}
    problems = [(f"answers.{key}", f"no question {key!r} was asked (asked: {', '.join(asked)})")
                for key in answers if key not in asked]
    for question in questions:
        field = f"answers.{question.id}"
        if question.id not in answers:
            if question.required:
                problems.append((field, "required: this question needs an answer (or decline the whole request)"))
            continue
        why = value_problem(question, answers[question.id])
        if why is not None:
            problems.append((field, why))
    return problems


def value_problem(question: Question, value: object) -> str | None:
    """Why ``value`` does not answer ``question`` (None: it does)."""
    if question.answer_schema is not None:
        return schema_problem(question.answer_schema, value)
    labels = [o.label for o in question.options]
    if question.multi_select and labels:
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            return f"must be a list of choices from {_listing(labels)}"
        if not value and question.required:
            return "choose at least one"
        for item in value:
            if why := _choice_problem(item, labels, question.allow_other):
                return why
        return None
    if not isinstance(value, str):
        return f"must be one of {_listing(labels)}" if labels else "must be text"
    if labels:
        return _choice_problem(value, labels, question.allow_other)
    if question.required and not value.strip():
        return "must not be empty: the question needs an answer (or decline it)"
    return _text_problem(value)


def _choice_problem(value: str, labels: list[str], allow_other: bool) -> str | None:
    if value in labels:
        return None
    if allow_other:
        return _text_problem(value) if value.strip() else "must not be empty"
    return f"{value!r} is not a choice; choose one of {_listing(labels)}"


def _text_problem(value: str) -> str | None:
    return f"is longer than {MAX_ANSWER_CHARS} characters" if len(value) > MAX_ANSWER_CHARS else None


def _listing(labels: Sequence[object]) -> str:
    shown = ", ".join(repr(label) for label in labels[:10])
    return shown + (" …" if len(labels) > 10 else "")


# --- the JSON schema of one primitive value (an MCP elicitation form property) --------------------------------

Const: TypeAlias = bool | int | FiniteFloat | str


class SchemaChoice(Model):
    """One titled choice of a schema's ``oneOf`` / ``anyOf``: ``{"const": …, "title": …}``."""

    model_config = ConfigDict(extra="ignore")
    const: Const
    title: str = ""


class _ValueSchema(Model):
    # an MCP server's schema may say more (``$schema``, ``default`` …): what is not checked is not kept
    model_config = ConfigDict(extra="ignore")
    type: Literal["string", "number", "integer", "boolean", "array"] | None = None
    enum: tuple[Const, ...] | None = None
    one_of: tuple[SchemaChoice, ...] | None = Field(default=None, validation_alias=AliasChoices("one_of", "oneOf"))
    any_of: tuple[SchemaChoice, ...] | None = Field(default=None, validation_alias=AliasChoices("any_of", "anyOf"))

    def allowed(self) -> list[Const] | None:
        """The values it allows by ``enum`` or titled choices (None: any of its type)."""
        if self.enum is not None:
            return list(self.enum)
        choices = self.one_of or self.any_of
        return [c.const for c in choices] if choices else None


class ItemSchema(_ValueSchema):
    """What each item of an array answer must be (text, maybe of a closed set)."""


class AnswerSchema(_ValueSchema):
    """The JSON schema of one answer, as an MCP elicitation form gives each property: its ``type``, a closed set
    (``enum``, or ``oneOf``/``anyOf`` of ``const``), lengths, bounds, and for an array its items. camelCase keys
    (``minLength`` …) are read as the snake_case fields. Without a ``type`` any answer value is taken."""

    title: str = ""
    description: str = ""
    format: str | None = None
    min_length: _Count | None = Field(default=None, validation_alias=AliasChoices("min_length", "minLength"))
    max_length: _Count | None = Field(default=None, validation_alias=AliasChoices("max_length", "maxLength"))
    minimum: FiniteFloat | None = None
    maximum: FiniteFloat | None = None
    min_items: _Count | None = Field(default=None, validation_alias=AliasChoices("min_items", "minItems"))
    max_items: _Count | None = Field(default=None, validation_alias=AliasChoices("max_items", "maxItems"))
    items: ItemSchema | None = None


def schema_problem(schema: AnswerSchema, value: object) -> str | None:
    """Why ``value`` breaks ``schema`` (None: it holds)."""
    kind = schema.type
    if kind == "boolean":
        return None if isinstance(value, bool) else "must be true or false"
    if kind in ("number", "integer"):
        return _number_problem(schema, value, integer=kind == "integer")
    if kind == "string":
        if not isinstance(value, str):
            return "must be text"
        return _string_problem(schema, value)
    if kind == "array":
        return _array_problem(schema, value)
    return None if _is_answer_value(value) else "must be text, a number, true/false or a list of text"


def _number_problem(schema: AnswerSchema, value: object, *, integer: bool) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return "must be a whole number" if integer else "must be a number"
    if integer and not isinstance(value, int) and not float(value).is_integer():
        return "must be a whole number"
    if schema.minimum is not None and value < schema.minimum:
        return f"must be at least {schema.minimum:g}"
    if schema.maximum is not None and value > schema.maximum:
        return f"must be at most {schema.maximum:g}"
    return _enum_problem(schema, value)


def _string_problem(schema: AnswerSchema, value: str) -> str | None:
    if schema.min_length is not None and len(value) < schema.min_length:
        return f"must be at least {schema.min_length} characters"
    if schema.max_length is not None and len(value) > schema.max_length:
        return f"must be at most {schema.max_length} characters"
    return _enum_problem(schema, value) or _text_problem(value)


def _array_problem(schema: AnswerSchema, value: object) -> str | None:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        return "must be a list of text"
    if schema.min_items is not None and len(value) < schema.min_items:
        return f"must hold at least {schema.min_items} item(s)"
    if schema.max_items is not None and len(value) > schema.max_items:
        return f"must hold at most {schema.max_items} item(s)"
    if schema.items is not None:
        for item in value:
            if why := _enum_problem(schema.items, item) or _text_problem(item):
                return f"item {item!r}: {why}"
    return None


def _enum_problem(schema: _ValueSchema, value: object) -> str | None:
    allowed = schema.allowed()
    if allowed is None or any(_same(value, choice) for choice in allowed):
        return None
    return f"{value!r} is not a choice; choose one of {_listing(allowed)}"


def _same(value: object, choice: object) -> bool:
    if isinstance(value, bool) or isinstance(choice, bool):
        return type(value) is type(choice) and value == choice
    return value == choice and (isinstance(value, str) == isinstance(choice, str))


def _is_answer_value(value: object) -> bool:
    if isinstance(value, list):
        return all(isinstance(item, str) for item in value)
    if isinstance(value, float):
        return math.isfinite(value)
    return isinstance(value, (str, bool, int))


def redacted(questions: Sequence[Question], answers: Mapping[str, AnswerValue]) -> Answers:
    """``answers`` as stored: a secret question's answer replaced by ``REDACTED``."""
    secret = {q.id for q in questions if q.secret}
    return {key: (REDACTED if key in secret else value) for key, value in answers.items()}


def default_answers(questions: Sequence[Question]) -> Answers | None:
    """The answers the operator's ``default`` fallback gives: every question's ``default`` (questions that are
    not required may have none). None when a required question has no default: that request is declined."""
    answers: Answers = {}
    for question in questions:
        if question.default is not None:
            answers[question.id] = question.default
        elif question.required:
            return None
    return answers if not answer_problems(questions, answers) else None


#: The answers field's type in an API body: validated there, then checked against the question.
AnswersField = Annotated[Answers, Field(max_length=MAX_QUESTIONS)]
