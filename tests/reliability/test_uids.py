"""Per-namespace worker uids (``--worker-uids START:COUNT``): the persisted allocation, the start-up checks,
handing workspaces over, and the engine's whole scripted flow (tool calls, a crash, a restart of the
supervisor) with every worker under its own uid. Tests needing root skip with the reason otherwise."""

from __future__ import annotations

import json
import os
import pwd
import stat
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import trio

from codesdk.protocol import EventType, IsolationLevel, PermissionMode
from codesdk.supervisor.cli.admin import main as service_main
from codesdk.supervisor.engine import IsolationRefused, session_events
from codesdk.supervisor.namespaces import (
    UIDS_FILE,
    Namespace,
    UidRange,
    UidRangeError,
    give_workspace,
    namespace_identity,
    prepare_dirs,
)
from codesdk.supervisor.service.assembly import SupervisorOptions, open_engine
from codesdk.supervisor.workers.launch import WorkerPolicy
from tests.e2e.conftest import of_type, run_task
from tests.reliability.probe_worker import (
    interpreter_for_any_uid,
    why_no_worker_uids,
    worker_argv_for_any_uid,
)
from tests.worker.harness import REPO

RANGE = UidRange(3_910_000, 4)
NOBODY = 65534


needs_root = pytest.mark.skipif(why_no_worker_uids() is not None, reason=why_no_worker_uids() or "")


# --- allocation ---------------------------------------------------------------------------------------------


def test_uids_are_distinct_per_namespace_stable_and_persisted(tmp_path: Path) -> None:
    a, b = Namespace.parse("user:a"), Namespace.parse("ci:b")
    first = namespace_identity(tmp_path, RANGE, a)
    second = namespace_identity(tmp_path, RANGE, b)
    assert first.uid != second.uid and {first.uid, second.uid} <= set(range(RANGE.start, RANGE.start + 2))
    assert first.gid == first.uid and second.gid == second.uid
    assert namespace_identity(tmp_path, RANGE, a) == first  # asked again (a restart reads the same file)
    path = tmp_path / UIDS_FILE
    assert json.loads(path.read_text())["assigned"] == {"user:a": first.uid, "ci:b": second.uid}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_an_exhausted_range_is_a_clear_error_and_uids_are_never_reused(tmp_path: Path) -> None:
    small = UidRange(RANGE.start, 2)
    held = [namespace_identity(tmp_path, small, Namespace.parse(f"user:{n}")) for n in ("a", "b")]
    with pytest.raises(UidRangeError, match=r"range 3910000:2 is exhausted.*'user:c'.*larger range"):
        namespace_identity(tmp_path, small, Namespace.parse("user:c"))
    assert [namespace_identity(tmp_path, small, Namespace.parse(f"user:{n}")) for n in ("a", "b")] == held
    bigger = UidRange(RANGE.start, 3)  # the operator grows the range: the newcomer gets a new uid
    assert namespace_identity(tmp_path, bigger, Namespace.parse("user:c")).uid == RANGE.start + 2


def test_a_uid_outside_a_changed_range_or_a_damaged_file_is_refused(tmp_path: Path) -> None:
    ns = Namespace.parse("user:a")
    namespace_identity(tmp_path, RANGE, ns)
    with pytest.raises(UidRangeError, match=r"was given uid 3910000, outside .* 4000000:4"):
        namespace_identity(tmp_path, UidRange(4_000_000, 4), ns)
    (tmp_path / UIDS_FILE).write_text("{not json")
    with pytest.raises(UidRangeError, match="restore it from a backup"):
        namespace_identity(tmp_path, RANGE, ns)


def test_uids_that_belong_to_someone_are_skipped(tmp_path: Path) -> None:
    """A range overlapping /etc/passwd: accounts' uids are never given to a namespace."""
    existing = sorted(p.pw_uid for p in pwd.getpwall() if 1 <= p.pw_uid < 100)
    if not existing:
        pytest.skip("no account with a uid below 100 here")
    first = existing[0]
    got = namespace_identity(tmp_path, UidRange(first, 200), Namespace.parse("user:a")).uid
    assert got not in {p.pw_uid for p in pwd.getpwall()} and got > first


@pytest.mark.parametrize("text", ["", "100", "0:5", "100:0", "a:b", "4294967290:100"])
def test_bad_ranges_are_refused_with_the_syntax(text: str) -> None:
    with pytest.raises(UidRangeError, match="START"):
        UidRange.parse(text)


def test_the_serve_flag_rejects_a_bad_range(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        service_main(["serve", "--worker-uids", "0:10"])
    assert exited.value.code == 2
    assert "START must be at least 1 (never root)" in capsys.readouterr().err


def test_without_privilege_the_service_refuses_to_start_and_says_why(open_tmp: Path) -> None:
    """Run ``serve --worker-uids`` as an unprivileged uid (nobody): exit 2, naming the missing capabilities."""
    data = open_tmp / "data"
    code = ("import sys; from codesdk.supervisor.cli.admin import main; "
            f"sys.exit(main(['serve', '--data-dir', {str(data)!r}, '--worker-uids', '3910000:4']))")
    if os.geteuid() == 0:
        python = interpreter_for_any_uid()
        if python is None:
            pytest.skip("no Python interpreter here is runnable by other uids")
        argv, user = [*python, _script(open_tmp, code)], NOBODY
    else:
        argv, user = [sys.executable, "-c", code], None
    done = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=60, user=user,
                          cwd=open_tmp, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)})
    assert done.returncode == 2, done.stderr
    assert "needs the supervisor to run as root or with" in done.stderr and "CAP_SETUID" in done.stderr
    assert not data.exists()  # refused before touching anything


def _script(folder: Path, code: str) -> str:
    path = folder / "serve.py"
    path.write_text(code)
    path.chmod(0o644)
    return str(path)


# --- directories and workspaces ------------------------------------------------------------------------------


@needs_root
def test_an_existing_namespace_tree_is_handed_over_whole(tmp_path: Path) -> None:
    """A namespace used before the range was configured: its files (e.g. an OAuth login) become its uid's."""
    ns = Namespace.parse("user:a")
    dirs = prepare_dirs(tmp_path, ns)
    (dirs.home / ".claude").mkdir()
    (dirs.home / ".claude" / "creds.json").write_text("{}")
    (dirs.home / "link").symlink_to("/etc/hostname")
    identity = namespace_identity(tmp_path, RANGE, ns)
    prepare_dirs(tmp_path, ns, identity)
    for path in (dirs.root, dirs.home, dirs.home / ".claude", dirs.home / ".claude" / "creds.json", dirs.tmp):
        assert (path.lstat().st_uid, path.lstat().st_gid) == (identity.uid, identity.gid), path
    assert (dirs.home / "link").lstat().st_uid == identity.uid
    assert Path("/etc/hostname").stat().st_uid == 0  # the symlink was not followed
    assert stat.S_IMODE((tmp_path / "namespaces").stat().st_mode) == 0o711
    assert stat.S_IMODE(tmp_path.stat().st_mode) == 0o711


@needs_root
def test_a_workspace_is_given_to_its_namespace_and_not_to_a_second_one(tmp_path: Path) -> None:
    data = tmp_path / "data"
    workspace = tmp_path / "ws"
    (workspace / "src").mkdir(parents=True)
    (workspace / "src" / "main.py").write_text("print('hi')\n")
    assert give_workspace(workspace, "user:a", data, None) is None  # without a range: nothing changes
    assert workspace.stat().st_uid == 0
    identity = give_workspace(workspace, "user:a", data, RANGE)
    assert identity is not None
    assert {p.stat().st_uid for p in (workspace, workspace / "src", workspace / "src" / "main.py")} == {identity.uid}
    assert give_workspace(workspace, "user:a", data, RANGE) == identity  # again: fine
    with pytest.raises(ValueError, match="belongs to another namespace"):
        give_workspace(workspace, "user:b", data, RANGE)
    with pytest.raises(ValueError, match="lies inside the supervisor's data dir"):
        give_workspace(data / "namespaces" / "user.a" / "home", "user:a", data, RANGE)
    inside = data / "workspaces" / "ses_1"
    inside.mkdir(parents=True, mode=0o700)
    os.chmod(data, 0o700)
    os.chmod(data / "workspaces", 0o700)
    give_workspace(inside, "user:a", data, RANGE)
    assert {stat.S_IMODE(p.stat().st_mode) for p in (data, data / "workspaces")} == {0o711}


# --- the engine's flow with every worker under its own uid ---------------------------------------------------


@needs_root
def test_the_scripted_engine_flow_works_with_worker_uids_and_survives_a_restart(open_tmp: Path) -> None:
    """Tool calls (read, patch, write), a crash and a new worker, two namespaces, then the supervisor restarted
    on the same data dir: each namespace keeps its uid, and the worker processes really run as it."""
    data = open_tmp / "data"
    argv = worker_argv_for_any_uid()
    assert argv is not None
    options = SupervisorOptions(
        data_dir=data, worker_argv=tuple(argv), worker_uids=RANGE,
        worker_policy=WorkerPolicy(idle_timeout_s=60),
        worker_env={"*": {"CODESDK_SCENARIO_DIR": str(REPO / "worker" / "adapters" / "scripted" / "scenarios")}}, test_scenarios=True)
    seen: dict[str, set[int]] = {"user:a": set(), "user:b": set()}

    async def worker_uid(engine: object, namespace: str) -> int:
        worker = engine.pool.worker_of(namespace)  # type: ignore[attr-defined]
        assert worker is not None
        return int(psutil.Process(worker.pid).uids().real)

    async def scenario(round_: int) -> None:
        with trio.fail_after(60):
            async with open_engine(options) as engine:
                for namespace, uids_seen in seen.items():
                    workspace = open_tmp / f"ws-{namespace[-1]}-{round_}"
                    workspace.mkdir()
                    (workspace / "README.md").write_text("# Demo\n")
                    give_workspace(workspace, namespace, data, RANGE)  # what Engine.create_session will do
                    _, record, events = await run_task(
                        engine, namespace=namespace, workspace=workspace, runtime_config={"scenario": "edit-file"},
                        permission_mode=PermissionMode.YOLO)
                    assert record.state == "completed", events
                    assert "Edited by the scripted runtime." in (workspace / "README.md").read_text()
                    assert len(of_type(events, EventType.TOOL_CALL_COMPLETED)) == 3
                    uids_seen.add(await worker_uid(engine, namespace))
                    _, record, events = await run_task(
                        engine, namespace=namespace, workspace=workspace, runtime_config={"scenario": "crash-exit"})
                    assert of_type(events, EventType.TASK_FAILED)[0].code == "WORKER_CRASHED"
                    _, record, _ = await run_task(engine, namespace=namespace, workspace=workspace,
                                                  runtime_config={"scenario": "write-or-deny"},
                                                  permission_mode=PermissionMode.YOLO)
                    assert record.state == "completed"
                    uids_seen.add(await worker_uid(engine, namespace))  # the worker started after the crash

    trio.run(scenario, 1)
    trio.run(scenario, 2)  # a restarted supervisor
    assigned = json.loads((data / UIDS_FILE).read_text())["assigned"]
    assert {ns: {uid} for ns, uid in assigned.items()} == seen
    assert len({uid for uids in seen.values() for uid in uids}) == 2 and os.getuid() not in assigned.values()


@needs_root
def test_tools_leave_workspace_files_to_the_namespace_and_exec_works_in_it(open_tmp: Path) -> None:
    """With per-namespace uids the workspace belongs to the namespace: what the supervisor's tools create there
    must stay usable by the namespace's own runtime (its uid), and a command run by workspace.exec must be able
    to work there."""
    data = open_tmp / "data"
    argv = worker_argv_for_any_uid()
    assert argv is not None
    options = SupervisorOptions(
        data_dir=data, worker_argv=tuple(argv), worker_uids=RANGE,
        worker_policy=WorkerPolicy(idle_timeout_s=60),
        exec_allowlist=("sh",),
        worker_env={"*": {"CODESDK_SCENARIO_DIR": str(REPO / "worker" / "adapters" / "scripted" / "scenarios")}}, test_scenarios=True)
    steps = [
        {"tool_calls": [{"id": "w", "name": "workspace.write", "input": {"path": "sub/new.txt", "content": "x\n"}}]},
        {"tool_calls": [{"id": "e", "name": "workspace.exec",
                         "input": {"argv": ["sh", "-c", "cat sub/new.txt && echo made > made.txt && id -u"]}}]},
        {"text": "{{result:e}}"},
        {"complete": {}},
    ]

    async def scenario() -> None:
        with trio.fail_after(60):
            async with open_engine(options) as engine:
                session = await engine.create_session(namespace="user:a")
                workspace = Path(session.workspace or "")
                task = await engine.start_task(session.session_id, "go", permission_mode=PermissionMode.YOLO,
                                               runtime_config={"scenario_inline": {"name": "t", "steps": steps}})
                record = await engine.wait_task(task.task_id)
                events = await session_events(engine.store, session.session_id)
                assert record.state == "completed", events
                owner = json.loads((data / UIDS_FILE).read_text())["assigned"]["user:a"]
                for path in (workspace / "sub", workspace / "sub" / "new.txt", workspace / "made.txt"):
                    assert path.stat().st_uid == owner, f"{path} is owned by {path.stat().st_uid}, not {owner}"
                completed = [e.payload for e in events if e.type == EventType.TOOL_CALL_COMPLETED]
                assert all(not c.is_error for c in completed), completed  # type: ignore[attr-defined]
                said = "".join(getattr(e.payload, "text", "") for e in events
                               if e.type == EventType.MODEL_OUTPUT_COMPLETED)
                assert str(owner) in said, said  # `id -u`: the command ran as the namespace's uid

    trio.run(scenario)


@needs_root
def test_an_ephemeral_session_runs_as_its_namespaces_uid_in_a_home_of_its_own(open_tmp: Path) -> None:
    """With worker uids an ephemeral session's worker is its namespace's uid (so it works in the namespace's
    workspace), in a HOME owned by that uid that goes with the session; ``shared`` is refused here."""
    data = open_tmp / "data"
    argv = worker_argv_for_any_uid()
    assert argv is not None
    options = SupervisorOptions(
        data_dir=data, worker_argv=tuple(argv), worker_uids=RANGE,
        worker_env={"*": {"CODESDK_SCENARIO_DIR": str(REPO / "worker" / "adapters" / "scripted" / "scenarios")}},
        test_scenarios=True)

    async def scenario() -> None:
        with trio.fail_after(60):
            async with open_engine(options) as engine:
                namespace = "user:e"
                session = await engine.create_session(namespace=namespace, isolation=IsolationLevel.EPHEMERAL)
                workspace = Path(str(session.workspace))
                (workspace / "README.md").write_text("# Demo\n")
                give_workspace(workspace, namespace, data, RANGE)
                _, record, events = await run_task(engine, session_id=session.session_id,
                                                   permission_mode=PermissionMode.YOLO,
                                                   runtime_config={"scenario": "edit-file"})
                assert record.state == "completed", events
                assert "Edited by the scripted runtime." in (workspace / "README.md").read_text()
                identity = namespace_identity(data, RANGE, Namespace.parse(namespace))
                home = data / "ephemeral" / session.session_id / "home"
                assert (home.stat().st_uid, home.stat().st_mode & 0o777) == (identity.uid, 0o700)
                assert record.worker_pid is not None
                assert psutil.Process(record.worker_pid).uids().real == identity.uid
                assert psutil.Process(record.worker_pid).environ()["HOME"] == str(home)
                await engine.delete_session(session.session_id, by="test")
                assert not home.parent.exists()
                with pytest.raises(IsolationRefused, match="worker-uids"):
                    await engine.create_session(isolation=IsolationLevel.SHARED)

    trio.run(scenario)
