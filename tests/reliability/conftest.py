"""Fixtures the reliability suite shares (with the API suite, and between its disk-fault tests)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.api.conftest import api
from tests.reliability.test_disk_faults import FaultyVFS

__all__ = ["api"]  # the real API on a unix socket, with two tenants (a fixture)


@pytest.fixture
def faulty() -> Iterator[FaultyVFS]:
    """The store's SQLite files through a VFS that fails on demand (``FaultyVFS``), unregistered afterwards."""
    vfs = FaultyVFS()
    try:
        yield vfs
    finally:
        vfs.unregister()
