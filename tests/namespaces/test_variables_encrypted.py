"""Namespace variables in PostgreSQL: only ciphertext in the table, refused when altered, moved or under another
key; ``secret-key rotate`` re-encrypts them; a data dir's files are imported once."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from codesdk.supervisor.cli.admin import main
from codesdk.supervisor.egress import HostPattern
from codesdk.supervisor.namespaces import (
    DiskQuota,
    NamespaceDisks,
    NamespaceState,
    SecretKey,
    UndecryptableVariable,
    import_namespace_state,
    open_namespace_state,
)
from codesdk.supervisor.store import migrate_postgres

SECRET = "canary-encrypted-at-rest-2741"
Opener = Callable[..., NamespaceState]
Conn = psycopg.Connection[tuple[object, ...]]


@pytest.fixture
def url(postgres_url: str) -> str:
    migrate_postgres(postgres_url)
    return postgres_url


@pytest.fixture
def db(url: str) -> Iterator[Conn]:
    with psycopg.connect(url, autocommit=True) as conn:
        yield conn


@pytest.fixture
def states(url: str, tmp_path: Path) -> Iterator[Opener]:
    """Opens the database's namespace state under a key (closed at the end)."""
    opened: list[NamespaceState] = []

    def open_state(key: SecretKey, data_dir: Path | None = None) -> NamespaceState:
        opened.append(open_namespace_state(data_dir or tmp_path, url, key))
        return opened[-1]

    yield open_state
    for state in opened:
        state.close()

def write_key(path: Path, key: SecretKey) -> Path:
    path.write_text(base64.b64encode(key.raw).decode() + "\n")
    path.chmod(0o600)
    return path


def test_the_table_holds_no_value(url: str, states: Opener, db: Conn, tmp_path: Path) -> None:
    key = SecretKey(os.urandom(32))
    state = states(key)
    state.variables.update("user:alice", {"API_KEY": SECRET})
    dump = db.execute("SELECT t::text FROM namespace_variables AS t").fetchall()
    raw = b"".join(row[0] for row in db.execute("SELECT nonce || ciphertext FROM namespace_variables")
                   if isinstance(row[0], bytes))
    assert dump and raw and SECRET not in repr(dump) and SECRET.encode() not in raw
    assert key.raw not in raw and base64.b64encode(key.raw).decode() not in repr(dump)
    assert db.execute("SELECT key_id, length(nonce) FROM namespace_variables").fetchone() == (key.key_id, 12)


def test_two_writes_of_one_value_differ_in_the_table(url: str, states: Opener, db: Conn,
                                                     tmp_path: Path) -> None:
    state = states(SecretKey(os.urandom(32)))
    state.variables.update("user:alice", {"A": SECRET, "B": SECRET})
    rows = db.execute("SELECT nonce, ciphertext FROM namespace_variables").fetchall()
    assert rows[0] != rows[1]  # a fresh nonce each


def test_a_wrong_key_is_refused_clearly(url: str, states: Opener, tmp_path: Path) -> None:
    states(SecretKey(os.urandom(32))).variables.update("user:alice", {"A": SECRET})
    other = states(SecretKey(os.urandom(32)))
    with pytest.raises(UndecryptableVariable, match="--secret-key-file") as refused:
        other.variables.values("user:alice")
    assert SECRET not in str(refused.value)


@pytest.mark.parametrize("tamper", [
    "UPDATE namespace_variables SET ciphertext = set_byte(ciphertext, 0, get_byte(ciphertext, 0) # 1)",
    "UPDATE namespace_variables SET nonce = set_byte(nonce, 0, get_byte(nonce, 0) # 1)",
])
def test_an_altered_row_is_refused(url: str, states: Opener, db: Conn, tmp_path: Path,
                                   tamper: str) -> None:
    state = states(SecretKey(os.urandom(32)))
    state.variables.update("user:alice", {"A": SECRET})
    db.execute(tamper)
    with pytest.raises(UndecryptableVariable, match="altered or copied"):
        state.variables.values("user:alice")


def test_a_row_moved_to_another_namespace_or_name_is_refused(url: str, states: Opener, db: Conn,
                                                             tmp_path: Path) -> None:
    state = states(SecretKey(os.urandom(32)))
    state.variables.update("user:alice", {"API_KEY": SECRET})
    state.variables.update("user:mallory", {"API_KEY": "mine", "OTHER": "x"})
    db.execute("UPDATE namespace_variables AS m SET nonce = a.nonce, ciphertext = a.ciphertext FROM "
               "namespace_variables AS a WHERE a.namespace = 'user:alice' AND m.namespace = 'user:mallory' "
               "AND m.name = 'API_KEY'")
    with pytest.raises(UndecryptableVariable):
        state.variables.values("user:mallory")
    db.execute("UPDATE namespace_variables AS o SET nonce = m.nonce, ciphertext = m.ciphertext FROM "
               "namespace_variables AS m WHERE m.namespace = 'user:mallory' AND m.name = 'OTHER' "
               "AND o.namespace = 'user:mallory' AND o.name = 'API_KEY'")  # another name's row
    with pytest.raises(UndecryptableVariable):
        state.variables.values("user:mallory")
    assert state.variables.values("user:alice") == {"API_KEY": SECRET}


def test_rotate_then_read(url: str, states: Opener, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old, older, new = (SecretKey(os.urandom(32)) for _ in range(3))
    states(older).variables.update("user:bob", {"B": "bee"})
    states(old).variables.update("user:alice", {"API_KEY": SECRET, "X": "y"})
    files = [write_key(tmp_path / name, k) for name, k in (("old", old), ("older", older), ("new", new))]
    argv = ["secret-key", "rotate", "--store", url, "--secret-key-file", str(files[2]),
            "--old-secret-key-file", str(files[0])]
    assert main(argv) == 2  # bob's row is under a key not given: nothing changes
    err = capsys.readouterr().err
    assert older.key_id in err and "nothing was changed" in err
    assert states(old).variables.values("user:alice")["API_KEY"] == SECRET
    assert main([*argv, "--old-secret-key-file", str(files[1])]) == 0
    out = capsys.readouterr().out
    assert "3 variable(s) re-encrypted" in out and SECRET not in out
    fresh = states(new)
    assert fresh.variables.values("user:alice") == {"API_KEY": SECRET, "X": "y"}
    assert fresh.variables.values("user:bob") == {"B": "bee"}
    assert main([*argv, "--old-secret-key-file", str(files[1])]) == 0  # again: nothing to do
    assert "0 variable(s) re-encrypted under the new key, 3 already under it" in capsys.readouterr().out
    with pytest.raises(UndecryptableVariable):
        states(old).variables.values("user:alice")


def test_rotate_refuses_a_bad_key_file(url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "bad").write_text("c2hvcnQ=")
    (tmp_path / "bad").chmod(0o600)
    good = write_key(tmp_path / "good", SecretKey(os.urandom(32)))
    assert main(["secret-key", "rotate", "--store", url, "--secret-key-file", str(tmp_path / "bad"),
                 "--old-secret-key-file", str(good)]) == 2
    assert "head -c32 /dev/urandom" in capsys.readouterr().err


def test_import_moves_a_data_dir_once(url: str, states: Opener, tmp_path: Path) -> None:
    data = tmp_path / "data"
    files = open_namespace_state(data)
    files.variables.update("user:alice", {"API_KEY": SECRET, "BASE_URL": "http://127.0.0.1:1"})
    files.variables.update("default", {"TOKEN": "t"})
    files.budgets.set("user:alice", 7)
    files.egress.set("user:alice", (HostPattern.parse("api.example.com"),))
    NamespaceDisks(data, None, files.disk_overrides).set_override("ci:job", DiskQuota.parse("64M"))
    key = SecretKey(os.urandom(32))
    report = import_namespace_state(data, url, key)
    assert (report.namespaces, report.variables_set, report.variables_unchanged) == (2, 3, 0)
    assert (report.limits_set, report.limits_unchanged) == (3, 0)
    assert SECRET not in report.describe()
    again = import_namespace_state(data, url, key)
    assert (again.variables_set, again.variables_unchanged, again.limits_set, again.limits_unchanged) == (0, 0, 0, 0)
    assert len(again.skipped) == 6 and SECRET not in again.describe()
    shared = states(key, tmp_path / "elsewhere")
    assert shared.variables.values("user:alice") == {"API_KEY": SECRET, "BASE_URL": "http://127.0.0.1:1"}
    assert shared.variables.values("default") == {"TOKEN": "t"}
    assert shared.budgets.get("user:alice") == 7
    assert shared.egress.get("user:alice") == (HostPattern.parse("api.example.com"),)
    assert NamespaceDisks(tmp_path, None, shared.disk_overrides).overrides() == {"ci:job": DiskQuota.parse("64M")}
    assert json.loads(json.dumps(report.__dict__))  # counts only


def test_the_cli_keeps_settings_in_the_database(url: str, states: Opener, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    key = SecretKey(os.urandom(32))
    key_file = write_key(tmp_path / "key", key)
    where = ["--data-dir", str(tmp_path / "data"), "--store", url, "--secret-key-file", str(key_file)]
    assert main(["namespace", "env", "set", "user:alice", f"API_KEY={SECRET}", *where]) == 0
    assert main(["namespace", "egress", "deny-all", "user:alice", *where]) == 0
    assert SECRET not in capsys.readouterr().out
    shared = states(key, tmp_path / "elsewhere")
    assert shared.variables.values("user:alice") == {"API_KEY": SECRET}
    assert shared.egress.get("user:alice") == ()
    assert main(["namespace", "env", "list", "user:alice", "--data-dir", str(tmp_path / "data"), "--store", url]) == 2
    assert "head -c32 /dev/urandom" in capsys.readouterr().err  # no key: told how to make one
