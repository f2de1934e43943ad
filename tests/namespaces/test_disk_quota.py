"""A namespace's disk quota, kept by the kernel: its HOME tree and default workspaces on an ext4 image of its own.

The tests that mount run as root only (they skip elsewhere, saying why), on 16 MiB images in the test's own
directory; every mount they make is undone whatever the outcome (``mounted_disks``).
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from codesdk.supervisor.engine import Engine, EngineConfig
from codesdk.supervisor.namespaces import (
    DiskQuota,
    DiskQuotaError,
    Namespace,
    NamespaceDisks,
    WorkspaceRefused,
    check_workspace,
    disk_unsupported,
    make_workspace,
    prepare_namespace,
)
from codesdk.supervisor.tools import ToolContext, ToolLimits, ToolRegistry, ToolResult
from codesdk.supervisor.workers.launch import PoolConfig

from tests.asgi import asgi_get

MiB = 1 << 20
QUOTA = DiskQuota(16 * MiB)
FEW_FILES = DiskQuota(16 * MiB, 48)


def _mounts_under(root: Path) -> list[str]:
    prefix = str(root.resolve()) + "/"
    with open("/proc/self/mountinfo") as info:
        points = [re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split()[4]) for line in info]
    return [p for p in points if p.startswith(prefix)]


@pytest.fixture
def mounted_disks(tmp_path: Path) -> Iterator[Path]:
    """The data dir; every mount below it undone at the end, lazily if a test left one busy."""
    if (reason := disk_unsupported()) is not None:
        pytest.skip(f"per-namespace volumes cannot be made here: {reason}")
    data = tmp_path / "data"
    try:
        yield data
    finally:
        NamespaceDisks(data).unmount_all()
        for point in reversed(_mounts_under(tmp_path)):  # whatever a failing test left
            subprocess.run(["umount", "-l", point], check=False, capture_output=True)
        assert _mounts_under(tmp_path) == []


async def _tool(ws: Path, name: str, args: dict[str, Any]) -> ToolResult:
    with trio.fail_after(30):
        return await ToolRegistry().execute(name, args, ToolContext(ws, ToolLimits()))


def _error(result: ToolResult) -> tuple[str, str]:
    assert result.is_error and isinstance(result.content, dict), result
    error: Any = result.content["error"]
    return str(error["code"]), str(error["message"])


async def _fill(ws: Path, size: int, most: int) -> tuple[int, ToolResult]:
    """Write files of ``size`` bytes until one fails (at most ``most``): how many went in, and the failure."""
    for n in range(most):
        result = await _tool(ws, "workspace.write", {"path": f"fill/{n}.txt", "content": "x" * size})
        if result.is_error:
            return n, result
    raise AssertionError(f"{most} files of {size} bytes all fitted: no quota held")


async def _admin_get(engine: Engine, data: Path, path: str) -> str:
    """One GET on the API's app, in-process, with the admin token."""
    from codesdk.supervisor.api import TokenAuth
    from codesdk.supervisor.api.server import create_app

    auth = TokenAuth.bootstrap(data.parent / "auth")
    token = (data.parent / "auth" / "admin.token").read_text().strip()
    status, body = await asgi_get(create_app(engine, auth), path, token)
    assert status == 200, body
    return body.decode()


# -- without mounting ---------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "quota"), [("16M", DiskQuota(16 * MiB)), ("1G:5000", DiskQuota(1 << 30, 5000)),
                                             ("33554432", DiskQuota(32 * MiB))])
def test_quota_parses(text: str, quota: DiskQuota) -> None:
    assert DiskQuota.parse(text) == quota
    assert DiskQuota.parse(str(quota)) == quota


@pytest.mark.parametrize(("text", "fragment"), [("1M", "too small"), ("16Q", "invalid size"),
                                                ("16M:x", "file count"), ("16M:3", "at least")])
def test_bad_quotas_say_why(text: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        DiskQuota.parse(text)


def test_overrides_are_kept_in_the_data_dir(tmp_path: Path) -> None:
    disks = NamespaceDisks(tmp_path, QUOTA)
    disks.set_override("user:a", DiskQuota(64 * MiB, 100))
    again = NamespaceDisks(tmp_path, QUOTA)
    assert again.quota_for("user:a") == DiskQuota(64 * MiB, 100) and again.quota_for("user:b") == QUOTA
    assert (tmp_path / "namespace-disks.json").stat().st_mode & 0o777 == 0o600
    again.set_override("user:a", None)
    assert NamespaceDisks(tmp_path).quota_for("user:a") is None and not NamespaceDisks(tmp_path).enabled


def test_a_workspace_on_another_namespaces_disk_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    own = data / "volumes" / "user.a" / "workspaces" / "ses_1"
    assert check_workspace(own, data) == own.resolve()  # a namespace's own disk: allowed
    with pytest.raises(WorkspaceRefused, match="another namespace's disk"):
        make_workspace(data / "volumes" / "user.b" / "workspaces" / "ses_2", "user:a", data, None)
    with pytest.raises(WorkspaceRefused, match="inside the supervisor's data dir"):
        check_workspace(data / "volumes" / "user.a" / "namespace", data)  # its HOME tree is no workspace


async def test_a_full_disk_is_a_disk_full_tool_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ENOSPC from any write the tools make is ``disk_full``, saying how full the workspace's disk is."""
    import errno

    from codesdk.supervisor.tools import _fsops

    def no_space(*_: object) -> str:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(_fsops, "write_temp", no_space)
    code, message = _error(await _tool(tmp_path, "workspace.write", {"path": "a.txt", "content": "x"}))
    assert code == "disk_full" and "file system is full" in message and "files used" in message, message


# -- mounted, as root ---------------------------------------------------------------------------


async def test_a_disk_filler_fails_at_the_quota_and_others_keep_writing(mounted_disks: Path) -> None:
    """Workspace writes past a namespace's 16 MiB fail ``disk_full`` naming its quota; another namespace and the
    store keep writing; the reserve is not taken for the namespace's own volume; the data survives a restart."""
    data = mounted_disks
    disks = NamespaceDisks(data, QUOTA)
    config = EngineConfig(data_dir=data, pool=PoolConfig(data_dir=data, disks=disks),
                          disk_reserve_bytes=64 * MiB)  # more than the whole volume: it must not apply to it
    with trio.fail_after(120):
        async with Engine.open(config, ToolRegistry()) as engine:
            tenant = await engine.create_session(namespace="user:a")
            other = await engine.create_session(namespace="user:b")
            ws = Path(str(tenant.workspace))
            assert ws.parent == data.resolve() / "volumes" / "user.a" / "workspaces", ws
            assert engine.space_shortage(ws) is None
            written, failed = await _fill(ws, 1 * MiB, 40)
            code, message = _error(failed)
            assert code == "disk_full" and "namespace's disk quota is full" in message, message
            assert 8 <= written <= 16, written  # about 16 MiB went in, less the file system's own
            usage = disks.usage("user:a")
            assert usage is not None and usage.full and usage.limit_bytes <= 16 * MiB
            # Another namespace, and the store, write on.
            ok = await _tool(Path(str(other.workspace)), "workspace.write", {"path": "b.txt", "content": "b" * MiB})
            assert not ok.is_error, ok
            await engine.create_session(namespace="user:a")  # stored, with its own (empty) workspace
            assert len(await engine.store.list_sessions()) == 3
            metrics = await _admin_get(engine, data, "/metrics")
            assert re.search(r'codesdk_namespace_disk_limit_bytes\{namespace="user:a"\} 1\.5\d*e\+07', metrics), metrics
            assert re.search(r'codesdk_namespace_disk_used_files\{namespace="user:a"\} \d', metrics), metrics
            assert 'codesdk_namespace_disk_used_bytes{namespace="user:b"}' in metrics  # its own volume, too
        assert _mounts_under(data) == []  # unmounted at shutdown
        async with Engine.open(config, ToolRegistry()) as engine:  # a restart: remounted with its data
            await engine.create_session(namespace="user:a")
            assert (ws / "fill" / "0.txt").read_text() == "x" * MiB


async def test_an_ephemeral_home_is_on_its_namespaces_volume_and_goes_with_its_session(mounted_disks: Path) -> None:
    """An ephemeral session's HOME counts against its namespace's quota (it is on its volume); deleting the session
    removes it there, and what sessions deleted while the service was down left on that volume."""
    from codesdk.protocol import IsolationLevel
    from codesdk.supervisor.ids import new_id

    data = mounted_disks
    config = EngineConfig(data_dir=data, pool=PoolConfig(data_dir=data, disks=NamespaceDisks(data, QUOTA)))
    with trio.fail_after(120):
        async with Engine.open(config, ToolRegistry()) as engine:
            session = await engine.create_session(namespace="user:e", isolation=IsolationLevel.EPHEMERAL)
            task = await engine.start_task(session.session_id, "hello")
            assert (await engine.wait_task(task.task_id)).state == "completed"
            volume = data / "volumes" / "user.e"
            home = volume / "ephemeral" / session.session_id / "home"
            assert home.is_dir() and not (data / "ephemeral" / session.session_id).exists()
            assert home.stat().st_dev == volume.stat().st_dev != data.stat().st_dev  # on the volume
            stale = volume / "ephemeral" / new_id("ses")
            stale.mkdir()
            await engine.delete_session(session.session_id, by="test")
            assert not home.parent.exists() and not stale.exists()


async def test_the_files_quota_holds(mounted_disks: Path) -> None:
    disks = NamespaceDisks(mounted_disks, FEW_FILES)
    disks.ensure(Namespace.parse("user:f"))
    ws = make_workspace(mounted_disks / "volumes" / "user.f" / "workspaces" / "ses_f", "user:f", mounted_disks, None)
    written, failed = await _fill(ws, 10, 80)
    code, message = _error(failed)
    assert code == "disk_full" and "namespace's disk quota is full" in message, message
    assert 20 <= written <= 48, written
    usage = disks.usage("user:f")
    assert usage is not None and usage.used_files == usage.limit_files and usage.used_bytes < 4 * MiB


def test_home_is_on_the_volume_and_owned_by_the_namespace_uid(mounted_disks: Path) -> None:
    from codesdk.supervisor.namespaces import UidRange

    disks = NamespaceDisks(mounted_disks, QUOTA)
    namespace = Namespace.parse("user:h")
    disks.ensure(namespace)
    dirs, identity = prepare_namespace(mounted_disks, namespace, UidRange(3_100_000, 4))
    assert identity is not None
    assert os.path.ismount(dirs.root) and dirs.home.stat().st_uid == identity.uid
    (dirs.home / "note").write_text("kept")
    assert (mounted_disks / "volumes" / "user.h" / "namespace" / "home" / "note").read_text() == "kept"
    assert (mounted_disks / "volumes" / "user.h.img").stat().st_mode & 0o777 == 0o600


def test_existing_files_move_onto_a_new_volume(mounted_disks: Path) -> None:
    namespace = Namespace.parse("user:m")
    dirs, _ = prepare_namespace(mounted_disks, namespace, None)
    (dirs.home / "cache.bin").write_bytes(b"c" * MiB)
    NamespaceDisks(mounted_disks, QUOTA).ensure(namespace)
    assert os.path.ismount(dirs.root) and (dirs.home / "cache.bin").read_bytes() == b"c" * MiB
    NamespaceDisks(mounted_disks).unmount_all()
    assert not any(dirs.root.iterdir())  # off the host disk: only on the volume now
    NamespaceDisks(mounted_disks, QUOTA).ensure(namespace)
    assert (dirs.home / "cache.bin").read_bytes() == b"c" * MiB


def test_existing_files_too_big_for_the_quota_are_left_in_place(mounted_disks: Path) -> None:
    namespace = Namespace.parse("user:big")
    dirs, _ = prepare_namespace(mounted_disks, namespace, None)
    (dirs.data / "huge").write_bytes(b"h" * (20 * MiB))
    with pytest.raises(DiskQuotaError, match=r"do not fit its disk quota 16M.*namespace disk set user:big"):
        NamespaceDisks(mounted_disks, QUOTA).ensure(namespace)
    assert (dirs.data / "huge").stat().st_size == 20 * MiB and not os.path.ismount(dirs.root)
    assert not list((mounted_disks / "volumes").glob("*.img*"))


def test_a_raised_quota_grows_the_volume(mounted_disks: Path) -> None:
    namespace = Namespace.parse("user:g")
    disks = NamespaceDisks(mounted_disks, QUOTA)
    disks.ensure(namespace)
    before = disks.usage("user:g")
    disks.set_override("user:g", DiskQuota(32 * MiB))
    disks.ensure(namespace)
    after = disks.usage("user:g")
    assert before is not None and after is not None
    assert after.limit_bytes > before.limit_bytes + 12 * MiB and after.limit_files > before.limit_files


# -- workspace.exec -----------------------------------------------------------------------------


def _exec_registry(**policy: Any) -> ToolRegistry:
    from codesdk.supervisor.tools import ExecPolicy, ToolsConfig

    return ToolRegistry(ToolsConfig(exec=ExecPolicy(enabled=True, allowlist=("dd",), **policy)))


async def _sandbox_or_skip() -> None:
    from codesdk.supervisor.tools import probe_sandbox

    tools = await probe_sandbox()
    if tools.prlimit is None:
        pytest.skip("`prlimit` is unavailable here")
    if tools.netns_prefix is None and tools.bwrap is None:
        pytest.skip("no sandbox here: `unshare -n` fails and bubblewrap does not run")


async def _dd(registry: ToolRegistry, ws: Path, mib: int) -> ToolResult:
    with trio.fail_after(60):
        return await registry.execute("workspace.exec", {"argv": ["dd", "if=/dev/zero", "of=big", "bs=1M",
                                                                   f"count={mib}"]}, ToolContext(ws, ToolLimits()))


async def test_exec_caps_the_size_of_one_file(tmp_path: Path) -> None:
    """RLIMIT_FSIZE: a command cannot write a file past ``ExecPolicy.max_file_bytes`` (it gets SIGXFSZ)."""
    await _sandbox_or_skip()
    registry = _exec_registry(max_file_bytes=2 * MiB)
    result = await _dd(registry, tmp_path, 8)
    assert result.is_error and (tmp_path / "big").stat().st_size <= 2 * MiB, result.content
    assert not (await _dd(registry, tmp_path, 1)).is_error


async def test_an_exec_filler_fails_at_the_quota_with_a_note(mounted_disks: Path) -> None:
    """``dd`` past the namespace's quota gets ENOSPC from the kernel; the result tells the model why."""
    await _sandbox_or_skip()
    disks = NamespaceDisks(mounted_disks, QUOTA)
    disks.ensure(Namespace.parse("user:x"))
    ws = await trio.to_thread.run_sync(make_workspace, mounted_disks / "volumes" / "user.x" / "workspaces" / "ses_x",
                                       "user:x", mounted_disks, None)
    registry = _exec_registry()
    result = await _dd(registry, ws, 40)
    assert result.is_error and isinstance(result.content, dict), result
    assert "No space left" in str(result.stderr), result.stderr
    assert "namespace's disk quota is full" in str(result.content.get("note")), result.content
    assert (ws / "big").stat().st_size < 16 * MiB


# -- operator's command lines -------------------------------------------------------------------


def test_namespace_disk_set_show_unset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from codesdk.supervisor.cli.admin import main

    where = ["--data-dir", str(tmp_path)]
    assert main(["namespace", "disk", "set", "user:a", "32M:100", *where]) == 0
    assert "quota\t32M:100" in capsys.readouterr().out
    assert NamespaceDisks(tmp_path).quota_for("user:a") == DiskQuota(32 * MiB, 100)
    assert main(["namespace", "disk", "show", "user:a", *where]) == 0
    assert "volume not mounted" in capsys.readouterr().out
    assert main(["namespace", "disk", "unset", "user:a", *where]) == 0
    assert NamespaceDisks(tmp_path).quota_for("user:a") is None
    with pytest.raises(SystemExit):
        main(["namespace", "disk", "set", "user:a", "1M", *where])
    assert "too small for a file system" in capsys.readouterr().err


def test_serve_takes_the_disk_flags(tmp_path: Path) -> None:
    from codesdk.supervisor.cli.admin import _serve_options, build_parser

    args = build_parser().parse_args(["serve", "--data-dir", str(tmp_path), "--namespace-disk", "64M:1000",
                                      "--exec-max-file-size", "100M"])
    options = _serve_options(args)
    assert options.namespace_disk == DiskQuota(64 * MiB, 1000) and options.exec_max_file_bytes == 100 * MiB
    unlimited = build_parser().parse_args(["serve", "--data-dir", str(tmp_path), "--exec-max-file-size", "none"])
    assert _serve_options(unlimited).exec_max_file_bytes is None


def test_serve_refuses_a_disk_quota_the_host_cannot_keep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Asked for quotas it cannot keep (not root, no loop devices), the service says so and does not start."""
    from codesdk.supervisor.service import assembly
    from codesdk.supervisor.service.assembly import SupervisorOptions
    from codesdk.supervisor.service.serve import ServiceRefused, run_service

    monkeypatch.setattr(assembly, "disk_unsupported", lambda: "this host has no loop devices (/dev/loop-control)")
    options = SupervisorOptions(data_dir=tmp_path / "data", namespace_disk=QUOTA)
    with pytest.raises(ServiceRefused, match=r"--namespace-disk 16M: this host has no loop devices.*drop the flag"):
        run_service(options, tmp_path / "api.sock")
    assert not (tmp_path / "data").exists()


# -- the whole flow: a worker of its own uid, the scripted runtime, the tools -----------------------


@pytest.fixture
def open_disks(open_tmp: Path) -> Iterator[Path]:
    """``mounted_disks`` in a temp dir every uid can pass through (for workers of their own uids)."""
    from tests.reliability.probe_worker import why_no_worker_uids

    if (reason := disk_unsupported() or why_no_worker_uids()) is not None:
        pytest.skip(f"per-namespace volumes with worker uids cannot be made here: {reason}")
    data = open_tmp / "data"
    try:
        yield data
    finally:
        NamespaceDisks(data).unmount_all()
        for point in reversed(_mounts_under(open_tmp)):
            subprocess.run(["umount", "-l", point], check=False, capture_output=True)
        assert _mounts_under(open_tmp) == []


def test_a_tenant_filling_its_disk_through_its_runtime_reads_why(open_disks: Path) -> None:
    """Through the engine, a worker of the namespace's own uid and the scripted runtime: exec's ``dd`` and a
    ``workspace.write`` past the 16 MiB quota fail, and what the runtime is given (the model reads) says the
    namespace's disk quota is full; the worker's HOME is on the volume, and the task still completes."""
    from codesdk.protocol import EventType, PermissionMode
    from codesdk.supervisor.engine import session_events
    from codesdk.supervisor.namespaces import UidRange
    from codesdk.supervisor.service.assembly import SupervisorOptions, open_engine
    from codesdk.supervisor.workers.launch import WorkerPolicy

    from tests.reliability.probe_worker import worker_argv_for_any_uid
    from tests.worker.harness import REPO

    argv = worker_argv_for_any_uid()
    assert argv is not None
    options = SupervisorOptions(
        data_dir=open_disks, worker_argv=tuple(argv), worker_uids=UidRange(3_920_000, 4),
        worker_policy=WorkerPolicy(idle_timeout_s=60), exec_allowlist=("dd",), namespace_disk=QUOTA,
        worker_env={"*": {"CODESDK_SCENARIO_DIR": str(REPO / "worker" / "adapters" / "scripted" / "scenarios")}},
        test_scenarios=True)
    steps = [
        {"tool_calls": [{"id": "e", "name": "workspace.exec",
                         "input": {"argv": ["dd", "if=/dev/zero", "of=big", "bs=1M", "count=40"]}}]},
        {"tool_calls": [{"id": "w", "name": "workspace.write", "input": {"path": "more.txt", "content": "m" * MiB}}]},
        {"text": "EXEC {{result:e}} WRITE {{result:w}}"},
        {"complete": {}},
    ]

    async def scenario() -> None:
        with trio.fail_after(120):
            async with open_engine(options) as engine:
                session = await engine.create_session(namespace="user:a")
                workspace = Path(session.workspace or "")
                assert workspace.parent == open_disks.resolve() / "volumes" / "user.a" / "workspaces"
                task = await engine.start_task(session.session_id, "fill", permission_mode=PermissionMode.YOLO,
                                               runtime_config={"scenario_inline": {"name": "t", "steps": steps}})
                record = await engine.wait_task(task.task_id)
                events = await session_events(engine.store, session.session_id)
                assert record.state == "completed", events
                said = "".join(getattr(e.payload, "text", "") for e in events
                               if e.type == EventType.MODEL_OUTPUT_COMPLETED)
                exec_part, _, write_part = said.partition(" WRITE ")
                assert "No space left" in exec_part and "namespace's disk quota is full" in exec_part, exec_part
                assert "disk_full" in write_part and "namespace's disk quota is full" in write_part, write_part
                assert os.path.ismount(Namespace.parse("user:a").root(open_disks))  # HOME is on the volume
                other = await engine.create_session(namespace="user:b")  # another tenant is not affected
                assert not (await _tool(Path(str(other.workspace)), "workspace.write",
                                        {"path": "b.txt", "content": "b" * MiB})).is_error

    trio.run(scenario)


def test_a_session_does_not_move_a_running_namespace_onto_a_new_volume(mounted_disks: Path) -> None:
    """A quota set while the namespace has files (its worker may be running on them): its next session's
    workspace stays on the host disk; the volume is made at its next worker start, with the files moved in."""
    namespace = Namespace.parse("user:r")
    dirs, _ = prepare_namespace(mounted_disks, namespace, None)
    (dirs.home / "in-use").write_text("busy")
    disks = NamespaceDisks(mounted_disks, QUOTA)
    assert disks.ensure(namespace, move_files_in=False) is None and not os.path.ismount(dirs.root)
    assert (dirs.home / "in-use").read_text() == "busy"
    assert disks.ensure(namespace) is not None and (dirs.home / "in-use").read_text() == "busy"


def test_serve_says_at_start_up_whether_disks_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from codesdk.supervisor.service import serve
    from codesdk.supervisor.service.assembly import SupervisorOptions

    caplog.set_level(logging.INFO, logger="codesdk.supervisor.service")
    serve._say_disk_quotas(SupervisorOptions(data_dir=tmp_path, namespace_disk=QUOTA))
    serve._say_disk_quotas(SupervisorOptions(data_dir=tmp_path))
    NamespaceDisks(tmp_path).set_override("user:a", QUOTA)
    monkeypatch.setattr(serve, "disk_unsupported", lambda: "the supervisor is not root")
    serve._say_disk_quotas(SupervisorOptions(data_dir=tmp_path))
    said = [r.getMessage() for r in caplog.records]
    assert "volume of its own: 16M each" in said[0] and "are not bounded" in said[1], said
    assert "1 namespaces have a disk quota" in said[2] and "not root: their workers will be refused" in said[2]


def test_a_dropped_quota_keeps_the_volume_and_its_files(mounted_disks: Path) -> None:
    namespace = Namespace.parse("user:d")
    disks = NamespaceDisks(mounted_disks)
    disks.set_override("user:d", QUOTA)
    disks.ensure(namespace)
    dirs, _ = prepare_namespace(mounted_disks, namespace, None)
    (dirs.home / "kept").write_text("yes")
    disks.unmount_all()
    disks.set_override("user:d", None)
    assert disks.ensure(namespace) is not None and disks.workspaces("user:d") is None  # new workspaces: shared
    assert (namespace.root(mounted_disks) / "home" / "kept").read_text() == "yes"


async def test_a_session_in_a_namespace_whose_disk_is_full_is_refused_saying_so(mounted_disks: Path) -> None:
    """Its workspace cannot be made: a refusal naming the quota and what to do (429 ``namespace_disk_full``), not a
    fault (500); nothing is stored; another namespace goes on."""
    from codesdk.supervisor.engine import NamespaceDiskFull, error_status

    data = mounted_disks
    config = EngineConfig(data_dir=data, pool=PoolConfig(data_dir=data, disks=NamespaceDisks(data, FEW_FILES)))
    with trio.fail_after(120):
        async with Engine.open(config, ToolRegistry()) as engine:
            tenant = await engine.create_session(namespace="user:full")
            await _fill(Path(str(tenant.workspace)), 10, 80)  # every inode taken
            with pytest.raises(NamespaceDiskFull) as refused:
                await engine.create_session(namespace="user:full")
            message = str(refused.value)
            assert "namespace user:full's disk is full" in message and "files used" in message, message
            assert "delete files" in message, message
            answer = error_status(refused.value)
            assert answer is not None and (answer.status, answer.code) == (429, "namespace_disk_full")
            assert len(await engine.store.list_sessions()) == 1
            await engine.create_session(namespace="user:other")


@pytest.mark.parametrize(("text", "said"), [("99999999T", "above 16T"), ("17T", "above 16T"),
                                            ("16M:4294967296", "at most 4294967295 files")])
def test_a_quota_no_volume_could_hold_is_refused_when_set(text: str, said: str) -> None:
    with pytest.raises(ValueError, match=said):
        DiskQuota.parse(text)


@pytest.mark.parametrize("planted", ["namespaces/user.sym", "volumes/user.sym.img", "volumes/user.sym"])
def test_a_symlink_planted_where_a_volume_goes_is_refused_before_anything_is_mounted(
        mounted_disks: Path, tmp_path: Path, planted: str) -> None:
    """mount(8) follows symlinks: a volume must never be mounted on, or from, where a symlink points."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("kept")
    data = mounted_disks
    disks = NamespaceDisks(data, QUOTA)
    disks.ensure(Namespace.parse("user:other"))  # makes the data dir's layout; another namespace is fine
    link = data / planted
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(victim)
    for _ in range(3):  # asked again and again: refused each time, nothing piles up
        with pytest.raises(DiskQuotaError, match="is a symlink; refusing to mount"):
            disks.ensure(Namespace.parse("user:sym"))
    assert [p for p in _mounts_under(tmp_path) if str(victim) in p] == []
    assert (victim / "keep").read_text() == "kept" and sorted(os.listdir(victim)) == ["keep"]
