from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from supervisor.store import EventStore


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture
async def store(data_dir: Path) -> AsyncIterator[EventStore]:
    # NORMAL keeps tests fast; FULL (the default) is covered by its own test.
    async with EventStore.open(data_dir, synchronous="NORMAL") as opened:
        yield opened
