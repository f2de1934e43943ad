"""Fixtures shared by the end-to-end and contract suites."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from supervisor.app import SupervisorOptions, open_engine
from supervisor.engine import Engine

from .worker.harness import REPO

SCENARIOS = str(REPO / "fixtures" / "scenarios")


@pytest.fixture
def make_engine(tmp_path: Path) -> Callable[..., Any]:
    @asynccontextmanager
    async def make(**options: Any) -> AsyncIterator[Engine]:
        env = options.pop("worker_env", {})
        env = {"*": {"CODESDK_SCENARIO_DIR": SCENARIOS, **env.get("*", {})}, **{k: v for k, v in env.items()
                                                                                 if k != "*"}}
        opts = SupervisorOptions(data_dir=options.pop("data_dir", tmp_path / "data"), worker_env=env, **options)
        async with open_engine(opts) as engine:
            yield engine

    return make


