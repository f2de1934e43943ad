"""``config_refusal``: what a runtime's offer declares of ``runtime_config`` is refused up front, and nothing else."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from codesdk.protocol import RuntimeCapabilities, config_refusal

keys = st.text(min_size=1, max_size=12)
values = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=8))


@given(declared=st.lists(keys, max_size=5, unique=True), config=st.dictionaries(keys, values, max_size=6))
def test_a_key_is_refused_exactly_when_the_offer_does_not_declare_it(declared: list[str],
                                                                    config: dict[str, object]) -> None:
    offer = RuntimeCapabilities(name="r", version="1", config_keys=tuple(declared))
    refusal = config_refusal(offer, config)
    unknown = sorted(set(config) - set(declared))
    if unknown:
        assert refusal is not None and all(repr(key) in refusal for key in unknown), (refusal, unknown)
    else:
        assert refusal is None


@given(config=st.dictionaries(keys, values, max_size=6))
def test_an_offer_that_declares_nothing_refuses_nothing(config: dict[str, object]) -> None:
    assert config_refusal(RuntimeCapabilities(name="r", version="1"), config) is None


@given(choices=st.lists(st.text(max_size=8), max_size=4, unique=True), value=values)
def test_a_choice_is_refused_exactly_when_it_is_a_string_not_among_the_choices(choices: list[str],
                                                                              value: object) -> None:
    offer = RuntimeCapabilities(name="r", version="1", config_choices={"scenario": tuple(choices)})
    refusal = config_refusal(offer, {"scenario": value})
    assert (refusal is not None) == (isinstance(value, str) and value not in choices), refusal
