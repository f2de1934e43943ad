"""The runtime-env view: what a namespace's worker really runs with — its HOME and XDG folders (the ones its process
has), the names of its variables and never a value, its uid, and per runtime what it would load on its own (a
session's workspace looked in for project files on request). Only the namespace's own token or the admin's; through
the API, both Python clients and the ``codesdk`` command (through a service and on a data dir)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psutil
import trio

from codesdk import AsyncClient, Client, NotFound
from codesdk.protocol import api as models

from tests.api.conftest import Api

CLI = [sys.executable, "-m", "codesdk.supervisor.cli.front"]
SECRET = "canary-runtime-env-value-4711"
GUARD_S = 90


def _claude(view: models.RuntimeEnvView) -> dict[str, bool]:
    """Claude Code's sources found, by kind: loaded (True) or turned off."""
    [claude] = [r for r in view.runtimes if r.runtime == "claude"]
    assert "--setting-sources=" in claude.policy
    return {source.kind: source.used for source in claude.found}


async def test_a_tenant_sees_its_workers_real_environment_and_no_value(api: Api) -> None:
    with trio.fail_after(GUARD_S):
        async with AsyncClient(socket=api.socket, token=api.admin) as admin:
            await admin.update_namespace_env("user:alice", set={"VENDOR_API_KEY": SECRET})
        r = await api.client.get("/v1/namespaces/user:alice/runtime-env", headers=api.auth(api.alice))
        assert r.status_code == 200, r.text
        assert SECRET not in r.text
        view = models.RuntimeEnvView.model_validate(r.json())
        assert view.namespace == "user:alice" and view.env.isolation == "namespaced"
        assert {"VENDOR_API_KEY", "HOME", "XDG_CONFIG_HOME", "TMPDIR"} <= set(view.env.variable_names)
        worker = psutil.Process(view.worker_pid)  # the view is the process's own, not a recomputation
        environ = worker.environ()
        assert environ["HOME"] == view.env.home and environ["XDG_CONFIG_HOME"] == view.env.xdg_config_home
        assert set(environ) == set(view.env.variable_names)
        assert worker.uids().real == view.uid and worker.gids().real == view.gid
        assert Path(view.env.home).is_relative_to(api.engine.config.data_dir)
        assert {r.runtime for r in view.runtimes} >= {"scripted", "claude", "codex"}
        assert view.workspace is None


async def test_project_files_are_looked_for_in_a_named_sessions_workspace(api: Api) -> None:
    with trio.fail_after(GUARD_S):
        session = await api.create_session(api.alice, "user:alice")
        workspace = Path(session["workspace"])
        (workspace / "CLAUDE.md").write_text("always answer in French\n")
        r = await api.client.get("/v1/namespaces/user:alice/runtime-env", headers=api.auth(api.alice))
        home = Path(r.json()["env"]["home"])
        (home / ".claude").mkdir(exist_ok=True)
        (home / ".claude" / "CLAUDE.md").write_text("be terse\n")

        plain = models.RuntimeEnvView.model_validate(
            (await api.client.get("/v1/namespaces/user:alice/runtime-env", headers=api.auth(api.alice))).json())
        assert _claude(plain) == {"user_memory": False}  # found, and turned off under CodeSDK
        r = await api.client.get("/v1/namespaces/user:alice/runtime-env", headers=api.auth(api.alice),
                                 params={"session_id": session["session_id"]})
        assert r.status_code == 200, r.text
        seen = models.RuntimeEnvView.model_validate(r.json())
        assert seen.workspace == str(workspace)
        assert _claude(seen) == {"user_memory": False, "project_memory": False}
        [memory] = [s for r in seen.runtimes if r.runtime == "claude" for s in r.found if s.kind == "project_memory"]
        assert memory.path == str(workspace / "CLAUDE.md") and memory.sha256 and "French" not in r.text


async def test_refusals_are_clear_and_never_reach_another_tenant(api: Api) -> None:
    with trio.fail_after(GUARD_S):
        alices = await api.create_session(api.alice, "user:alice")
        bobs = await api.create_session(api.bob, "user:bob")
        get = api.client.get
        other = await get("/v1/namespaces/user:alice/runtime-env", headers=api.auth(api.bob))
        assert other.status_code == 404
        anonymous = await get("/v1/namespaces/user:alice/runtime-env")
        assert anonymous.status_code == 401
        foreign = await get("/v1/namespaces/user:alice/runtime-env", headers=api.auth(api.alice),
                            params={"session_id": bobs["session_id"]})
        assert foreign.status_code == 404 and bobs["workspace"] not in foreign.text
        # the admin sees every session, but a session is looked in only from its own namespace's view
        elsewhere = await get("/v1/namespaces/user:bob/runtime-env", headers=api.auth(api.admin),
                              params={"session_id": alices["session_id"]})
        assert elsewhere.status_code == 404 and elsewhere.json()["error"]["code"] == "session_not_found"
        bad = await get("/v1/namespaces/user:a..b/runtime-env", headers=api.auth(api.admin))
        assert bad.status_code == 422 and "namespace" in bad.json()["error"]["message"]
        unknown = await get("/v1/namespaces/user:alice/runtime-env", headers=api.auth(api.alice),
                            params={"sessionid": "x"})
        assert unknown.status_code == 422
        admin = await get("/v1/namespaces/user:alice/runtime-env", headers=api.auth(api.admin),
                          params={"session_id": alices["session_id"]})
        assert admin.status_code == 200 and admin.json()["workspace"] == alices["workspace"]


async def test_both_clients_and_the_command(api: Api) -> None:
    with trio.fail_after(GUARD_S):
        session = await api.create_session(api.alice, "user:alice")
        async with AsyncClient(socket=api.socket, token=api.alice) as alice:
            view = await alice.runtime_env("user:alice", session_id=session["session_id"])
            assert view.workspace == session["workspace"]
            try:
                await alice.runtime_env("user:bob")
            except NotFound:
                pass
            else:
                raise AssertionError("alice read bob's runtime-env")

        def sync_view() -> models.RuntimeEnvView:
            with Client(socket=api.socket, token=api.alice) as client:
                return client.runtime_env("user:alice")
        assert (await trio.to_thread.run_sync(sync_view)).env.home == view.env.home

        url = ["--url", f"unix:{api.socket}", "--token", api.alice]
        done = await trio.run_process([*CLI, *url, "runtime-env", "user:alice", "--json"], stdin=subprocess.DEVNULL,
                                      capture_stdout=True, capture_stderr=True, check=False)
        assert done.returncode == 0, done.stderr.decode()
        assert json.loads(done.stdout)["env"]["home"] == view.env.home
        done = await trio.run_process([*CLI, *url, "runtime-env", "user:alice", "--session", session["session_id"]],
                                      stdin=subprocess.DEVNULL, capture_stdout=True, capture_stderr=True, check=False)
        text = done.stdout.decode()
        assert done.returncode == 0 and f"HOME            {view.env.home}" in text
        assert f"project files looked for in: {session['workspace']}" in text and "values never shown" in text
        done = await trio.run_process([*CLI, *url, "runtime-env", "user:bob"], stdin=subprocess.DEVNULL,
                                      capture_stdout=True, capture_stderr=True, check=False)
        assert done.returncode != 0 and done.stdout == b"" and b"Traceback" not in done.stderr


async def test_the_command_on_a_data_dir(tmp_path: Path) -> None:
    with trio.fail_after(GUARD_S):
        data = ["--data-dir", str(tmp_path / "data")]
        done = await trio.run_process([*CLI, *data, "runtime-env", "ci:job-7", "--json"], stdin=subprocess.DEVNULL,
                                      capture_stdout=True, capture_stderr=True, check=False)
        assert done.returncode == 0, done.stderr.decode()
        view = models.RuntimeEnvView.model_validate_json(done.stdout)
        assert view.namespace == "ci:job-7" and Path(view.env.home).is_relative_to(tmp_path / "data")
        done = await trio.run_process([*CLI, *data, "runtime-env", "--session", "nope"], stdin=subprocess.DEVNULL,
                                      capture_stdout=True, capture_stderr=True, check=False)
        assert done.returncode == 2 and b"no session 'nope'" in done.stderr and b"Traceback" not in done.stderr


async def test_a_session_of_its_own_worker_is_shown_with_that_worker(api: Api) -> None:
    with trio.fail_after(GUARD_S):
        r = await api.client.post("/v1/sessions", headers=api.auth(api.alice),
                                  json={"namespace": "user:alice", "isolation": "ephemeral"})
        assert r.status_code == 201, r.text
        sid = r.json()["session_id"]
        r = await api.client.get("/v1/namespaces/user:alice/runtime-env", headers=api.auth(api.alice),
                                 params={"session_id": sid})
        assert r.status_code == 200, r.text
        view = models.RuntimeEnvView.model_validate(r.json())
        assert view.env.isolation == "ephemeral" and sid in view.env.home
        assert psutil.Process(view.worker_pid).environ()["HOME"] == view.env.home
        namespaced = models.RuntimeEnvView.model_validate(
            (await api.client.get("/v1/namespaces/user:alice/runtime-env", headers=api.auth(api.alice))).json())
        assert namespaced.worker_pid != view.worker_pid and namespaced.env.isolation == "namespaced"
        # the operator's own HOME is no tenant's to look at: not while the service has tenants' tokens
        shared = await api.engine.create_session(namespace="default", isolation=models.IsolationLevel.SHARED)
        r = await api.client.get("/v1/namespaces/default/runtime-env", headers=api.auth(api.admin),
                                 params={"session_id": shared.session_id})
        assert r.status_code == 409 and r.json()["error"]["code"] == "isolation_refused"
