from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from codesdk.supervisor.store import EventStore, Recorder

from tests.store.backends import BACKENDS, Backend


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture
async def store(data_dir: Path) -> AsyncIterator[EventStore]:
    """The SQLite store itself, for the tests of what is particular to it (files, SQL, options)."""
    # NORMAL keeps tests fast; FULL (the default) is covered by its own test.
    async with EventStore.open(data_dir, synchronous="NORMAL") as opened:
        yield opened


@pytest.fixture(params=sorted(BACKENDS))
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """Each backend in turn (see ``backends``): the tests that take it are the recorder contract."""
    return BACKENDS[request.param](tmp_path / "data", lambda: str(request.getfixturevalue("postgres_url")))


@pytest.fixture
async def recorder(backend: Backend) -> AsyncIterator[Recorder]:
    async with backend.open() as opened:
        yield opened
