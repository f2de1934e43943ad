"""Codex's questions to its user, in CodeSDK's terms and back: ``item/tool/requestUserInput`` (the model's
``request_user_input`` tool) and ``mcpServer/elicitation/request`` (an MCP server's form). Pure functions.

``requestUserInput``: ``{questions: [{id, header, question, isOther, isSecret, options: [{label, description}] |
null}]}`` → one ``Question`` each (choices, free text besides them with ``isOther``, secret input); answered
``{"answers": {id: {"answers": [...]}}}`` — nothing for a declined request (Codex has no decline word).

An elicitation in form mode: ``{message, requestedSchema: {type: "object", properties, required}}`` → one
``Question`` per property (its schema checks the answer); answered ``{"action": "accept", "content": {...}}`` or
``{"action": "decline"}``. URL mode asks the user to open a page, which CodeSDK cannot show: declined.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from codesdk.protocol import AnswerSchema, Question, QuestionOption

from .._questions import QuestionAnswer


def user_input_questions(params: dict[str, Any]) -> list[Question]:
    """The questions of a ``requestUserInput`` (ValueError when it has none CodeSDK can ask)."""
    questions = []
    for index, raw in enumerate(params.get("questions") or []):
        if not isinstance(raw, dict):
            continue
        options = [QuestionOption(label=str(o.get("label")), description=str(o.get("description") or ""))
                   for o in raw.get("options") or [] if isinstance(o, dict) and o.get("label")]
        questions.append(Question(
            id=str(raw.get("id") or f"q{index + 1}")[:200], header=str(raw.get("header") or "")[:1000],
            text=str(raw.get("question") or "")[:20_000], options=tuple(options),
            allow_other=bool(raw.get("isOther")), secret=bool(raw.get("isSecret"))))
    if not questions:
        raise ValueError("requestUserInput without questions")
    return questions


def user_input_answer(answer: QuestionAnswer) -> dict[str, Any]:
    """The ``ToolRequestUserInputResponse``: each answer as Codex's list of strings."""
    if answer.declined:
        return {"answers": {}}
    return {"answers": {qid: {"answers": value if isinstance(value, list) else [_text(value)]}
                        for qid, value in answer.answers.items()}}


def elicitation_questions(params: dict[str, Any]) -> list[Question]:
    """A form elicitation's properties as questions (ValueError for a schema CodeSDK cannot ask by)."""
    schema = params.get("requestedSchema")
    if not isinstance(schema, dict) or not isinstance(schema.get("properties"), dict):
        raise ValueError("the elicitation has no requestedSchema with properties")
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
            required=name in required,
            default=default if isinstance(default, (str, int, float, bool)) and not isinstance(default, dict) else None))
    if not questions:
        raise ValueError("the elicitation asks nothing")
    return questions


def elicitation_answer(answer: QuestionAnswer) -> dict[str, Any]:
    """The ``McpServerElicitationRequestResponse``."""
    if answer.declined:
        return {"action": "decline"}
    return {"action": "accept", "content": dict(answer.answers)}


def _text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
