"""Per-tenant quotas (issue 12, item 2): events and stored bytes per session and per namespace, tasks at once per
namespace. Over one, a task start is a 429 naming the quota's code and the flag that raises it, and stores nothing;
a running task that crosses one ends with exactly one ``task.failed QUOTA_EXCEEDED`` naming it; other tenants go on;
``codesdk-supervisor serve --max-… none`` lifts it, and a bad value is a clear usage error.

The engine is driven directly where a process adds nothing; the 429s come through the Python client, from the real
API served in this process.
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
import trio

from codesdk.client import AsyncClient, TooManyRequests
from codesdk.testing.invariants import check_session
from codesdk.protocol import TERMINAL_EVENT_TYPES, EventType, NormalizedEvent, TaskFailed, TaskFailureCode
from codesdk.supervisor.api import TokenAuth
from codesdk.supervisor.api.server import serve_api
from codesdk.supervisor.engine import Engine, session_events
from codesdk.supervisor.cli.admin import _add_limit_flags, _quotas, main
from codesdk.supervisor.store import QUOTA_FLAGS, QuotaExceeded, Quotas

from tests.conftest import MakeEngine

#: Hang guard of each test (seconds): reached only when something is broken.
GUARD_S = 120

#: Limits small enough for a scripted flood to cross, large enough for a short echo task (10 events, ~7 KB).
STORED_LIMITS = {"session_events": 100, "session_bytes": 60_000, "namespace_events": 100, "namespace_bytes": 60_000}
ECHO = {"scenario": "echo"}
HANG = {"scenario": "hang"}


def flood(deltas: int) -> dict[str, Any]:
    """A task that streams ``deltas`` events (~360 bytes each) and completes."""
    return {"scenario_inline": {"name": "flood", "steps": [{"flood": deltas, "delta": "x"}, {"complete": {}}]}}


def serve_flags(*argv: str) -> Quotas:
    """The quotas ``codesdk-supervisor serve`` builds from these flags (its own parser and conversion)."""
    parser = argparse.ArgumentParser(prog="codesdk-supervisor serve", exit_on_error=False)
    _add_limit_flags(parser)
    return _quotas(parser.parse_args(list(argv)))


def lifted() -> Quotas:
    return serve_flags(*(arg for flag, _ in QUOTA_FLAGS.values() for arg in (flag, "none")))


async def run(engine: Engine, session_id: str, runtime_config: dict[str, Any]) -> tuple[str, list[NormalizedEvent]]:
    """Start a task, wait for its end; its final state and the session's events (checked: one terminal per task)."""
    task = await engine.start_task(session_id, "hello", runtime_config=runtime_config)
    record = await engine.wait_task(task.task_id)
    events = await session_events(engine.store, session_id)
    check_session(events)
    return str(record.state), events


def the_terminal(events: list[NormalizedEvent], task_id: str | None = None) -> NormalizedEvent:
    terminals = [e for e in events if e.type in TERMINAL_EVENT_TYPES and task_id in (None, e.trace.task_id)]
    assert len(terminals) == 1, terminals
    return terminals[0]


@dataclass
class Tenants:
    alice: AsyncClient  # user:alice
    bob: AsyncClient  # user:bob
    socket: Path
    tokens: dict[str, str]


@asynccontextmanager
async def tenants(engine: Engine, data_dir: Path, tmp_path: Path) -> AsyncIterator[Tenants]:
    """The real API on a unix socket, and a client per tenant."""
    auth = TokenAuth.bootstrap(data_dir)
    tokens = {name: auth.add_principal(name, [f"user:{name}"]) for name in ("alice", "bob")}
    sock = tmp_path / "run" / "api.sock"
    async with trio.open_nursery() as nursery:
        await nursery.start(partial(serve_api, engine, auth, sock, None))
        async with AsyncClient(socket=sock, token=tokens["alice"]) as alice, \
                AsyncClient(socket=sock, token=tokens["bob"]) as bob:
            yield Tenants(alice, bob, sock, tokens)
        nursery.cancel_scope.cancel()


async def client_run(client: AsyncClient, session_id: str, runtime_config: dict[str, Any]) -> NormalizedEvent:
    """Run a task through the API; its terminal event."""
    events = [event async for event in client.run(session_id, "hello", runtime_config=runtime_config)]
    return events[-1]


async def _input_stored(engine: Engine, session_id: str) -> bool:
    return any(e.type == EventType.MODEL_INPUT for e in await session_events(engine.store, session_id))


async def stored(engine: Engine, data_dir: Path, session_id: str) -> tuple[Any, ...]:
    """Everything a refused start could have left: the session's events and tasks, and the blob files."""
    blobs = sorted(p.name for p in (data_dir / "blobs").rglob("*") if p.is_file())
    return (await session_events(engine.store, session_id), await engine.store.list_tasks(session_id), blobs)


# -- crossing a stored-data quota while running -------------------------------------------------------------------


@pytest.mark.parametrize("quota", list(STORED_LIMITS))
async def test_a_task_crossing_a_stored_data_quota_fails_once_naming_it(make_engine: MakeEngine,
                                                                         tmp_path: Path, quota: str) -> None:
    flag, _ = QUOTA_FLAGS[quota]
    limit = STORED_LIMITS[quota]
    quotas = serve_flags(flag, str(limit))
    assert getattr(quotas, quota) == limit
    with trio.fail_after(GUARD_S):
        async with make_engine(quotas=quotas) as engine:
            carol = await engine.create_session(namespace="user:carol")
            state, events = await run(engine, carol.session_id, flood(2000))
            assert state == "failed"
            terminal = the_terminal(events)
            assert terminal.type == EventType.TASK_FAILED and terminal is events[-1]
            payload = terminal.payload
            assert isinstance(payload, TaskFailed)
            assert payload.code == TaskFailureCode.QUOTA_EXCEEDED and not payload.retryable
            assert payload.details["quota"] == quota and payload.details["limit"] == limit
            assert payload.details["flag"] == flag and payload.details["namespace"] == "user:carol"
            assert flag in payload.message and "the task was stopped" in payload.message
            if quota.endswith("_events"):  # nothing past the limit was stored, but the one terminal event
                assert len(events) - 1 <= limit < 2000
            # Other tenants go on; so does another session of the namespace when the quota is the session's.
            dave = await engine.create_session(namespace="user:dave")
            assert (await run(engine, dave.session_id, ECHO))[0] == "completed"
            if quota.startswith("session_"):
                again = await engine.create_session(namespace="user:carol")
                assert (await run(engine, again.session_id, ECHO))[0] == "completed"
            # The failed task's session got nothing more after its end (a flood's tail is dropped).
            assert await session_events(engine.store, carol.session_id) == events

        # `serve --max-… none`: the same flood completes.
        async with make_engine(data_dir=tmp_path / "lifted", quotas=serve_flags(flag, "none")) as engine:
            assert getattr(engine.config.quotas, quota) is None
            session = await engine.create_session(namespace="user:carol")
            state, events = await run(engine, session.session_id, flood(2000))
            assert state == "completed" and len(events) > 2000


# -- starting over a quota -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("quota", list(STORED_LIMITS))
async def test_a_start_over_a_stored_data_quota_is_a_429_that_stores_nothing(
        make_engine: MakeEngine, tmp_path: Path, quota: str) -> None:
    flag, _ = QUOTA_FLAGS[quota]
    scope = quota.partition("_")[0]
    data = tmp_path / "data"
    with trio.fail_after(GUARD_S):
        async with make_engine(data_dir=data, quotas=lifted()) as engine:  # alice stores more than she later may
            full = (await engine.create_session(namespace="user:alice")).session_id
            assert (await run(engine, full, flood(500)))[0] == "completed"
        async with make_engine(data_dir=data, quotas=serve_flags(flag, str(STORED_LIMITS[quota]))) as engine, \
                tenants(engine, data, tmp_path) as clients:
            alice, bob = clients.alice, clients.bob
            before = await stored(engine, data, full)
            with pytest.raises(TooManyRequests) as refused:
                await alice.start_task(full, "more", runtime_config=ECHO)
            error = refused.value
            assert error.status == 429 and error.code == f"{scope}_quota_exceeded", error
            assert f"codesdk-supervisor serve {flag} N" in error.message and "no new task may start" in error.message
            assert await stored(engine, data, full) == before
            # A new session of alice's: a session quota is per session; a full namespace gets no new session (its
            # session.created would be stored too) — or, had it one already, no task in it.
            if scope == "session":
                fresh = (await alice.create_session(namespace="user:alice")).session_id
                assert (await client_run(alice, fresh, ECHO)).type == EventType.TASK_COMPLETED
            else:
                sessions = await engine.store.list_sessions(namespace="user:alice")
                with pytest.raises(TooManyRequests, match="no new session may be created") as no_session:
                    await alice.create_session(namespace="user:alice")
                assert no_session.value.code == f"{scope}_quota_exceeded"
                assert await engine.store.list_sessions(namespace="user:alice") == sessions
            # bob's namespace is his own.
            session = (await bob.create_session(namespace="user:bob")).session_id
            assert (await client_run(bob, session, ECHO)).type == EventType.TASK_COMPLETED
        async with make_engine(data_dir=data, quotas=serve_flags(flag, "none")) as engine:
            assert (await run(engine, full, ECHO))[0] == "completed"  # lifted: alice goes on


async def test_tasks_per_namespace_past_the_limit_is_a_429_until_one_ends(make_engine: MakeEngine,
                                                                          tmp_path: Path) -> None:
    data = tmp_path / "data"
    with trio.fail_after(GUARD_S):
        async with make_engine(data_dir=data, quotas=serve_flags("--max-tasks-per-namespace", "1")) as engine, \
                tenants(engine, data, tmp_path) as clients:
            alice, bob = clients.alice, clients.bob
            first = (await alice.create_session(namespace="user:alice")).session_id
            second = (await alice.create_session(namespace="user:alice")).session_id
            running = await alice.start_task(first, "hang", runtime_config=HANG)
            # The running task's own writes settle first (its input's blob), so that only a refused start's are seen.
            while not await _input_stored(engine, first):
                await trio.sleep(0.02)
            before = await stored(engine, data, second)
            with pytest.raises(TooManyRequests) as refused:
                await alice.start_task(second, "more", runtime_config=ECHO)
            error = refused.value
            assert error.code == "too_many_tasks", error
            assert "1 tasks pending or running" in error.message and "--max-tasks-per-namespace" in error.message
            assert await stored(engine, data, second) == before
            transport = httpx.AsyncHTTPTransport(uds=str(clients.socket))
            async with httpx.AsyncClient(transport=transport, base_url="http://codesdk") as http:
                response = await http.post(f"/v1/sessions/{second}/tasks", json={"prompt": "x"},
                                           headers={"Authorization": f"Bearer {clients.tokens['alice']}"})
            assert response.status_code == 429 and response.headers["retry-after"] == "1"
            # bob's namespace runs meanwhile.
            session = (await bob.create_session(namespace="user:bob")).session_id
            assert (await client_run(bob, session, ECHO)).type == EventType.TASK_COMPLETED
            # Once alice's task ends, her next one starts.
            await alice.stop_task(running.task_id)
            assert (await client_run(alice, second, ECHO)).type == EventType.TASK_COMPLETED

        async with make_engine(data_dir=tmp_path / "lifted",
                               quotas=serve_flags("--max-tasks-per-namespace", "none")) as engine:
            sessions = [await engine.create_session(namespace="user:alice") for _ in range(3)]
            tasks = [await engine.start_task(s.session_id, "hang", runtime_config=HANG) for s in sessions]
            for task in tasks:
                await engine.stop_task(task.task_id)


async def test_sessions_per_namespace_past_the_limit_is_a_429_that_leaves_nothing(make_engine: MakeEngine,
                                                                                  tmp_path: Path) -> None:
    data = tmp_path / "data"
    with trio.fail_after(GUARD_S):
        async with make_engine(data_dir=data, quotas=serve_flags("--max-sessions-per-namespace", "2")) as engine, \
                tenants(engine, data, tmp_path) as clients:
            for _ in range(2):
                await clients.alice.create_session(namespace="user:alice")
            workspaces = sorted((data / "workspaces").iterdir())
            with pytest.raises(TooManyRequests) as refused:
                await clients.alice.create_session(namespace="user:alice")
            error = refused.value
            assert error.code == "too_many_sessions", error
            assert "already has 2 sessions" in error.message and "--max-sessions-per-namespace" in error.message
            assert len(await engine.store.list_sessions(namespace="user:alice")) == 2
            assert sorted((data / "workspaces").iterdir()) == workspaces  # no workspace left for the refused one
            await clients.bob.create_session(namespace="user:bob")  # another namespace goes on
        async with make_engine(data_dir=tmp_path / "lifted",
                               quotas=serve_flags("--max-sessions-per-namespace", "none")) as engine:
            for _ in range(3):
                await engine.create_session(namespace="user:alice")


async def test_concurrent_starts_cannot_slip_past_the_tasks_limit(make_engine: MakeEngine) -> None:
    """Admission is decided in the transaction that records the task: of six starts at once, two get in."""
    with trio.fail_after(GUARD_S):
        async with make_engine(quotas=serve_flags("--max-tasks-per-namespace", "2")) as engine:
            sessions = [await engine.create_session(namespace="user:alice") for _ in range(6)]
            started: list[Any] = []
            refused: list[QuotaExceeded] = []

            async def start(session_id: str) -> None:
                try:
                    started.append(await engine.start_task(session_id, "hang", runtime_config=HANG))
                except QuotaExceeded as exc:
                    refused.append(exc)

            async with trio.open_nursery() as nursery:
                for session in sessions:
                    nursery.start_soon(start, session.session_id)
            assert (len(started), len(refused)) == (2, 4)
            assert {exc.code for exc in refused} == {"too_many_tasks"}
            for task in started:
                await engine.stop_task(task.task_id)
            for session in sessions:  # the refused ones left nothing
                tasks = await engine.store.list_tasks(session.session_id)
                assert len(tasks) == (1 if any(t.session_id == session.session_id for t in started) else 0)


# -- the flags ------------------------------------------------------------------------------------------------------


def test_limit_flags_take_counts_sizes_and_none() -> None:
    assert serve_flags() == Quotas()
    assert lifted() == Quotas(None, None, None, None, None, None)
    quotas = serve_flags("--max-session-bytes", "512M", "--max-namespace-bytes", "2g", "--max-session-events", "100k",
                         "--max-namespace-events", " 7 ", "--max-tasks-per-namespace", "NONE")
    assert quotas == Quotas(session_events=100 << 10, session_bytes=512 << 20, namespace_events=7,
                            namespace_bytes=2 << 30, namespace_tasks=None)


@pytest.mark.parametrize("flag", [flag for flag, _ in QUOTA_FLAGS.values()])
@pytest.mark.parametrize("value", ["0", "-1", "0k", "1.5", "abc", "", "10X", "k", "none2", "²", "1e3"])
def test_a_bad_quota_value_is_a_clear_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str,
                                                  value: str) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--data-dir", str(tmp_path / "data"), f"{flag}={value}"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: invalid limit {value!r}: a positive number (K/M/G/T allowed) or 'none'" in err, err
    assert not (tmp_path / "data").exists()  # refused before anything was made


@pytest.mark.parametrize(("flag", "value", "says"), [
    ("--max-connections", "0", "must be a positive integer"),
    ("--max-connections-per-principal", "-3", "must be a positive integer"),
    ("--max-streams-per-principal", "many", "must be a positive integer"),
    ("--max-streams-per-principal", "²", "must be a positive integer"),
    ("--header-timeout", "0", "must be > 0"),
    ("--header-timeout", "nan", "must be > 0"),
    ("--body-timeout", "-1", "must be > 0"),
    ("--body-timeout", "soon", "must be > 0"),
    ("--send-timeout", "0", "must be > 0"),
])
def test_a_bad_api_limit_is_a_clear_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str,
                                                value: str, says: str) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--data-dir", str(tmp_path / "data"), f"{flag}={value}"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: invalid" in err and repr(value) in err and says in err, err
