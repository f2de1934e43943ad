"""What a line typed at a runtime's question means: a choice by number or label, several comma-separated, a typed
number or yes/no where the question's schema asks for one, the default for an empty line."""

from __future__ import annotations

from codesdk.protocol import AnswerSchema, Question, QuestionOption, value_problem
from codesdk.supervisor.cli.questions import describe, parse

COLOURS = Question(id="c", header="Colour", text="Which?", default="blue",
                   options=(QuestionOption(label="red"), QuestionOption(label="blue", description="calm")))


def test_a_choice_by_number_or_label_and_the_default_for_an_empty_line() -> None:
    assert [parse(COLOURS, line) for line in ("1", "2\n", " blue ", "", "3")] == ["red", "blue", "blue", "blue", "3"]
    assert value_problem(COLOURS, parse(COLOURS, "3")) is not None  # no third choice: asked again
    shown = describe(COLOURS)
    assert "1. red" in shown and "2. blue — calm" in shown and "empty: blue" in shown and "! declines" in shown


def test_several_choices_numbers_and_yes_no() -> None:
    many = COLOURS.model_copy(update={"multi_select": True, "default": None})
    assert parse(many, "1, blue") == ["red", "blue"]
    count = Question(id="n", answer_schema=AnswerSchema(type="integer", minimum=1))
    assert parse(count, "3") == 3 and parse(count, "three") == "three"
    assert value_problem(count, parse(count, "0")) == "must be at least 1"
    agree = Question(id="b", answer_schema=AnswerSchema(type="boolean"))
    assert (parse(agree, "y"), parse(agree, "No")) == (True, False)
    optional = Question(id="o", required=False)
    assert parse(optional, "") is None
