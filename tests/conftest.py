"""Fixtures shared by the end-to-end and contract suites."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest
import trio.testing
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from codesdk.procs.children import Children
from codesdk.protocol import MAX_BUDGET_LIMIT, BudgetLimits
from codesdk.supervisor.service.assembly import SupervisorOptions, open_engine
from codesdk.supervisor.engine import Engine

from tests.postgres import PostgresServer
from tests.postgres import unavailable as postgres_unavailable
from tests.worker.harness import REPO

#: No property test depends on this machine's speed: hypothesis's per-example deadline (200 ms) and its "too slow"
#: health check fail on a loaded machine, not on a wrong answer. A failing example prints its reproduction blob.
settings.register_profile("codesdk", deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("codesdk")

#: pytester: the test kit's plugin is tested by running pytest on a user's test file (tests/kit).
pytest_plugins = ["pytester"]

SCENARIOS = str(REPO / "worker" / "adapters" / "scripted" / "scenarios")
#: Recorded runtime streams (``--record-streams``) and the golden events their replays must give.
STREAMS = REPO / "fixtures" / "streams"
GOLDEN = REPO / "tests" / "golden"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("codesdk-goldens", "golden replays (tests/replay)")
    group.addoption("--record-streams", action="store_true",
                    help="record the real runtimes' streams of the contract tests into fixtures/streams/ "
                         "(replacing what is there for each test that runs; needs the runtimes)")
    group.addoption("--update-goldens", action="store_true",
                    help="write the replays' normalized events into tests/golden/ instead of comparing them")

#: The ``make_engine`` fixture: SupervisorOptions (and ``worker_env``) in, an open engine out.
MakeEngine = Callable[..., AbstractAsyncContextManager[Engine]]


@pytest.fixture(scope="session")
def children() -> Children:
    """The test process's one registry of the children it waits for itself (``codesdk.procs.children``): every
    engine a test opens gets it, so that engines opened side by side never reap each other's children."""
    return Children()


@pytest.fixture
def make_engine(tmp_path: Path, children: Children) -> MakeEngine:
    @asynccontextmanager
    async def make(**options: Any) -> AsyncIterator[Engine]:
        env = options.pop("worker_env", {})
        env = {"*": {"CODESDK_SCENARIO_DIR": SCENARIOS, **env.get("*", {})}, **{k: v for k, v in env.items()
                                                                                 if k != "*"}}
        options.setdefault("test_scenarios", True)  # the suite drives faults through the scripted runtime
        options.setdefault("children", children)
        opts = SupervisorOptions(data_dir=options.pop("data_dir", tmp_path / "data"), worker_env=env, **options)
        async with open_engine(opts) as engine:
            yield engine

    return make




@pytest.fixture
def still_clock() -> trio.testing.MockClock:
    """Trio time that moves only when the test jumps it (pytest-trio runs a test that takes it on it): no deadline
    passes by itself, however slow or loaded the machine. Guard such a test with ``tests.waits.real_time_limit``:
    its ``trio.fail_after`` would never fire."""
    return trio.testing.MockClock()


@pytest.fixture
def open_tmp() -> Iterator[Path]:
    """A temp dir every uid can pass through (pytest's own are 0700): for workers and commands of other uids, so
    that only the files' own modes and owners decide what they can reach."""
    path = Path(tempfile.mkdtemp(prefix="codesdk-open-"))
    os.chmod(path, 0o711)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


#: Seconds a test's processes get to be gone (reaped) after it ended, before it is failed for leaving them.
LEFTOVER_WAIT_S = 10.0
#: Servers the session keeps for many tests (the throwaway PostgreSQL): they and their processes are not leftovers.
SESSION_SERVERS: set[int] = set()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One throwaway PostgreSQL server per test process (skips, saying why, where none can be started)."""
    reason = postgres_unavailable()
    if reason is not None:
        pytest.skip(reason)
    server = PostgresServer()
    try:
        server.start()
        assert server.process is not None
        SESSION_SERVERS.add(server.process.pid)
        yield server
    finally:
        server.close()


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> str:
    """A fresh database of the session's server: its URL."""
    return postgres_server.new_database()


def _of_session_server(process: psutil.Process) -> bool:
    try:
        return any(parent.pid in SESSION_SERVERS for parent in process.parents())
    except psutil.Error:
        return True  # gone


@pytest.fixture(autouse=True)
def no_resource_groups_left_behind(request: pytest.FixtureRequest) -> Iterator[None]:
    """A service a test SIGKILLed leaves its resource groups (cgroups) behind: removed here, found by the record
    each supervisor keeps in its data dir (only groups named for a data dir of this test's ``tmp_path``)."""
    yield
    tmp_path = request.node.funcargs.get("tmp_path") if hasattr(request.node, "funcargs") else None
    if isinstance(tmp_path, Path):
        from codesdk.supervisor.groups import TREE_FILE, remove_left

        for record in [*tmp_path.glob(TREE_FILE), *tmp_path.glob(f"*/{TREE_FILE}"),
                       *tmp_path.glob(f"*/*/{TREE_FILE}")]:
            remove_left(record.parent)


@pytest.fixture(autouse=True)
def no_processes_left_behind(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every test ends with no process it started still running and no zombie of it left to this process."""
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    yield
    deadline = time.monotonic() + LEFTOVER_WAIT_S
    while True:
        left = []
        for process in me.children(recursive=True):
            if process.pid in before or process.pid in SESSION_SERVERS or _of_session_server(process):
                continue
            try:
                left.append(f"{process.pid} {process.name()} ({process.status()}, session {os.getsid(process.pid)})")
            except psutil.Error:
                continue
        if not left:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"{request.node.nodeid} left processes behind: {', '.join(left)}", pytrace=False)
        time.sleep(0.05)


# A budget's optional bounded limits: hypothesis applies a field's bounds to its None too, so they are given here.
_LIMIT = st.none() | st.integers(0, MAX_BUDGET_LIMIT)
st.register_type_strategy(BudgetLimits, st.builds(
    BudgetLimits, tokens=_LIMIT, tool_calls=_LIMIT,
    cost_usd=st.none() | st.floats(0, MAX_BUDGET_LIMIT, allow_nan=False, allow_infinity=False)))
