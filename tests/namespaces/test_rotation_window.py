"""A secret-key rotation while supervisors run: rows open with the primary key or an old one, writes go under
the primary, a write the keys held cannot cover is refused before anything is stored (503 on the API, without
key ids; exit 2 on the CLI); serve refuses to start beside rows under a key it lacks; a key file others may read
is refused."""

from __future__ import annotations

import base64
import logging
import os
from pathlib import Path

import psycopg
import pytest
import trio

from codesdk.supervisor.cli.admin import main
from codesdk.supervisor.namespaces import (
    KeyNotHeld,
    SecretKey,
    SecretKeyError,
    check_keys_held,
    load_old_keys,
    open_namespace_state,
    read_key_file,
    rotate_secret_key,
)
from codesdk.supervisor.store import migrate_postgres

from tests.api.conftest import serve_test_api
from tests.namespaces.test_shared_state_engine import MakeEngine

SECRET = "canary-rotation-window-4412"


def _rows(url: str) -> list[tuple[object, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute("SELECT namespace, name, key_id, ciphertext FROM namespace_variables "
                            "ORDER BY namespace, name").fetchall()


def _key_file(path: Path, key: SecretKey) -> Path:
    path.write_text(base64.b64encode(key.raw).decode() + "\n")
    path.chmod(0o600)
    return path


def test_old_and_new_keys_serve_through_a_rotation(postgres_url: str, tmp_path: Path) -> None:
    migrate_postgres(postgres_url)
    k1, k3 = SecretKey(os.urandom(32)), SecretKey(os.urandom(32))
    with open_namespace_state(tmp_path, postgres_url, k1) as before:
        before.variables.update("user:alice", {"API_KEY": SECRET})
    with open_namespace_state(tmp_path, postgres_url, k3, [k1]) as during, \
            open_namespace_state(tmp_path, postgres_url, k1) as stale:
        assert during.variables.values("user:alice") == {"API_KEY": SECRET}
        during.variables.update("user:alice", {"MODE": "x"})  # under k3, beside k1's row: both held here
        assert during.variables.values("user:alice") == {"API_KEY": SECRET, "MODE": "x"}
        assert {row[2] for row in _rows(postgres_url)} == {k1.key_id, k3.key_id}
        stored = _rows(postgres_url)
        with pytest.raises(KeyNotHeld, match="--old-secret-key-file"):  # k1 alone cannot open MODE
            stale.variables.update("user:alice", {"API_KEY": "changed"})
        assert _rows(postgres_url) == stored  # refused before anything was stored
        rotate_secret_key(postgres_url, k3, [k1])
        assert {row[2] for row in _rows(postgres_url)} == {k3.key_id}
        with pytest.raises(KeyNotHeld):
            stale.variables.values("user:alice")
        with pytest.raises(KeyNotHeld):
            stale.variables.update("user:alice", {"API_KEY": "changed"}, ["MODE"])
        assert during.variables.values("user:alice") == {"API_KEY": SECRET, "MODE": "x"}
    with open_namespace_state(tmp_path, postgres_url, k3) as after:  # the old key dropped
        assert after.variables.values("user:alice") == {"API_KEY": SECRET, "MODE": "x"}


def test_the_cli_with_a_stale_key_exits_2_and_stores_nothing(postgres_url: str, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    migrate_postgres(postgres_url)
    k1, k3 = SecretKey(os.urandom(32)), SecretKey(os.urandom(32))
    with open_namespace_state(tmp_path, postgres_url, k3) as rotated:
        rotated.variables.update("user:alice", {"API_KEY": SECRET})
    stored = _rows(postgres_url)
    where = ["--data-dir", str(tmp_path / "data"), "--store", postgres_url]
    assert main(["namespace", "env", "set", "user:alice", "MODE=x", *where,
                 "--secret-key-file", str(_key_file(tmp_path / "k1", k1))]) == 2
    assert "--old-secret-key-file" in capsys.readouterr().err
    assert _rows(postgres_url) == stored
    assert main(["namespace", "env", "set", "user:alice", "MODE=x", *where, "--secret-key-file",
                 str(_key_file(tmp_path / "k3", k3)), "--old-secret-key-file", str(tmp_path / "k1")]) == 0
    assert SECRET not in capsys.readouterr().out


async def test_the_api_answers_503_without_key_ids_and_stores_nothing(
        make_engine: MakeEngine, postgres_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    migrate_postgres(postgres_url)
    k1, k3 = SecretKey(os.urandom(32)), SecretKey(os.urandom(32))
    with open_namespace_state(tmp_path, postgres_url, k1) as before:
        before.variables.update("user:alice", {"API_KEY": SECRET})
    with trio.fail_after(90), caplog.at_level(logging.ERROR):
        async with serve_test_api(make_engine, tmp_path, store=postgres_url, secret_key=k1) as api:
            await trio.to_thread.run_sync(rotate_secret_key, postgres_url, k3, [k1])
            stored = _rows(postgres_url)
            got = await api.client.get("/v1/namespaces/user:alice/env", headers=api.auth(api.admin))
            patched = await api.client.patch("/v1/namespaces/user:alice/env", headers=api.auth(api.admin),
                                             json={"set": {"MODE": "x"}})
    for answer in (got, patched):
        assert answer.status_code == 503, answer.text
        assert "operator must check the deployment's secret key" in answer.text
        assert k1.key_id not in answer.text and k3.key_id not in answer.text and SECRET not in answer.text
    assert _rows(postgres_url) == stored
    assert k3.key_id in caplog.text and SECRET not in caplog.text  # the operator's detail is in the log


def test_serve_refuses_to_start_beside_rows_under_a_key_it_lacks(postgres_url: str, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    migrate_postgres(postgres_url)
    k1, k3 = SecretKey(os.urandom(32)), SecretKey(os.urandom(32))
    check_keys_held(postgres_url, k1)  # nothing stored yet: any key will do
    with open_namespace_state(tmp_path, postgres_url, k3) as state:
        state.variables.update("user:alice", {"API_KEY": SECRET})
    assert main(["serve", "--data-dir", str(tmp_path / "data"), "--store", postgres_url,
                 "--secret-key-file", str(_key_file(tmp_path / "k1", k1))]) == 2
    err = capsys.readouterr().err
    assert k3.key_id in err and k1.key_id in err and "--old-secret-key-file" in err and SECRET not in err
    assert not (tmp_path / "data").exists()  # refused before anything was made
    check_keys_held(postgres_url, k1, [k3])  # the old key given: it may start
    check_keys_held(postgres_url, k3)
    with pytest.raises(SecretKeyError, match=k3.key_id):
        check_keys_held(postgres_url, k1, [SecretKey(os.urandom(32))])


def test_old_keys_from_the_environment(tmp_path: Path) -> None:
    a, b = SecretKey(os.urandom(32)), SecretKey(os.urandom(32))
    text = f"{base64.b64encode(a.raw).decode()}, {base64.b64encode(b.raw).decode()}"
    assert load_old_keys((), {"CODESDK_OLD_SECRET_KEYS": text}) == (a, b)
    assert load_old_keys((), {}) == ()
    assert load_old_keys([_key_file(tmp_path / "a", a)], {"CODESDK_OLD_SECRET_KEYS": text}) == (a,)
    with pytest.raises(SecretKeyError, match="CODESDK_OLD_SECRET_KEYS"):
        load_old_keys((), {"CODESDK_OLD_SECRET_KEYS": "not base64!"})


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604])
def test_a_key_file_others_may_read_is_refused(tmp_path: Path, mode: int,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    path = _key_file(tmp_path / "key", SecretKey(os.urandom(32)))
    path.chmod(mode)
    with pytest.raises(SecretKeyError, match=f"chmod 600 {path}"):
        read_key_file(path)
    with pytest.raises(SystemExit) as refused:  # the flag's parser refuses it: the usage error's exit status
        main(["namespace", "env", "list", "user:alice", "--data-dir", str(tmp_path / "data"), "--store",
              "postgresql://codesdk@127.0.0.1/x", "--secret-key-file", str(path)])
    assert refused.value.code == 2
    assert f"chmod 600 {path}" in capsys.readouterr().err
    path.chmod(0o600)
    assert read_key_file(path) is not None
