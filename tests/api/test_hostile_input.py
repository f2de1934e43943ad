"""Input that must neither wedge a session nor answer 500: each refused whole, before anything is stored."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from codesdk.supervisor.api import TOKENS_FILE, TokenAuth, TokenFileInvalid, hash_token
from codesdk.supervisor.engine import EngineError
from codesdk.supervisor.namespaces import InvalidNamespace, Namespace

from tests.conftest import MakeEngine
from tests.worker.harness import REPO
from tests.api.conftest import Api


async def _post_raw(api: Api, path: str, body: bytes, token: str) -> tuple[int, str]:
    r = await api.client.post(path, content=body, headers={**api.auth(token), "content-type": "application/json"})
    return r.status_code, r.text


async def _session_still_works(api: Api, session_id: str) -> None:
    task = await api.run_task(api.alice, session_id)
    while (await api.client.get(f"/v1/tasks/{task['task_id']}", headers=api.auth(api.alice))).json()["state"] in (
            "pending", "running"):
        await trio.sleep(0.02)


@pytest.mark.parametrize("body", [
    b'{"prompt": "x", "runtime_config": {"k": "\\udfff"}}',  # a lone surrogate
    b'{"prompt": "x", "prompt": "y"}',  # duplicate keys
    b'{"prompt": "x", "runtime_config": {"n": NaN}}',
    b'{"prompt": "x", "runtime_config": {"n": 1152921504606846976}}',  # 2^60: not canonical JSON
    b'{"prompt": "\\ud800 alone"}',
])
async def test_a_bad_task_body_is_a_422_and_stores_nothing(api: Api, body: bytes) -> None:
    with trio.fail_after(30):
        session = await api.create_session(api.alice, "user:alice")
        status, text = await _post_raw(api, f"/v1/sessions/{session['session_id']}/tasks", body, api.alice)
        assert status == 422, text
        assert json.loads(text)["error"]["code"] in ("invalid_json", "invalid_request", "invalid_runtime_config")
        assert await api.engine.store.list_tasks(session["session_id"]) == []
        await _session_still_works(api, session["session_id"])


@pytest.mark.parametrize("query", ["after_seq=9223372036854775808", "after_seq=-1", "limit=0",
                                   "after_seq=99999999999999999999999"])
async def test_out_of_range_paging_is_a_422_naming_the_field(api: Api, query: str) -> None:
    with trio.fail_after(30):
        session = await api.create_session(api.alice, "user:alice")
        r = await api.client.get(f"/v1/sessions/{session['session_id']}/events?{query}", headers=api.auth(api.alice))
        assert r.status_code == 422 and query.split("=")[0] in r.json()["error"]["message"]
        r = await api.client.get("/v1/sessions?offset=9223372036854775808", headers=api.auth(api.alice))
        assert r.status_code == 422 and "offset" in r.json()["error"]["message"]


@pytest.mark.parametrize("last_id", ["18446744073709551616", "-5", "abc"])
async def test_an_out_of_range_last_event_id_is_a_422(api: Api, last_id: str) -> None:
    with trio.fail_after(30):
        session = await api.create_session(api.alice, "user:alice")
        r = await api.client.get(f"/v1/sessions/{session['session_id']}/events/stream",
                                 headers={**api.auth(api.alice), "Last-Event-ID": last_id})
        assert r.status_code == 422 and "Last-Event-ID" in r.json()["error"]["message"]


@pytest.mark.parametrize("name", ["user:alice\n", "user:alice\r", "default\n", "user:al\x00ice", "ci:job\t"])
async def test_namespace_names_with_control_characters_are_refused_everywhere(api: Api, name: str,
                                                                              tmp_path: Path) -> None:
    with pytest.raises(InvalidNamespace):
        Namespace.parse(name)
    with trio.fail_after(30):
        r = await api.client.post("/v1/sessions", json={"namespace": name}, headers=api.auth(api.admin))
        assert r.status_code == 422
    with pytest.raises(ValueError, match="invalid namespace"):
        TokenAuth.bootstrap(tmp_path / "d").add_principal("eve", [name])
    assert not (api.engine.config.data_dir / "namespaces" / "user.alice\n").exists()


def _tokens(data: Path) -> dict[str, object]:
    return dict(json.loads((data / TOKENS_FILE).read_text()))


def test_a_string_admin_flag_is_refused_not_granted(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    auth = TokenAuth.bootstrap(tmp_path)
    eve = auth.add_principal("eve", ["user:eve"])
    doc = _tokens(tmp_path)
    good = TokenAuth.load(tmp_path)
    principal = good.authenticate(eve)
    assert principal is not None and not principal.admin
    tokens = doc["tokens"]
    assert isinstance(tokens, list)
    for entry in tokens:
        if entry["name"] == "eve":
            entry["admin"] = "false"
    (tmp_path / TOKENS_FILE).write_text(json.dumps(doc))
    with pytest.raises(TokenFileInvalid, match="admin"):
        TokenAuth.load(tmp_path)
    # A running service fails closed (no tenant token, never a grant) and says why, once; the admin token, in its
    # own file, still works so that the operator can look around while fixing it.
    admin = (tmp_path / "admin.token").read_text().strip()
    with caplog.at_level(logging.ERROR):
        principal = good.authenticate(eve)
        good.authenticate(eve)
    assert principal is None
    assert len([r for r in caplog.records if "not a valid token table" in r.getMessage()]) == 1
    (tmp_path / TOKENS_FILE).write_text("{not json")
    assert good.authenticate(eve) is None  # no exception either
    admitted = good.authenticate(admin)
    assert admitted is not None and admitted.admin


def test_the_service_refuses_to_start_on_a_broken_token_file(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    (data / TOKENS_FILE).write_text(json.dumps({"version": 1, "tokens": [
        {"name": "x", "sha256": hash_token("t"), "admin": "yes", "namespaces": []}]}))
    done = subprocess.run([sys.executable, "-m", "codesdk.supervisor.cli.admin", "serve", "--data-dir", str(data)],
                          capture_output=True, text=True, timeout=120, cwd=REPO, check=False)
    assert done.returncode == 2 and "not a valid token table" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("config", [
    {"scenario_inline": {"name": "x", "steps": [{"text": "harmless"}]}},
    {"scenario": "crash-exit"}, {"scenario": "flood"}, {"scenario": "hang"}, {"scenario": "ignore-stop"},
    {"scenario": "stdout-pollution"}, {"scenario": "malformed-line"},
])
async def test_test_instruments_are_off_for_tenants_unless_the_operator_enables_them(
        make_engine: MakeEngine, config: dict[str, object]) -> None:
    with trio.fail_after(60):
        async with make_engine(test_scenarios=False) as engine:
            session = await engine.create_session()
            task = await engine.start_task(session.session_id, "x", runtime_config=config)
            record = await engine.wait_task(task.task_id)
            assert record.state == "failed" and record.error is not None
            assert record.error["code"] == "INVALID_SCENARIO"
            assert "test instrument" in record.error["message"] and "--enable-test-scenarios" in record.error["message"]
            fine = await engine.start_task(session.session_id, "x", runtime_config={"scenario": "parallel-tools"})
            assert (await engine.wait_task(fine.task_id)).state == "completed"


@pytest.mark.parametrize("where", ["/", "data", "data/namespaces/user.bob/home", "data/blobs", ".",
                                   "data/workspaces"])
async def test_a_workspace_overlapping_the_data_dir_is_refused(make_engine: MakeEngine, tmp_path: Path,
                                                               where: str) -> None:
    """With or without per-namespace uids, a workspace may not expose the store, the tokens or a HOME."""
    workspace = Path(where) if where.startswith("/") else tmp_path / where
    workspace.mkdir(parents=True, exist_ok=True)
    with trio.fail_after(30):
        async with make_engine(data_dir=tmp_path / "data") as engine:
            with pytest.raises(EngineError, match="workspace .* (root of the file system|data dir)"):
                await engine.create_session(workspace=workspace)
            assert await engine.store.list_sessions() == []
            fine = await engine.create_session(workspace=tmp_path / "elsewhere")
            assert fine.workspace == str((tmp_path / "elsewhere").resolve())


async def test_the_api_refuses_an_overlapping_workspace_with_a_clear_error(api: Api) -> None:
    with trio.fail_after(30):
        r = await api.client.post("/v1/sessions", headers=api.auth(api.admin),
                                  json={"namespace": "user:alice", "workspace": str(api.engine.config.data_dir)})
        assert r.status_code == 409 and "data dir" in r.json()["error"]["message"]


async def test_a_loose_data_dir_is_tightened_before_anything_is_stored(make_engine: MakeEngine,
                                                                       tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o755)
    data.chmod(0o755)
    with trio.fail_after(30):
        async with make_engine(data_dir=data) as engine:
            await engine.create_session()
    assert oct(data.stat().st_mode & 0o777) == oct(0o700)
    for name in ("codesdk.sqlite3", "codesdk.sqlite3-wal"):
        if (data / name).exists():
            assert (data / name).stat().st_mode & 0o077 == 0, name
