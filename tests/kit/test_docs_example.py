"""docs/testing.md's complete example runs as it stands there, as a user's own test module."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "testing.md"


def _example() -> tuple[str, str]:
    """The file name and the code of the example block (the one marked ``<!-- example: NAME -->``)."""
    found = re.search(r"<!-- example: (\S+) -->\n```python\n(.*?)\n```", DOC.read_text(), re.DOTALL)
    assert found is not None, f"{DOC} has no example block"
    return found.group(1), found.group(2)


def test_the_example_in_docs_testing_md_passes(pytester: pytest.Pytester) -> None:
    name, code = _example()
    pytester.makepyfile(**{name.removesuffix(".py"): code})
    pytester.makeini("[pytest]\ntrio_mode = true\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=code.count("\ndef test_") + code.count("\nasync def test_")
                           + int(code.startswith(("def test_", "async def test_"))))
