"""Budget arithmetic and the price table, as properties: cost is linear in tokens and never negative, a report's own
cost wins over the price, spending adds up, a limit is reached exactly at or above it, and the price table's parser
takes what it writes and refuses the rest naming the field."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from codesdk.protocol import (
    BudgetLimit,
    BudgetLimits,
    BudgetSpent,
    ModelPrice,
    PriceTable,
    PriceTableError,
    first_reached,
    parse_price_table,
    usage_spent,
)

prices = st.floats(min_value=0, max_value=1e3, allow_nan=False, allow_infinity=False)
tokens = st.integers(min_value=0, max_value=10**9)
model_prices = st.builds(ModelPrice, input=prices, output=prices, cached_input=st.none() | prices,
                         cache_write=st.none() | prices)
names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Zs", "Cc")), min_size=1, max_size=20)


@given(model_prices, tokens, tokens, tokens, tokens, st.integers(min_value=1, max_value=5))
def test_cost_is_linear_in_tokens_and_never_negative(price: ModelPrice, i: int, o: int, r: int, w: int,
                                                     k: int) -> None:
    one = price.cost_usd(input_tokens=i, output_tokens=o, cache_read_tokens=r, cache_write_tokens=w)
    many = price.cost_usd(input_tokens=k * i, output_tokens=k * o, cache_read_tokens=k * r, cache_write_tokens=k * w)
    assert one >= 0 and math.isclose(many, k * one, rel_tol=1e-9, abs_tol=1e-12)


@given(model_prices, tokens)
def test_cached_prices_default_to_the_input_price(price: ModelPrice, n: int) -> None:
    plain = ModelPrice(input=price.input, output=price.output)
    as_input = plain.cost_usd(input_tokens=2 * n, output_tokens=0)
    assert math.isclose(plain.cost_usd(input_tokens=n, output_tokens=0, cache_read_tokens=n), as_input)
    assert math.isclose(plain.cost_usd(input_tokens=n, output_tokens=0, cache_write_tokens=n), as_input)


@given(tokens, tokens, st.none() | prices, st.booleans())
def test_a_reports_own_cost_wins_and_an_unpriced_one_is_counted_as_such(i: int, o: int, cost: float | None,
                                                                        priced: bool) -> None:
    table = PriceTable(models={"m": ModelPrice(input=1, output=1)} if priced else {})
    spent = usage_spent(model="m", input_tokens=i, output_tokens=o, cost_usd=cost, prices=table)
    assert spent.tokens == i + o
    if cost is not None:
        assert spent.cost_usd == cost and spent.unpriced_reports == 0
    elif priced:
        assert math.isclose(spent.cost_usd, (i + o) / 1e6) and spent.unpriced_reports == 0
    else:
        assert spent.cost_usd == 0 and spent.unpriced_reports == 1


spents = st.builds(BudgetSpent, tokens=tokens, cost_usd=prices, tool_calls=st.integers(0, 1000),
                   unpriced_reports=st.integers(0, 1000))


@given(spents, spents)
def test_spending_adds_up(a: BudgetSpent, b: BudgetSpent) -> None:
    total = a.plus(b)
    assert (total.tokens, total.tool_calls, total.unpriced_reports) == (
        a.tokens + b.tokens, a.tool_calls + b.tool_calls, a.unpriced_reports + b.unpriced_reports)
    assert math.isclose(total.cost_usd, a.cost_usd + b.cost_usd)


@given(tokens, tokens)
def test_a_token_limit_is_reached_at_or_above_it(limit: int, spent: int) -> None:
    reached = first_reached(BudgetLimits(tokens=limit), BudgetSpent(tokens=spent))
    assert (reached == BudgetLimit.TOKENS) == (spent >= limit)


@given(st.integers(0, 100), st.integers(0, 100))
def test_n_tool_calls_run_under_a_limit_of_n(limit: int, ran: int) -> None:
    limits, spent = BudgetLimits(tool_calls=limit), BudgetSpent(tool_calls=ran)
    assert first_reached(limits, spent) is None  # counted only when one more is about to run
    assert (first_reached(limits, spent, next_tool_call=True) == BudgetLimit.TOOL_CALLS) == (ran >= limit)


@given(st.dictionaries(names.filter(lambda n: n == n.strip()), model_prices, max_size=5))
def test_the_price_table_reads_back_what_it_writes(models: dict[str, ModelPrice]) -> None:
    table = PriceTable(models=models)
    assert parse_price_table(table.model_dump_json()) == table


@pytest.mark.parametrize(("body", "named"), [
    ({"models": {"m": {"input": -1, "output": 1}}}, "models.m.input"),
    ({"models": {"m": {"input": 1}}}, "models.m.output"),
    ({"models": {"m": {"input": 1, "output": 1, "outptu": 2}}}, "models.m.outptu"),
    ({"modles": {}}, "modles"),
    ({"models": {" m": {"input": 1, "output": 1}}}, "models"),
])
def test_a_bad_price_table_is_refused_naming_the_field(body: object, named: str) -> None:
    with pytest.raises(PriceTableError, match=f"prices.json: {named}"):
        parse_price_table(json.dumps(body), "prices.json")


@pytest.mark.parametrize("value", [-1, math.inf])
def test_limits_are_finite_and_not_negative(value: float) -> None:
    with pytest.raises(ValueError, match="cost_usd"):
        BudgetLimits(cost_usd=value)
