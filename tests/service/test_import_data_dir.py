"""Moving a single host's data dir into the shared database (``codesdk-supervisor import-data-dir``) and the token
commands on it (``--store``): what moves is said by id, never a secret; a second run moves nothing; a token
revoked since is never brought back; bad input exits 2 saying what to do."""

from __future__ import annotations

import base64
import os
import re
from pathlib import Path

import psycopg
import pytest

from codesdk.supervisor.api import PostgresTokenStore, TokenAuth
from codesdk.supervisor.cli.admin import main
from codesdk.supervisor.namespaces import KEY_ENV, load_secret_key, open_namespace_state
from codesdk.supervisor.store import DataDirLock, open_token_table

#: The deployment's secret key the moved variables are encrypted under (the supervisors' ``$CODESDK_SECRET_KEY``).
SECRET_KEY = base64.b64encode(os.urandom(32)).decode()


@pytest.fixture(autouse=True)
def _deployment_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, SECRET_KEY)


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def _single_host(data: Path) -> tuple[TokenAuth, list[str]]:
    """A data dir as one host left it: the admin's, alice's and a metrics token; (its table, every secret)."""
    auth = TokenAuth.bootstrap(data)
    secrets = [(data / "admin.token").read_text().strip(), auth.add_principal("alice", ["user:alice"]),
               auth.add_principal("prometheus", [], metrics=True)]
    return auth, secrets


def _shared(url: str) -> TokenAuth:
    table = open_token_table(url)
    auth = TokenAuth(store=PostgresTokenStore(table))
    auth.reload(fail_closed=False)
    table.close()
    return auth


def test_moving_a_data_dir_moves_its_tokens_once_and_prints_no_secret(postgres_url: str, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data"
    auth, secrets = _single_host(data)
    ids = [token_id for token_id, _ in auth.records()]
    code, out, err = _run(capsys, "import-data-dir", "--store", postgres_url, "--data-dir", str(data))
    assert code == 0, err
    assert "moved 3" in out and all(token_id in out for token_id in ids)
    hashes = re.compile(r"[0-9a-f]{64}")
    for said in (out, err):
        assert not hashes.search(said) and not any(secret in said for secret in secrets)
    shared = _shared(postgres_url)
    assert all(shared.authenticate(secret) is not None for secret in secrets)  # the admin.token file's too
    assert sorted(shared.records(), key=str) == sorted(auth.records(), key=str)

    code, out, err = _run(capsys, "import-data-dir", "--store", postgres_url, "--data-dir", str(data))
    assert code == 0, err
    assert "moved 0" in out and "3 in the database already" in out and "nothing to move" in out


def test_a_token_revoked_in_the_database_is_not_brought_back_by_moving_again(
        postgres_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data"
    _, (_, alice, _) = _single_host(data)
    assert _run(capsys, "import-data-dir", "--store", postgres_url, "--data-dir", str(data))[0] == 0
    code, _, err = _run(capsys, "token", "revoke", "alice", "--store", postgres_url)
    assert code == 0 and "revoked in the database postgresql://" in err
    code, out, _ = _run(capsys, "import-data-dir", "--store", postgres_url, "--data-dir", str(data))
    assert code == 0 and "moved 0" in out and "revoked since, not brought back" in out
    assert _shared(postgres_url).authenticate(alice) is None


def test_a_token_whose_name_the_database_has_is_not_moved_and_the_run_says_what_to_do(
        postgres_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data"
    _single_host(data)
    code, out, err = _run(capsys, "token", "add", "alice", "--namespace", "user:alice", "--store", postgres_url)
    assert code == 0 and out.startswith("csk_")
    code, out, err = _run(capsys, "import-data-dir", "--store", postgres_url, "--data-dir", str(data))
    assert code == 1 and "moved 2" in out
    assert "NOT moved" in out and "token revoke" in out and "not moved" in err


def test_the_token_commands_work_on_the_database(postgres_url: str, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    code, bob, _ = _run(capsys, "token", "add", "bob", "--namespace", "user:bob", "--store", postgres_url)
    assert code == 0
    code, listed, _ = _run(capsys, "token", "list", "--store", postgres_url)
    assert code == 0 and "\tbob\ttenant\tuser:bob" in listed and bob.strip() not in listed
    code, new_bob, err = _run(capsys, "token", "rotate", "bob", "--store", postgres_url)
    assert code == 0 and "the old token no longer works" in err
    shared = _shared(postgres_url)
    assert shared.authenticate(bob.strip()) is None and shared.authenticate(new_bob.strip()) is not None
    assert not (tmp_path / "data").exists()  # nothing of a data dir is made


@pytest.mark.parametrize("case", ["not a postgresql url", "no such data dir", "no --store"])
def test_bad_input_exits_2_saying_what_to_do(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CODESDK_STORE", raising=False)
    data = tmp_path / "data"
    data.mkdir()
    store = ["--store", "postgresql://codesdk@/x?host=/nonexistent"]
    if case == "not a postgresql url":
        store = ["--store", "mysql://root:hunter2@db/x"]
    elif case == "no such data dir":
        data = tmp_path / "nowhere"
    elif case == "no --store":
        store = []
    code, out, err = _run(capsys, "import-data-dir", *store, "--data-dir", str(data))
    assert code == 2 and out == "" and err.startswith("codesdk-supervisor: ")
    assert "hunter2" not in err


def test_a_broken_tokens_file_moves_nothing(postgres_url: str, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "api-tokens.json").write_text('{"version": 1, "tokens": [')
    code, out, err = _run(capsys, "import-data-dir", "--store", postgres_url, "--data-dir", str(data))
    assert code == 2 and "not a valid token table" in err and "nothing of it was moved" in err
    assert _shared(postgres_url).records() == []


def test_a_data_dir_without_tokens_has_none_to_move(postgres_url: str, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data"
    data.mkdir()
    code, out, _ = _run(capsys, "import-data-dir", "--store", postgres_url, "--data-dir", str(data))
    assert code == 0 and "none to move" in out


def test_a_data_dirs_variables_and_limits_move_with_its_tokens_and_no_value_is_printed(
        postgres_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data"
    _single_host(data)
    value = "sk-ant-" + os.urandom(12).hex()
    with open_namespace_state(data) as files:
        files.variables.update("user:alice", {"ANTHROPIC_API_KEY": value})
        files.budgets.set("user:alice", 25.0)
    code, out, err = _run(capsys, "import-data-dir", "--store", postgres_url, "--data-dir", str(data))
    assert code == 0, err
    assert "1 variable(s) of 1 namespace(s) imported" in out and "1 limit(s) imported" in out
    assert value not in out + err
    with open_namespace_state(data, postgres_url, load_secret_key(None)) as shared:
        assert shared.variables.values("user:alice") == {"ANTHROPIC_API_KEY": value}
        assert shared.budgets.get("user:alice") == 25.0
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        stored = conn.execute("SELECT ciphertext FROM namespace_variables").fetchall()
    assert stored and all(value.encode() not in bytes(row[0]) for row in stored)

    code, out, err = _run(capsys, "import-data-dir", "--store", postgres_url, "--data-dir", str(data))
    assert code == 0, err
    assert "0 variable(s) of 0 namespace(s) imported" in out and "0 limit(s) imported" in out
    assert "2 skipped, imported by an earlier run" in out and "user:alice variable ANTHROPIC_API_KEY" in out


def test_moving_again_keeps_what_was_changed_in_the_database_since(
        postgres_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data"
    with open_namespace_state(data) as files:
        files.variables.update("user:alice", {"API_KEY": "value-one-8812", "MODE": "x"})
        files.budgets.set("user:alice", 25.0)
        files.egress.set("user:alice", ())
    assert _run(capsys, "import-data-dir", "--store", postgres_url, "--data-dir", str(data))[0] == 0
    with open_namespace_state(data, postgres_url, load_secret_key(None)) as shared:
        shared.variables.update("user:alice", {"API_KEY": "value-two-8813"}, ["MODE"])
        shared.budgets.set("user:alice", 5.0)
        shared.egress.set("user:alice", None)
    with open_namespace_state(data) as files:  # the data dir gains a variable and a namespace after the move
        files.variables.update("user:alice", {"NEW": "n"})
        files.variables.update("user:bob", {"B": "b"})
    code, out, err = _run(capsys, "import-data-dir", "--store", postgres_url, "--data-dir", str(data))
    assert code == 0, err
    assert "2 variable(s) of 2 namespace(s) imported" in out and "4 skipped" in out
    assert "value-one-8812" not in out and "value-two-8813" not in out
    with open_namespace_state(data, postgres_url, load_secret_key(None)) as shared:
        assert shared.variables.values("user:alice") == {"API_KEY": "value-two-8813", "NEW": "n"}
        assert shared.variables.values("user:bob") == {"B": "b"}
        assert shared.budgets.get("user:alice") == 5.0
        assert shared.egress.get("user:alice") is None


def test_moving_is_refused_while_the_data_dirs_supervisor_runs(
        postgres_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data"
    _single_host(data)
    lock = DataDirLock.acquire(data, "codesdk-supervisor serve")
    try:
        code, out, err = _run(capsys, "import-data-dir", "--store", postgres_url, "--data-dir", str(data))
    finally:
        lock.release()
    assert code == 2 and out == ""
    assert f"pid {os.getpid()}" in err and "stop that supervisor first" in err
    assert _shared(postgres_url).records() == []
    assert _run(capsys, "import-data-dir", "--store", postgres_url, "--data-dir", str(data))[0] == 0


def test_moving_without_the_deployment_key_moves_nothing_and_says_how_to_make_one(
        postgres_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_ENV)
    data = tmp_path / "data"
    _single_host(data)
    code, out, err = _run(capsys, "import-data-dir", "--store", postgres_url, "--data-dir", str(data))
    assert code == 2 and out == ""
    assert "--secret-key-file" in err and "/dev/urandom" in err
    assert _shared(postgres_url).records() == []
