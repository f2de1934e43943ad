"""One contract for where namespaces' variables, limits and quarantines are kept: the data dir's files (and memory)
on one host, or the PostgreSQL database several supervisors share. Each test runs on both."""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from codesdk.supervisor.egress import HostPattern
from codesdk.supervisor.namespaces import (
    MAX_VARIABLES,
    DiskQuota,
    MemoryQuarantines,
    NamespaceBudgetError,
    NamespaceDisks,
    NamespaceEnvError,
    NamespaceEgressError,
    NamespaceState,
    Quarantines,
    SecretKey,
    open_namespace_state,
)
from codesdk.supervisor.store import migrate_postgres

SECRET = "canary-shared-state-0815"


def new_key() -> SecretKey:
    return SecretKey(os.urandom(32))


@pytest.fixture(params=["files", "postgresql"])
def state(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[NamespaceState]:
    """The namespace state of a fresh data dir, or of a fresh database (skipped, saying why, without a server)."""
    if request.param == "files":
        yield open_namespace_state(tmp_path / "data")
        return
    url: str = request.getfixturevalue("postgres_url")
    migrate_postgres(url)
    opened = open_namespace_state(tmp_path / "data", url, new_key())
    try:
        yield opened
    finally:
        opened.close()


@pytest.fixture
def quarantines(state: NamespaceState) -> Quarantines:
    return state.quarantines if state.quarantines is not None else MemoryQuarantines()


# -- variables --------------------------------------------------------------------------------


def test_variables_set_list_unset(state: NamespaceState) -> None:
    variables = state.variables
    assert variables.values("user:alice") == {} and variables.entries("user:alice") == []
    entries = variables.update("user:alice", {"API_KEY": SECRET, "BASE_URL": "http://127.0.0.1:1"})
    assert [e.name for e in entries] == ["API_KEY", "BASE_URL"]
    assert all(SECRET not in e.fingerprint for e in entries)
    assert entries[0].fingerprint == variables.fingerprint(SECRET) != variables.fingerprint(SECRET + "x")
    assert variables.values("user:alice") == {"API_KEY": SECRET, "BASE_URL": "http://127.0.0.1:1"}
    assert variables.values("user:bob") == {}
    variables.update("user:alice", {"API_KEY": "other"}, unset=["BASE_URL", "NEVER_SET"])
    assert variables.values("user:alice") == {"API_KEY": "other"}


def test_a_stamp_changes_with_every_write_and_only_its_namespaces(state: NamespaceState) -> None:
    variables = state.variables
    before, other = variables.stamp("user:alice"), variables.stamp("user:bob")
    variables.update("user:alice", {"A": "1"})
    first = variables.stamp("user:alice")
    variables.update("user:alice", {"A": "2"})
    assert len({before, first, variables.stamp("user:alice")}) == 3
    assert variables.stamp("user:bob") == other


@pytest.mark.parametrize(("changes", "unset"), [({"HOME": "/x"}, []), ({"1BAD": "x"}, []), ({"A": "a\x00b"}, []),
                                                ({}, ["bad-name"])])
def test_bad_variables_are_refused_alike(state: NamespaceState, changes: dict[str, str], unset: list[str]) -> None:
    with pytest.raises(NamespaceEnvError):
        state.variables.update("user:alice", changes, unset)
    assert state.variables.values("user:alice") == {}


def test_at_most_max_variables_and_a_refused_change_changes_nothing(state: NamespaceState) -> None:
    state.variables.update("ci:job", {f"V{i}": "x" for i in range(MAX_VARIABLES)})
    with pytest.raises(NamespaceEnvError, match="at most"):
        state.variables.update("ci:job", {"ONE_MORE": "x"})
    assert len(state.variables.values("ci:job")) == MAX_VARIABLES
    state.variables.update("ci:job", {"ONE_MORE": "x"}, unset=["V0"])  # replacing one fits
    assert "ONE_MORE" in state.variables.values("ci:job")


# -- limits -----------------------------------------------------------------------------------


def test_budgets(state: NamespaceState) -> None:
    budgets = state.budgets
    assert budgets.all() == {} and budgets.get("user:alice") is None
    assert budgets.set("user:alice", 12.5) == 12.5
    budgets.set("user:bob", 0)
    assert budgets.all() == {"user:alice": 12.5, "user:bob": 0.0}
    assert budgets.set("user:alice", None) is None
    assert budgets.all() == {"user:bob": 0.0}
    with pytest.raises(NamespaceBudgetError):
        budgets.set("user:bob", -1)


def test_egress_lists(state: NamespaceState) -> None:
    egress = state.egress
    hosts = (HostPattern.parse("api.example.com"), HostPattern.parse("*.example.org"))
    assert egress.get("user:alice") is None
    assert egress.set("user:alice", hosts + hosts[:1]) == hosts  # duplicates kept once
    assert egress.get("user:alice") == hosts
    assert egress.set("user:bob", ()) == ()
    assert egress.get("user:bob") == ()  # an empty list (no host) is not "no entry"
    egress.set("user:alice", None)
    assert egress.all() == {"user:bob": ()}
    with pytest.raises(NamespaceEgressError):
        egress.set("user:bob", tuple(HostPattern.parse(f"h{i}.example.com") for i in range(101)))


def test_disk_quota_overrides(state: NamespaceState, tmp_path: Path) -> None:
    disks = NamespaceDisks(tmp_path / "data", DiskQuota.parse("1G"), state.disk_overrides)
    assert disks.overrides() == {}
    disks.set_override("user:alice", DiskQuota.parse("64M:1000"))
    assert disks.quota_for("user:alice") == DiskQuota.parse("64M:1000")
    assert disks.quota_for("user:bob") == DiskQuota.parse("1G")
    disks.set_override("user:alice", None)
    assert disks.overrides() == {}


# -- quarantines ------------------------------------------------------------------------------


def test_quarantine_begins_holds_and_lifts(quarantines: Quarantines) -> None:
    assert quarantines.current("user:alice") is None and not quarantines.lift("user:alice")
    record = quarantines.begin("user:alice", 600, "5 crashes in 60 s")
    assert record.reason == "5 crashes in 60 s" and 599 <= record.until - record.since <= 601
    found = quarantines.current("user:alice")
    assert found is not None and found.reason == record.reason
    assert quarantines.current("user:bob") is None
    assert list(quarantines.all()) == ["user:alice"]
    assert quarantines.lift("user:alice")
    assert quarantines.current("user:alice") is None and quarantines.all() == {}


def test_an_expired_quarantine_is_not_in_force(quarantines: Quarantines) -> None:
    quarantines.begin("user:alice", 0, "expired at once")
    assert quarantines.current("user:alice") is None
    assert not quarantines.lift("user:alice")  # nothing in force was lifted


# -- PostgreSQL only: shared between supervisors, and the key --------------------------------


def test_two_supervisors_see_each_others_changes(postgres_url: str, tmp_path: Path) -> None:
    migrate_postgres(postgres_url)
    key = new_key()
    a = open_namespace_state(tmp_path / "a", postgres_url, key)
    b = open_namespace_state(tmp_path / "b", postgres_url, key)
    try:
        stamp = b.variables.stamp("user:alice")
        a.variables.update("user:alice", {"API_KEY": SECRET})
        assert b.variables.values("user:alice") == {"API_KEY": SECRET} and b.variables.stamp("user:alice") != stamp
        a.budgets.set("user:alice", 3)
        assert b.budgets.get("user:alice") == 3
        assert a.quarantines is not None and b.quarantines is not None
        a.quarantines.begin("user:alice", 600, "crashed")
        assert b.quarantines.current("user:alice") is not None
        assert b.quarantines.lift("user:alice") and a.quarantines.current("user:alice") is None
    finally:
        a.close()
        b.close()


def test_postgresql_needs_the_key_and_says_how_to_make_one(postgres_url: str, tmp_path: Path) -> None:
    from codesdk.supervisor.namespaces import SecretKeyError

    with pytest.raises(SecretKeyError, match="head -c32 /dev/urandom"):
        open_namespace_state(tmp_path, postgres_url, None)


def test_key_from_environment_and_file(tmp_path: Path) -> None:
    from codesdk.supervisor.namespaces import SecretKeyError, load_secret_key

    raw = os.urandom(32)
    assert load_secret_key(None, {"CODESDK_SECRET_KEY": base64.b64encode(raw).decode()}) == SecretKey(raw)
    assert load_secret_key(None, {}) is None
    (tmp_path / "key").write_text(base64.b64encode(raw).decode() + "\n")
    (tmp_path / "key").chmod(0o600)
    assert load_secret_key(tmp_path / "key", {}) == SecretKey(raw)
    (tmp_path / "short").write_text(base64.b64encode(raw[:16]).decode())
    (tmp_path / "short").chmod(0o600)
    for path, env, match in ((tmp_path / "short", {}, "16 bytes"), (tmp_path / "absent", {}, "cannot be read"),
                             (None, {"CODESDK_SECRET_KEY": "not base64!"}, "not base64")):
        with pytest.raises(SecretKeyError, match=match) as refused:
            load_secret_key(path, env)
        assert "head -c32 /dev/urandom" in str(refused.value)
    assert raw.hex() not in repr(SecretKey(raw))


def test_serve_on_postgresql_without_the_key_is_refused_saying_how_to_make_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from codesdk.supervisor.cli.admin import main

    monkeypatch.delenv("CODESDK_SECRET_KEY", raising=False)
    assert main(["serve", "--data-dir", str(tmp_path / "data"), "--store", "postgresql://codesdk@127.0.0.1/x"]) == 2
    assert "head -c32 /dev/urandom" in capsys.readouterr().err
    monkeypatch.setenv("CODESDK_SECRET_KEY", base64.b64encode(b"short").decode())
    assert main(["serve", "--data-dir", str(tmp_path / "data"), "--store", "postgresql://codesdk@127.0.0.1/x"]) == 2
    err = capsys.readouterr().err
    assert "$CODESDK_SECRET_KEY holds 5 bytes" in err and "c2hvcnQ" not in err
    assert not (tmp_path / "data").exists()  # refused before anything was made


@given(st.binary(min_size=0, max_size=64))
def test_a_key_is_base64_of_exactly_32_bytes(raw: bytes) -> None:
    from codesdk.supervisor.namespaces import SecretKeyError, load_secret_key

    text = base64.b64encode(raw).decode()
    if len(raw) == 32:
        assert load_secret_key(None, {"CODESDK_SECRET_KEY": f" {text}\n"}) == SecretKey(raw)
    elif raw:
        with pytest.raises(SecretKeyError, match=f"holds {len(raw)} bytes"):
            load_secret_key(None, {"CODESDK_SECRET_KEY": text})


@given(st.text(max_size=200), st.text(max_size=40))
def test_a_value_opens_only_where_it_was_sealed(value: str, name: str) -> None:
    from codesdk.supervisor.namespaces import UndecryptableVariable

    key = SecretKey(bytes(range(32)))
    try:
        value.encode()
    except UnicodeEncodeError:
        return  # lone surrogates are refused before sealing (check_variable)
    nonce, sealed = key.seal("user:a", "K", value)
    assert key.open("user:a", "K", nonce, sealed) == value
    for namespace, other in (("user:b", "K"), ("user:a", "K" + name + "x")):
        with pytest.raises(UndecryptableVariable):
            key.open(namespace, other, nonce, sealed)


def test_an_unreachable_database_is_said_so_without_its_password(tmp_path: Path) -> None:
    from codesdk.supervisor.namespaces import NamespaceStateUnavailable

    url = f"postgresql://codesdk:S3cretPW@/codesdk?host={tmp_path / 'no-server-here'}"
    with open_namespace_state(tmp_path, url, new_key()) as state:
        with pytest.raises(NamespaceStateUnavailable, match="unreachable") as refused:
            state.variables.values("user:alice")
        assert "S3cretPW" not in str(refused.value)
        with pytest.raises(NamespaceBudgetError, match="cannot be read"):
            state.budgets.get("user:alice")


def test_a_name_both_set_and_unset_in_one_change_is_gone(state: NamespaceState) -> None:
    state.variables.update("user:alice", {"A": "1", "B": "2"})
    state.variables.update("user:alice", {"A": "3", "C": "4"}, unset=["A"])
    assert state.variables.values("user:alice") == {"B": "2", "C": "4"}
