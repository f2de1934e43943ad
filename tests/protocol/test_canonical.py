"""Canonical hashing: key-order independence, stability, clear errors."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from codesdk.protocol import CanonicalizationError, ToolSpec, canonical_hash, canonical_json, is_hash

keys = st.text(max_size=10)
scalars = st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1) | st.text(max_size=20) | \
    st.floats(allow_nan=False, allow_infinity=False)
values = st.recursive(scalars, lambda kids: st.lists(kids, max_size=4) | st.dictionaries(keys, kids, max_size=5),
                      max_leaves=20)


def _shuffled(value: object, rnd: random.Random) -> object:
    if isinstance(value, dict):
        items = list(value.items())
        rnd.shuffle(items)
        return {k: _shuffled(v, rnd) for k, v in items}
    if isinstance(value, list):
        return [_shuffled(v, rnd) for v in value]
    return value


@given(values, st.randoms())
def test_hash_ignores_key_order_and_whitespace(value: object, rnd: random.Random) -> None:
    reordered = _shuffled(value, rnd)
    assert canonical_hash(reordered) == canonical_hash(value)
    assert canonical_hash(json.loads(json.dumps(value, indent=3))) == canonical_hash(value)
    assert is_hash(canonical_hash(value))


def test_hash_is_stable_across_processes() -> None:
    value = {"b": [1, 2.5, "x", None], "a": {"z": True, "é": "ünï"}}
    program = "import json,sys; from codesdk.protocol import canonical_hash; print(canonical_hash(json.loads(sys.argv[1])))"
    other = subprocess.run([sys.executable, "-c", program, json.dumps(value)], capture_output=True, text=True,
                           check=True, timeout=60).stdout.strip()
    assert other == canonical_hash(value)
    # A known vector, so the format can't drift silently between releases.
    assert canonical_json(value) == '{"a":{"z":true,"é":"ünï"},"b":[1,2.5,"x",null]}'.encode()


def test_models_hash_like_their_json() -> None:
    spec = ToolSpec(name="workspace.read")
    assert canonical_hash(spec) == canonical_hash(spec.model_dump(mode="json"))


@pytest.mark.parametrize(("value", "where", "problem"), [
    ({"a": float("nan")}, "/a", "NaN"),
    ({"a": [1, float("inf")]}, "/a/1", "NaN/Infinity"),
    ({1: "x"}, "/", "not a string"),
    ({"big": 2**60}, "/big", "send it as a string"),
    ({"s": {1, 2}}, "/s", "not a JSON type"),
    ({"b": b"bytes"}, "/b", "not a JSON type"),
    ({"u": "\ud800"}, "/u", "surrogate"),
])
def test_unrepresentable_values_get_clear_errors(value: dict[object, object], where: str,
                                                 problem: str) -> None:
    with pytest.raises(CanonicalizationError) as err:
        canonical_hash(value)
    assert err.value.path == where
    assert problem in str(err.value)
