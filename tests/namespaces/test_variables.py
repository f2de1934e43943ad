"""Stored namespace variables: validated, private, never shown, and picked up by the namespace's next worker."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from codesdk.supervisor.engine import Engine
from codesdk.supervisor.namespaces import ENV_DIR, MAX_VALUE_BYTES, NamespaceEnv, NamespaceEnvError
from codesdk.supervisor.store import TaskState
from codesdk.supervisor.workers.launch import WorkerPolicy

#: The ``make_engine`` fixture (tests/conftest.py): options in, an open engine out.
MakeEngine = Callable[..., AbstractAsyncContextManager[Engine]]

SECRET = "canary-namespace-env-4711"


def test_set_list_unset_and_values_never_listed(tmp_path: Path) -> None:
    env = NamespaceEnv(tmp_path / "data")
    entries = env.update("user:alice", {"API_KEY": SECRET, "BASE_URL": "http://127.0.0.1:1"})
    assert [e.name for e in entries] == ["API_KEY", "BASE_URL"]
    assert SECRET not in json.dumps([e.to_json_obj() for e in entries])
    assert env.values("user:alice") == {"API_KEY": SECRET, "BASE_URL": "http://127.0.0.1:1"}
    assert env.values("user:bob") == {} and env.entries("user:bob") == []
    env.update("user:alice", unset=["BASE_URL", "NEVER_SET"])
    assert env.values("user:alice") == {"API_KEY": SECRET}
    env.update("user:alice", unset=["API_KEY"])
    assert not (tmp_path / "data" / ENV_DIR / "user.alice.json").exists()


def test_files_are_private(tmp_path: Path) -> None:
    env = NamespaceEnv(tmp_path / "data")
    env.update("ci:job-1", {"TOKEN": SECRET})
    root = tmp_path / "data" / ENV_DIR
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "data").stat().st_mode) == 0o700
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in root.iterdir())


def test_fingerprints_tell_equal_values_without_revealing_them(tmp_path: Path) -> None:
    env = NamespaceEnv(tmp_path / "data")
    [a] = env.update("user:a", {"K": "same"})
    [b] = env.update("user:b", {"K": "same"})
    [c] = env.update("user:c", {"K": "other"})
    assert a.fingerprint == b.fingerprint != c.fingerprint
    # keyed: another data dir (another key) gives another fingerprint for the same value
    [d] = NamespaceEnv(tmp_path / "elsewhere").update("user:a", {"K": "same"})
    assert d.fingerprint != a.fingerprint


@pytest.mark.parametrize(("name", "value", "why"), [
    ("HOME", "/etc", "set by CodeSDK"), ("PATH", "/tmp", "set by CodeSDK"), ("XDG_CONFIG_HOME", "/x", "set by"),
    ("1ABC", "v", "invalid variable name"), ("A-B", "v", "invalid variable name"), ("", "v", "invalid variable name"),
    ("K", "a\x00b", "NUL byte"), ("K", "x" * (MAX_VALUE_BYTES + 1), "longer than"),
    ("K", "\ud800", "lone surrogate"),
])
def test_refused_variables_change_nothing(tmp_path: Path, name: str, value: str, why: str) -> None:
    env = NamespaceEnv(tmp_path / "data")
    env.update("default", {"KEEP": "kept"})
    with pytest.raises(NamespaceEnvError, match=why):
        env.update("default", {"OTHER": "x", name: value})
    assert env.values("default") == {"KEEP": "kept"}


def test_invalid_namespaces_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="invalid namespace"):
        NamespaceEnv(tmp_path).update("user:../../etc", {"K": "v"})


def test_the_stamp_changes_with_every_write(tmp_path: Path) -> None:
    env = NamespaceEnv(tmp_path / "data")
    stamps = {env.stamp("default")}
    for value in ("a", "b", "b"):
        env.update("default", {"K": value})
        stamps.add(env.stamp("default"))
    assert len(stamps) == 4 and "" in stamps  # "" = none stored; each write a new file


@given(st.dictionaries(st.from_regex(r"[A-Z_][A-Z0-9_]{0,20}", fullmatch=True).filter(
    lambda n: n not in {"HOME", "PATH", "LANG", "LC_ALL", "TMPDIR"} and not n.startswith("XDG_")),
    st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=50), max_size=8))
def test_values_round_trip(values: dict[str, str]) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        env = NamespaceEnv(Path(tmp))
        env.update("default", values)
        assert env.values("default") == values


async def test_the_namespace_s_next_worker_has_the_new_variables(make_engine: MakeEngine, tmp_path: Path) -> None:
    """An idle worker is replaced as soon as the variables change; the next task's worker sees them."""
    with trio.fail_after(60):
        async with make_engine(worker_policy=WorkerPolicy(idle_timeout_s=60)) as engine:
            session = await engine.create_session(namespace="user:alice")
            first = await engine.start_task(session.session_id, "hi", runtime_config={"scenario": "echo"})
            await engine.wait_task(first.task_id)
            old = engine.pool.worker_of("user:alice")
            assert old is not None and "API_KEY" not in old.spec.env
            engine.pool.namespace_env.update("user:alice", {"API_KEY": SECRET})
            await engine.pool.env_changed("user:alice")
            await old.exited.wait()  # the idle worker made way
            second = await engine.start_task(session.session_id, "again", runtime_config={"scenario": "echo"})
            await engine.wait_task(second.task_id)
            new = engine.pool.worker_of("user:alice")
            assert new is not None and new is not old and new.spec.env["API_KEY"] == SECRET
            assert not old.exit_status or old.stopping  # a planned restart, not a crash
            assert next(s for s in engine.pool.status() if s["namespace"] == "user:alice")["recent_crashes"] == 0
    assert os.environ.get("API_KEY") != SECRET


async def test_a_busy_worker_finishes_its_task_and_is_replaced_when_idle(make_engine: MakeEngine) -> None:
    with trio.fail_after(60):
        async with make_engine(worker_policy=WorkerPolicy(idle_timeout_s=60)) as engine:
            session = await engine.create_session()
            busy = await engine.start_task(session.session_id, "hi", runtime_config={"scenario": "hang"})
            while (await engine.store.get_task(busy.task_id)).state != TaskState.RUNNING:  # the worker has it
                await trio.sleep(0.01)
            worker = engine.pool.worker_of("default")
            assert worker is not None
            engine.pool.namespace_env.update("default", {"API_KEY": SECRET})
            await engine.pool.env_changed("default")
            assert not worker.stopping and engine.active_task(session.session_id) == busy.task_id
            await engine.stop_task(busy.task_id)
            await worker.exited.wait()  # idle now: it makes way
            nxt = await engine.start_task(session.session_id, "again", runtime_config={"scenario": "echo"})
            await engine.wait_task(nxt.task_id)
            assert engine.pool.worker_of("default").spec.env["API_KEY"] == SECRET  # type: ignore[union-attr]


async def test_a_change_written_by_another_process_reaches_the_next_task(make_engine: MakeEngine, tmp_path: Path) -> None:
    """No notification (the CLI wrote the file while this supervisor ran): the next acquire notices."""
    with trio.fail_after(60):
        async with make_engine(worker_policy=WorkerPolicy(idle_timeout_s=60)) as engine:
            session = await engine.create_session()
            first = await engine.start_task(session.session_id, "hi", runtime_config={"scenario": "echo"})
            await engine.wait_task(first.task_id)
            old = engine.pool.worker_of("default")
            NamespaceEnv(tmp_path / "data").update("default", {"API_KEY": SECRET})
            second = await engine.start_task(session.session_id, "again", runtime_config={"scenario": "echo"})
            await engine.wait_task(second.task_id)
            new = engine.pool.worker_of("default")
            assert new is not old and new is not None and new.spec.env["API_KEY"] == SECRET
