"""Claude Code's questions to its user, in CodeSDK's terms and back. Pure functions.

``AskUserQuestion`` (its input ``{questions: [{question, header, options: [{label, description}], multiSelect}]}``,
1-4 questions of 2-4 choices; the user may type their own answer) → one ``Question`` each, ids ``q1``, ``q2`` …
in order. Answered by allowing the call with the input plus ``answers``: question text → the chosen label (several
joined with ", ") or the typed text, which is what the CLI's own prompt would have put there.

An MCP server's ``elicitation`` control request (form mode: ``requested_schema``) → one ``Question`` per property,
answered ``{action: "accept", content}`` or ``{action: "decline"}``.
"""

from __future__ import annotations

from typing import Any


from codesdk.protocol import Question, QuestionOption

from .._questions import QuestionAnswer, form_questions


def ask_user_questions(tool_input: dict[str, Any]) -> list[Question]:
    """The questions of an ``AskUserQuestion`` call (ValueError when it has none)."""
    questions = []
    for index, raw in enumerate(tool_input.get("questions") or []):
        if not isinstance(raw, dict) or not raw.get("question"):
            continue
        options = [QuestionOption(label=str(o.get("label"))[:1000], description=str(o.get("description") or "")[:4000])
                   for o in raw.get("options") or [] if isinstance(o, dict) and o.get("label")]
        questions.append(Question(id=f"q{index + 1}", text=str(raw["question"])[:20_000],
                                  header=str(raw.get("header") or "")[:1000], options=tuple(options[:100]),
                                  multi_select=bool(raw.get("multiSelect")), allow_other=True))
    if not questions:
        raise ValueError("AskUserQuestion without questions")
    return questions


def ask_user_input(tool_input: dict[str, Any], questions: list[Question], answer: QuestionAnswer) -> dict[str, Any]:
    """The tool's input as allowed: with ``answers`` keyed by each question's text."""
    answers = {}
    for question in questions:
        value = answer.answers.get(question.id)
        if value is None:
            continue
        answers[question.text] = ", ".join(value) if isinstance(value, list) else str(value)
    return {**tool_input, "answers": answers}


def elicitation_questions(request: dict[str, Any]) -> list[Question]:
    """A form elicitation's properties as questions (ValueError for one CodeSDK cannot ask)."""
    if request.get("mode") == "url":
        raise ValueError("not a form elicitation (a URL): CodeSDK cannot show it")
    return form_questions(request.get("requested_schema"))


