"""Answers checked against their questions: what a question allows is accepted, anything else is refused naming the
field — for any question and any answer (property tests), never by raising."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from codesdk.protocol import (
    AnswerSchema,
    Question,
    QuestionOption,
    answer_problems,
    default_answers,
    duplicate_ids,
    redacted,
    schema_problem,
)

labels = st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=5, unique=True)
json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                                         max_size=3), max_leaves=8)


@given(labels, st.data())
def test_a_choice_is_accepted_and_anything_else_refused_naming_the_field(choices: list[str], data: st.DataObject,
                                                                         ) -> None:
    question = Question(id="pick", options=tuple(QuestionOption(label=c) for c in choices))
    assert answer_problems([question], {"pick": data.draw(st.sampled_from(choices))}) == []
    other = data.draw(st.text(max_size=8).filter(lambda t: t not in choices))
    [(field, why)] = answer_problems([question], {"pick": other})
    assert field == "answers.pick" and "not a choice" in why
    with_other = question.model_copy(update={"allow_other": True})
    assert answer_problems([with_other], {"pick": other}) == ([] if other.strip() else [(field, "must not be empty")])


@given(labels, st.data())
def test_several_choices_are_a_list_of_labels(choices: list[str], data: st.DataObject) -> None:
    question = Question(id="many", options=tuple(QuestionOption(label=c) for c in choices), multi_select=True)
    picked = data.draw(st.lists(st.sampled_from(choices), min_size=1, unique=True))
    assert answer_problems([question], {"many": picked}) == []
    assert answer_problems([question], {"many": picked[0]})[0][0] == "answers.many"  # one label is not a list


@given(st.integers(-100, 100), st.integers(0, 100), st.integers(-1000, 1000))
def test_an_integer_answer_keeps_to_its_bounds(low: int, span: int, value: int) -> None:
    schema = AnswerSchema.model_validate({"type": "integer", "minimum": low, "maximum": low + span})
    expected = low <= value <= low + span
    assert (schema_problem(schema, value) is None) == expected
    assert schema_problem(schema, True) == "must be a whole number"  # a boolean is not a number
    assert schema_problem(schema, str(value)) == "must be a whole number"


@given(st.lists(st.text(max_size=6), min_size=1, max_size=4, unique=True), st.text(max_size=6))
def test_an_elicitation_enum_or_titled_choice_is_a_closed_set(values: list[str], answer: str) -> None:
    for raw in ({"type": "string", "enum": values},
                {"type": "string", "oneOf": [{"const": v, "title": v.upper()} for v in values]}):
        schema = AnswerSchema.model_validate(raw)
        assert (schema_problem(schema, answer) is None) == (answer in values)


@given(st.integers(0, 5), st.integers(0, 5), st.text(max_size=12))
def test_a_text_answer_keeps_to_its_lengths(shortest: int, extra: int, answer: str) -> None:
    schema = AnswerSchema.model_validate({"type": "string", "minLength": shortest, "maxLength": shortest + extra})
    assert (schema_problem(schema, answer) is None) == (shortest <= len(answer) <= shortest + extra)


@given(st.builds(Question), st.dictionaries(st.text(max_size=6), json_values, max_size=4))
def test_any_answer_to_any_question_is_judged_never_raised(question: Question, answers: dict[str, Any]) -> None:
    problems = answer_problems([question], answers)
    assert all(field.startswith("answers.") and why for field, why in problems)
    assert {f"answers.{key}" for key in answers if key != question.id} <= {field for field, _ in problems}


@given(st.lists(st.builds(Question), max_size=4))
def test_default_answers_are_answers_the_questions_allow(questions: list[Question]) -> None:
    if duplicate_ids(questions):
        return
    answers = default_answers(questions)
    if answers is not None:
        assert answer_problems(questions, answers) == []


def test_a_required_question_needs_an_answer_and_a_secret_is_redacted() -> None:
    questions = [Question(id="name", text="Name?"), Question(id="token", text="Token?", secret=True, required=False)]
    assert answer_problems(questions, {}) == [("answers.name", "required: this question needs an answer (or "
                                                               "decline the whole request)")]
    assert answer_problems(questions, {"name": " "}) == [("answers.name", "must not be empty: the question needs an "
                                                                      "answer (or decline it)")]
    assert redacted(questions, {"name": "a", "token": "t0k3n"}) == {"name": "a", "token": "[secret]"}
    assert default_answers(questions) is None  # a required question without a default: declined instead
    assert duplicate_ids([questions[0], questions[0]]) == ["name"]
