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


@given(declared=st.lists(keys, max_size=4, unique=True), withheld=st.dictionaries(keys, st.text(min_size=1), max_size=3),
       config=st.dictionaries(keys, values, max_size=6))
def test_a_withheld_key_is_refused_saying_why_and_only_when_it_is_given(
        declared: list[str], withheld: dict[str, str], config: dict[str, object]) -> None:
    withheld = {key: why for key, why in withheld.items() if key not in declared}
    offer = RuntimeCapabilities(name="r", version="1", config_keys=tuple(declared), config_withheld=withheld)
    refusal = config_refusal(offer, config)
    unknown = sorted(set(config) - set(declared))
    if not unknown:
        assert refusal is None
    elif given_withheld := [key for key in unknown if key in withheld]:
        assert refusal == f"runtime_config.{given_withheld[0]} {withheld[given_withheld[0]]}"
    else:
        assert refusal is not None and "does not take" in refusal


@given(choices=st.lists(st.text(max_size=8), max_size=4, unique=True), withheld=st.lists(st.text(max_size=8), max_size=3),
       value=values)
def test_a_withheld_choice_is_refused_saying_why(choices: list[str], withheld: list[str], value: object) -> None:
    offer = RuntimeCapabilities(name="r", version="1", config_choices={"scenario": tuple(choices)},
                                config_withheld={f"scenario={name}": "is off here" for name in withheld})
    refusal = config_refusal(offer, {"scenario": value})
    if not isinstance(value, str) or value in choices:
        assert refusal is None
    elif value in withheld:
        assert refusal == f"runtime_config.scenario {value!r} is off here"
    else:
        assert refusal is not None and "is not one r has" in refusal
