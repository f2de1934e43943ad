"""What operators see of the resource groups: ``/readyz`` details (a host without groups is degraded, not unready)
and ``/metrics`` per namespace with a live group (processes, memory, CPU, limits and limits hit)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
import trio

from codesdk.supervisor.api import TokenAuth
from codesdk.supervisor.api.server import create_app
from codesdk.supervisor.groups import GroupLimits

from tests.asgi import asgi_get as _get
from tests.conftest import MakeEngine
from tests.e2e.conftest import run_task


async def test_readyz_shows_groups_and_metrics_count_a_namespace_s_processes_and_limits(
        make_engine: MakeEngine, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("resource groups need root (as CI runs)")
    limits = GroupLimits(pids=200, memory=512 * 1024**2)
    with trio.fail_after(60):
        async with make_engine(resource_groups=True, group_limits=limits) as engine:
            groups = engine.pool.config.groups
            assert groups is not None
            if not groups.available:
                pytest.skip(f"no resource group can be created here: {groups.reason}")
            auth = TokenAuth.bootstrap(tmp_path / "auth")
            admin = (tmp_path / "auth" / "admin.token").read_text().strip()
            app = create_app(engine, auth)
            status, body = await _get(app, "/readyz")
            details = json.loads(body)["details"]["resource_groups"]
            assert status == 200 and details["enforced"] is True and details["defaults"]["pids"] == 200
            await run_task(engine, namespace="user:alice", runtime_config={"scenario": "echo"})
            status, body = await _get(app, "/metrics", admin)
            text = body.decode()
            assert status == 200
            assert 'codesdk_namespace_limit{namespace="user:alice",resource="pids"} 200.0' in text
            processes = next(line for line in text.splitlines()
                             if line.startswith('codesdk_namespace_processes{namespace="user:alice"}'))
            assert float(processes.split()[-1]) >= 1  # its worker, idle, still there
            assert 'codesdk_namespace_limit_hits{limit="pids",namespace="user:alice"}' in text
            assert 'codesdk_namespace_cpu_seconds{namespace="user:alice"}' in text
            worker = engine.pool.worker_of("user:alice")
            assert worker is not None
            await worker.shutdown(5.0)
            while engine.pool.worker_of("user:alice") is not None:
                await trio.sleep(0.02)
            _, body = await _get(app, "/metrics", admin)
            assert 'namespace="user:alice"' not in body.decode().split("codesdk_namespace_processes", 1)[1]


async def test_without_groups_readyz_stays_200_and_says_why(
        make_engine: MakeEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)  # as a non-root service would be
    with trio.fail_after(60), caplog.at_level(logging.WARNING, "codesdk.supervisor.groups"):
        async with make_engine(resource_groups=True) as engine:
            status, body = await _get(create_app(engine, TokenAuth.bootstrap(tmp_path / "auth")), "/readyz")
    assert status == 200
    details = json.loads(body)["details"]["resource_groups"]
    assert details["enforced"] is False and details["reason"].startswith("the supervisor is not root")
    lines = [r.getMessage() for r in caplog.records if "resource groups" in r.getMessage()]
    assert len(lines) == 1 and "not root" in lines[0]


