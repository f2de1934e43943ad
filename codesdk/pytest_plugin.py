"""pytest plugin of CodeSDK's test kit (``codesdk.testing``), registered under the ``pytest11`` entry point as
``codesdk``: pytest loads it in every run wherever CodeSDK is installed, so it imports the kit (trio, the protocol's
models, the worker client: ~0.2 s) only when a test uses one of its fixtures or its marker.

Fixtures:

- ``worker_home``: a scratch namespace HOME (0700) with its XDG directories, as the supervisor makes one;
- ``worker_workspace``: an empty workspace directory for the tasks of a test;
- ``open_test_worker``: ``open_worker`` with ``worker_home``'s environment and the command given by
  ``--worker-command`` (default: CodeSDK's own worker), as an async context manager factory;
- ``run_test_worker``: the same for tests without trio (``run_worker``).

Marker ``loopback_only``: the test starts something that must not reach the network (a real agent runtime); it
runs only inside a loopback-only network namespace and is skipped elsewhere with the reason and how to run it.
"""

from __future__ import annotations

import shlex
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import (
    AbstractAsyncContextManager,
    AbstractContextManager,
    asynccontextmanager,
    contextmanager,
)
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from codesdk.testing import SyncWorkerDriver, WorkerDriver

#: ``open_test_worker(**options)``: an async context manager giving a ``WorkerDriver``.
OpenTestWorker = Callable[..., AbstractAsyncContextManager["WorkerDriver"]]
#: ``run_test_worker(**options)``: a context manager giving a ``SyncWorkerDriver``.
RunTestWorker = Callable[..., AbstractContextManager["SyncWorkerDriver"]]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("codesdk", "CodeSDK test kit")
    group.addoption("--worker-command", default=None, metavar="COMMAND",
                    help="the worker the kit's fixtures start (a shell-quoted command line; default: CodeSDK's "
                         "own codesdk-worker)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "loopback_only: needs a loopback-only network namespace (starts something "
                                       "that must not reach the network); skipped elsewhere, saying why")


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("loopback_only") is not None:
        from codesdk.testing import OUTSIDE_NETNS_REASON, loopback_only

        if not loopback_only():
            pytest.skip(OUTSIDE_NETNS_REASON)


@pytest.fixture
def worker_home(tmp_path: Path) -> Path:
    """A scratch namespace HOME with its XDG directories and TMPDIR (what ``namespace_env`` points at)."""
    from codesdk.testing import namespace_env

    home = tmp_path / "worker-home"
    home.mkdir(mode=0o700)
    namespace_env(home)  # makes the directories
    return home


@pytest.fixture
def worker_workspace(tmp_path: Path) -> Path:
    """An empty workspace for the test's tasks."""
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    return workspace


def _command(config: pytest.Config) -> list[str] | None:
    command = config.getoption("--worker-command")
    return shlex.split(command) if command else None


def _options(config: pytest.Config, home: Path, command: list[str] | None, options: dict[str, Any]) -> dict[str, Any]:
    """The worker's environment (the scratch HOME), and where it runs: the directory pytest was started from for
    ``--worker-command`` (so that ``python my_worker.py`` means the file there, as for the conformance suite), the
    scratch HOME for CodeSDK's own worker."""
    from codesdk.testing import namespace_env

    extra: Mapping[str, str] = options.pop("extra_env", {})
    options.setdefault("env", namespace_env(home, extra=extra))
    options.setdefault("cwd", config.invocation_params.dir if command is None and _command(config) else home)
    return options


@pytest.fixture
def open_test_worker(request: pytest.FixtureRequest, worker_home: Path) -> OpenTestWorker:
    """``open_test_worker(command=None, extra_env={...}, **open_worker_options)``: a worker with the scratch HOME."""

    @asynccontextmanager
    async def open_one(command: list[str] | None = None, **options: Any) -> AsyncIterator[WorkerDriver]:
        from codesdk.testing import open_worker

        async with open_worker(command or _command(request.config),
                               **_options(request.config, worker_home, command, options)) as driver:
            yield driver

    return open_one


@pytest.fixture
def run_test_worker(request: pytest.FixtureRequest, worker_home: Path) -> RunTestWorker:
    """``run_test_worker(command=None, extra_env={...}, **options)``: ``open_test_worker`` without trio."""

    @contextmanager
    def run_one(command: list[str] | None = None, **options: Any) -> Iterator[SyncWorkerDriver]:
        from codesdk.testing import run_worker

        with run_worker(command or _command(request.config),
                        **_options(request.config, worker_home, command, options)) as driver:
            yield driver

    return run_one
