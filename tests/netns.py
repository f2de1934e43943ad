"""Guards for tests that start real agent runtimes: they run only with no way off this machine."""

from __future__ import annotations

import pytest

from codesdk.testing import loopback_only

skip_outside_netns = pytest.mark.skipif(
    not loopback_only(),
    reason="real runtimes run only inside a loopback-only network namespace: use ./scripts/test "
           "(it wraps pytest in scripts/netns-run), or scripts/netns-run .venv/bin/pytest …",
)
