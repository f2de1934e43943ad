"""Refusals are typed by whose move it is, nothing is stored for them, and each has one HTTP answer."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from codesdk.protocol import InteractionMode, Method
from codesdk.supervisor.engine import (
    ApproverRequired,
    EngineError,
    ErrorStatus,
    InvalidTaskInput,
    NamespaceUnavailable,
    RuntimeUnavailable,
    SessionBusy,
    TaskNotActive,
    UnknownRuntime,
    WorkspaceMissing,
    WorkspaceRefused,
    error_status,
)
from codesdk.supervisor.namespaces import InvalidNamespace
from codesdk.supervisor.store import QuotaExceeded, Quotas, TaskState, UnknownSession
from codesdk.supervisor.store import SessionBusy as StoredSessionBusy

from tests.engine.doubles import engine_with_doubles, rpc_error, running_task


async def test_a_workspace_that_would_expose_the_data_dir_is_refused(tmp_path: Path) -> None:
    async with engine_with_doubles(tmp_path / "data") as (engine, _):
        for workspace in (Path("/"), tmp_path, tmp_path / "data" / "inside"):
            with pytest.raises(WorkspaceRefused, match="workspace"):
                await engine.create_session(workspace=workspace)
        with pytest.raises(InvalidNamespace):
            await engine.create_session(namespace="no spaces allowed")
        assert await engine.store.list_sessions() == []


async def test_a_task_of_a_session_whose_workspace_is_not_on_this_host_is_refused_saying_why(
        tmp_path: Path) -> None:
    """(On another host, tests/hosts/test_hosts_apart.py: a namespace moved without shared storage.)"""
    with trio.fail_after(30):
        async with engine_with_doubles(tmp_path / "data") as (engine, _):
            session = await engine.create_session(namespace="user:gone")
            assert session.workspace is not None
            Path(session.workspace).rmdir()
            with pytest.raises(WorkspaceMissing, match=r"workspace .* is not on this host: .*Past one machine"):
                await engine.start_task(session.session_id, "x")
            assert await engine.store.list_tasks(session.session_id) == []


async def test_a_name_no_runtime_can_have_is_refused_for_a_session_and_a_task(tmp_path: Path) -> None:
    """The engine holds the protocol's one rule, as the API does: nothing is stored for a name outside it."""
    async with engine_with_doubles(tmp_path / "data") as (engine, _):
        for name in ("Scripted", "../scripted", "x" * 65):
            with pytest.raises(InvalidTaskInput, match="not a runtime name: .*lowercase letters"):
                await engine.create_session(runtime=name)
        assert await engine.store.list_sessions() == []
        session = await engine.create_session(runtime="codex-acp")
        with pytest.raises(InvalidTaskInput, match="not a runtime name"):
            await engine.start_task(session.session_id, "x", runtime="Claude")
        assert await engine.store.list_tasks(session.session_id) == []


async def test_a_busy_session_refuses_a_second_task_as_the_engine_and_as_the_store(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with engine_with_doubles(tmp_path) as (engine, workers):
            sid, task_id, _ = await running_task(engine, workers)
            with pytest.raises(SessionBusy, match="already has an active task") as refused:
                await engine.start_task(sid, "again")
            assert isinstance(refused.value, StoredSessionBusy) and refused.value.active_task_id == task_id
            assert [t.task_id for t in await engine.store.list_tasks(sid)] == [task_id]
            await engine.stop_task(task_id)
            with pytest.raises(TaskNotActive, match="is not running"):
                await engine.stop_task(task_id)


async def test_task_input_is_refused_before_anything_is_stored(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with engine_with_doubles(tmp_path) as (engine, _):
            session = await engine.create_session()
            with pytest.raises(ApproverRequired):
                await engine.start_task(session.session_id, "x", interaction_mode=InteractionMode.INTERACTIVE)
            with pytest.raises(InvalidTaskInput, match="plain JSON"):
                await engine.start_task(session.session_id, "x", runtime_config={"n": 2**60})
            with pytest.raises(UnknownSession):
                await engine.start_task("ses_nope", "x")
            assert await engine.store.list_tasks(session.session_id) == []


async def test_a_namespace_at_its_task_quota_refuses_more(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with engine_with_doubles(tmp_path, quotas=Quotas(namespace_tasks=1)) as (engine, workers):
            await running_task(engine, workers)
            other = await engine.create_session()
            with pytest.raises(QuotaExceeded) as refused:
                await engine.start_task(other.session_id, "x")
    assert error_status(refused.value) == ErrorStatus(429, "too_many_tasks", retry_after_s=1)


async def test_login_questions_are_refused_by_whose_move_it_is(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with engine_with_doubles(tmp_path) as (engine, workers):
            answers = workers.worker().connection.answers
            answers[Method.ENSURE_LOGIN] = rpc_error(-32004, "unknown runtime 'nope'")
            with pytest.raises(UnknownRuntime, match="unknown runtime 'nope'"):
                await engine.ensure_login("default", "nope")
            answers[Method.ENSURE_LOGIN] = rpc_error(-32603, "the CLI crashed")
            with pytest.raises(RuntimeUnavailable, match="the CLI crashed"):
                await engine.ensure_login("default", "claude")
            workers.unavailable["user:q"] = "namespace 'user:q' is quarantined"
            with pytest.raises(NamespaceUnavailable, match="quarantined"):
                await engine.runtimes("user:q")
            with pytest.raises(InvalidNamespace):
                await engine.runtimes("../etc")


@pytest.mark.parametrize(("refusal", "answer"), [
    (WorkspaceRefused("x"), (409, "workspace_refused")),
    (WorkspaceMissing("x"), (409, "workspace_missing")),
    (NamespaceUnavailable("x"), (503, "namespace_failing")),
    (UnknownRuntime("x"), (404, "unknown_runtime")),
    (RuntimeUnavailable("x"), (503, "runtime_unavailable")),
    (ApproverRequired("x"), (422, "approver_required")),
    (InvalidTaskInput("x"), (422, "invalid_request")),
    (TaskNotActive("x"), (409, "task_not_active")),
    (SessionBusy("ses_1", "task_1"), (409, "session_busy")),
    (StoredSessionBusy("ses_1", "task_1", "running"), (409, "session_busy")),
    (InvalidNamespace("x"), (422, "invalid_namespace")),
    (UnknownSession("ses_1"), (404, "session_not_found")),
    (type("NewRefusal", (EngineError,), {})("x"), (409, "conflict")),  # an unlisted refusal: its base's answer
])
def test_each_refusal_has_one_http_answer(refusal: Exception, answer: tuple[int, str]) -> None:
    found = error_status(refusal)
    assert found is not None and (found.status, found.code) == answer


def test_what_is_no_refusal_has_no_answer_it_is_a_fault() -> None:
    assert error_status(RuntimeError("bug")) is None
    assert error_status(ValueError("bug")) is None


async def test_a_stopped_task_is_not_refused_a_successor(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with engine_with_doubles(tmp_path) as (engine, workers):
            sid, task_id, _ = await running_task(engine, workers)
            await engine.stop_task(task_id)
            nxt = await engine.start_task(sid, "next")
            assert (await engine.store.get_task(nxt.task_id)).state in (TaskState.PENDING, TaskState.RUNNING)
            await engine.stop_task(nxt.task_id)
