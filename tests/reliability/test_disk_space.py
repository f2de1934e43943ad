"""Free space: readiness and admission check the room a task needs (the data dir's and the workspace's file
systems, against a reserve), and a task or session refused for space says so, typed as the service's fault (HTTP
503, CLI exit 69) — never accepted to fail ``INTERNAL`` on ENOSPC.

Nothing fills a real disk: the free-space probe is a seam (``EngineConfig.free_space``); one test uses the real
probe on the test's own file system with a reserve above what is free there.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import trio

from codesdk.supervisor.engine import Engine, EngineConfig, InsufficientSpace, error_status
from codesdk.supervisor.tools import ToolRegistry, ToolsConfig
from codesdk.supervisor.workers.launch import PoolConfig
from tests.asgi import asgi_get as _get

MiB = 1 << 20


class Disk:
    """The seam: free bytes per path prefix (the rest has plenty)."""

    def __init__(self) -> None:
        self.free: dict[Path, int] = {}

    def __call__(self, path: Path) -> int:
        for prefix, free in self.free.items():
            if path == prefix or prefix in path.parents:
                return free
        return 1 << 40


def _config(data: Path, **options: Any) -> EngineConfig:
    return EngineConfig(data_dir=data, pool=PoolConfig(data_dir=data), **options)


async def test_a_full_data_dir_refuses_sessions_and_tasks_and_readyz_says_so(tmp_path: Path) -> None:
    from codesdk.supervisor.api import TokenAuth
    from codesdk.supervisor.api.server import create_app
    from codesdk.supervisor.cli.local import refusal_exit_code

    data, disk = tmp_path / "data", Disk()
    with trio.fail_after(60):
        async with Engine.open(_config(data, free_space=disk, disk_reserve_bytes=64 * MiB),
                               ToolRegistry(ToolsConfig())) as engine:
            session = await engine.create_session()
            app = create_app(engine, TokenAuth.bootstrap(tmp_path / "auth"))
            assert (await _get(app, "/readyz"))[0] == 200
            disk.free[data] = 10 * MiB
            status, body = await _get(app, "/readyz")
            assert status == 503 and b"insufficient_space" in body and b"data dir" in body
            with pytest.raises(InsufficientSpace, match=r"10\.0 MiB free .*needs 64\.0 MiB") as refused:
                await engine.start_task(session.session_id, "x")
            with pytest.raises(InsufficientSpace):
                await engine.create_session()
            answer = error_status(refused.value)
            assert answer is not None and (answer.status, answer.code) == (503, "insufficient_space")
            assert refusal_exit_code(refused.value) == 69
            assert await engine.store.list_tasks(session.session_id) == []  # nothing was stored
            disk.free.clear()  # space freed: accepted again
            assert (await _get(app, "/readyz"))[0] == 200


async def test_a_full_workspace_file_system_refuses_the_task(tmp_path: Path) -> None:
    data, workspace, disk = tmp_path / "data", tmp_path / "ws", Disk()
    workspace.mkdir()
    with trio.fail_after(60):
        async with Engine.open(_config(data, free_space=disk), ToolRegistry(ToolsConfig())) as engine:
            session = await engine.create_session(workspace=workspace)
            disk.free[workspace] = 0
            with pytest.raises(InsufficientSpace, match="workspace"):
                await engine.start_task(session.session_id, "x")


async def test_the_real_probe_on_a_real_file_system(tmp_path: Path) -> None:
    """The default probe (``statvfs``) on the test's own file system, with a reserve above what is free there."""
    free = shutil.disk_usage(tmp_path).free
    with trio.fail_after(60):
        async with Engine.open(_config(tmp_path / "data", disk_reserve_bytes=free + (1 << 30)),
                               ToolRegistry(ToolsConfig())) as engine:
            with pytest.raises(InsufficientSpace, match="data dir"):
                await engine.create_session()


#: Run in a mount namespace of its own (``unshare --user --map-root-user --mount``: nothing on the host changes),
#: on a 32 MiB tmpfs mounted there: a real file system that really fills up.
SMALL_DISK = """
import sys, trio
from pathlib import Path
from codesdk.supervisor.engine import Engine, EngineConfig, InsufficientSpace
from codesdk.supervisor.tools import ToolRegistry, ToolsConfig
from codesdk.supervisor.workers.launch import PoolConfig

async def main(data: Path) -> None:
    config = EngineConfig(data_dir=data, pool=PoolConfig(data_dir=data), disk_reserve_bytes=4 << 20)
    async with Engine.open(config, ToolRegistry(ToolsConfig())) as engine:
        session = await engine.create_session()
        assert engine.space_shortage() is None
        with open(data / "filler", "wb") as f:  # the disk fills up (another tenant, logs, ...)
            try:
                while True:
                    f.write(b"x" * (1 << 20))
                    f.flush()
            except OSError:
                pass
        try:
            await engine.start_task(session.session_id, "x")
        except InsufficientSpace as exc:
            print("REFUSED", exc)
        (data / "filler").unlink()
        assert engine.space_shortage() is None
        print("FREED")

trio.run(main, Path(sys.argv[1]))
"""


async def test_a_real_small_file_system_that_fills_up_refuses_the_task(tmp_path: Path) -> None:
    import subprocess
    import sys

    mount = tmp_path / "small"
    mount.mkdir()
    script = (f'mount -t tmpfs -o size=32m tmpfs "$1" || exit 97\n'
              f'exec "{sys.executable}" -c "$2" "$1/data"')
    argv = ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script, "sh", str(mount), SMALL_DISK]
    try:
        probe = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "true"], capture_output=True,
                               timeout=30, check=False)
    except FileNotFoundError:
        pytest.skip("unshare (util-linux) is not installed")
    if probe.returncode != 0:
        pytest.skip(f"no user and mount namespace can be made here: {probe.stderr.decode().strip()}")
    done = await trio.to_thread.run_sync(lambda: subprocess.run(argv, capture_output=True, timeout=120, text=True,
                                                                check=False))
    if done.returncode == 97:
        pytest.skip(f"a tmpfs cannot be mounted in a mount namespace here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    assert "REFUSED the data dir" in done.stdout and "free on its file system" in done.stdout, done.stdout
    assert "FREED" in done.stdout


def test_serve_takes_the_reserve_as_a_flag_and_refuses_tasks_below_it(tmp_path: Path) -> None:
    """``serve --disk-reserve`` above what any disk here has free: the service starts, and a task is refused for
    space (exit 69, one line naming the data dir), nothing stored."""
    from codesdk.supervisor.cli.common import EXIT_UNAVAILABLE
    from tests.e2e.test_cli_lifecycle import _cli, _service

    data = tmp_path / "data"
    with _service(data, "--disk-reserve", "1000000T"):
        token = (data / "admin.token").read_text().strip()
        remote = ("--url", f"unix:{data / 'api.sock'}", "--token", token)
        refused = _cli(data, *remote, "run", "hello")
        listed = _cli(data, *remote, "sessions", "--json")
    assert refused.returncode == EXIT_UNAVAILABLE, (refused.returncode, refused.stderr)
    assert str(data) in refused.stderr and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert listed.returncode == 0 and listed.stdout.strip() == "", listed.stdout
