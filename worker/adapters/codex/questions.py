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


from codesdk.protocol import Question, QuestionOption

from .._questions import QuestionAnswer, form_questions


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
    return form_questions(params.get("requestedSchema"))


def _text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
