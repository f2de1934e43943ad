"""API tokens behave the same whichever store keeps them (the data dir's file, or PostgreSQL's table), and on
PostgreSQL a change made by one supervisor is in force on every other: a revoked token is refused there, console
sessions included, and a supervisor that cannot read the table fails closed for tenants."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
import trio

from codesdk.supervisor.api import (STALE_AFTER_S, PostgresTokenStore, Principal, TokenAuth, TokenEntry,
                                    TokenNameTaken, TokenNotFound, TokensNotMoved, hash_token, open_token_auth)
from codesdk.supervisor.store import StoreError, open_token_table

from tests.api.conftest import Api, serve_test_api
from tests.conftest import MakeEngine
from tests.waits import until

#: Two supervisors' views of one token table: ``first`` (which made it) and ``second`` (another process or host).
Pair = tuple[TokenAuth, TokenAuth]


@pytest.fixture(params=["file", "postgresql"])
def pair(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Pair]:
    data_dir = tmp_path / "data"
    if request.param == "file":
        yield TokenAuth.bootstrap(data_dir), TokenAuth.load(data_dir)
        return
    url = str(request.getfixturevalue("postgres_url"))
    with ExitStack() as stack:
        tables = [open_token_table(url) for _ in range(2)]
        for table in tables:
            stack.callback(table.close)
        first = TokenAuth.bootstrap_shared(data_dir, PostgresTokenStore(tables[0]))
        second = TokenAuth(store=PostgresTokenStore(tables[1]))
        second.reload(fail_closed=False)
        yield first, second


def test_a_token_is_its_principal_and_only_its_hash_is_kept(pair: Pair, tmp_path: Path) -> None:
    first, second = pair
    admin = (tmp_path / "data" / "admin.token").read_text().strip()
    assert first.authenticate(admin) == Principal(name="admin", admin=True)
    token_id, principal, alice = first.issue("alice", ["user:alice"])
    assert principal == Principal(name="alice", namespaces=frozenset({"user:alice"}))
    assert first.authenticate(alice) == principal and first.authenticate_hash(hash_token(alice)) == principal
    assert first.authenticate("csk_not-a-token") is None and first.authenticate(None) is None
    second.reload()
    assert second.authenticate(alice) == principal
    assert (token_id, principal) in second.records()
    assert all(alice not in repr(record) and hash_token(alice) not in repr(record) for record in second.records())


def test_a_name_is_unique_per_namespace(pair: Pair) -> None:
    first, second = pair
    first.issue("ci", ["ci:build"])
    second.reload()
    with pytest.raises(TokenNameTaken):
        second.issue("ci", ["ci:build", "ci:deploy"])  # the other view's token is seen, not only its own
    second.issue("ci", ["ci:deploy"])
    with pytest.raises(TokenNotFound, match="give the id"):
        first.revoke("ci")  # two tokens of that name: which one is for the id to say
    with pytest.raises(TokenNotFound, match="no token"):
        first.revoke("nobody")
    with pytest.raises(ValueError, match="metrics"):
        first.issue("prom", ["user:x"], metrics=True)


def test_a_revoke_or_a_rotation_made_by_one_is_refused_by_the_other(pair: Pair) -> None:
    first, second = pair
    alice_id, _, alice = first.issue("alice", ["user:alice"])
    _, _, bob = first.issue("bob", ["user:bob"])
    second.reload()
    assert second.authenticate(alice) is not None and second.authenticate(bob) is not None
    assert second.revoke(alice_id)[0] == alice_id
    rotated_id, principal, new_bob = second.rotate("bob")
    assert second.authenticate(alice) is None and second.authenticate(bob) is None
    first.reload()
    assert first.authenticate(alice) is None and first.authenticate(bob) is None
    assert first.authenticate(new_bob) == principal and principal.name == "bob"
    assert [i for i, _ in first.records()].count(rotated_id) == 1  # same id, new token
    with pytest.raises(TokenNotFound):
        first.revoke(alice_id)


# -- PostgreSQL: several supervisors ----------------------------------------------------------------------------


async def test_a_revoke_on_one_supervisor_is_refused_on_another_that_follows(postgres_url: str,
                                                                             tmp_path: Path) -> None:
    async with open_token_auth(tmp_path / "a", postgres_url) as a, open_token_auth(tmp_path / "b", postgres_url) as b:
        assert (tmp_path / "a" / "admin.token").exists() and not (tmp_path / "b" / "admin.token").exists()
        _, _, alice = await trio.to_thread.run_sync(a.issue, "alice", ["user:alice"])
        await until("B to accept the token A made", lambda: b.authenticate(alice) is not None)
        await trio.to_thread.run_sync(a.revoke, "alice")
        await until("B to refuse the token A revoked", lambda: b.authenticate(alice) is None)
        _, _, new = await trio.to_thread.run_sync(b.issue, "bob", ["user:bob"])
        _, _, newer = await trio.to_thread.run_sync(b.rotate, "bob")
        await until("A to take the rotated token only", lambda: a.authenticate(newer) is not None
                    and a.authenticate(new) is None)


async def test_a_console_session_of_a_token_revoked_elsewhere_ends(postgres_url: str, tmp_path: Path,
                                                                  make_engine: MakeEngine) -> None:
    async with open_token_auth(tmp_path / "data", postgres_url) as here, \
            open_token_auth(tmp_path / "elsewhere", postgres_url) as elsewhere, \
            serve_test_api(make_engine, tmp_path, tokens=here) as api:
        r = await api.client.post("/console/session", json={"token": api.alice},
                                  headers={"Origin": "http://codesdk"})
        assert r.status_code == 201, r.text
        api.client.cookies.clear()
        cookie = {"Cookie": "codesdk_console=" + r.headers["set-cookie"].split(";")[0].split("=", 1)[1]}
        assert (await api.client.get("/v1/sessions", headers=cookie)).status_code == 200
        await trio.to_thread.run_sync(elsewhere.revoke, "alice")

        async def refused() -> bool:
            return (await api.client.get("/v1/sessions", headers=cookie)).status_code == 401

        while not await refused():
            await trio.sleep(0.02)
        assert (await api.client.get("/console/session", headers=cookie)).status_code == 401


class UnreachableTable(PostgresTokenStore):
    """A shared table whose database can be made to fail."""

    failing = False

    def load(self) -> list[TokenEntry]:
        if self.failing:
            raise StoreError("PostgreSQL at postgresql://db/x is unreachable")
        return super().load()


def test_a_table_unread_for_too_long_fails_closed_for_tenants_only(postgres_url: str, tmp_path: Path) -> None:
    now = [1000.0]
    table = open_token_table(postgres_url)
    try:
        TokenAuth.bootstrap_shared(tmp_path, PostgresTokenStore(table))
        admin = (tmp_path / "admin.token").read_text().strip()
        store = UnreachableTable(table)
        auth = TokenAuth(store=store, clock=lambda: now[0])
        _, _, alice = auth.issue("alice", ["user:alice"])
        _, _, prometheus = auth.issue("prometheus", [], metrics=True)
        store.failing = True
        auth.reload()  # fails: the view read last stands, for a while
        now[0] += STALE_AFTER_S
        assert auth.authenticate(alice) is not None and auth.broken is None
        now[0] += 1
        assert auth.authenticate(alice) is None
        assert auth.broken is not None and "refused" in auth.broken
        assert auth.authenticate(admin) is not None and auth.authenticate(prometheus) is not None
        store.failing = False
        auth.reload()
        assert auth.authenticate(alice) is not None and auth.broken is None
    finally:
        table.close()


def test_a_database_without_tokens_is_not_started_over_a_data_dirs_tokens(postgres_url: str, tmp_path: Path) -> None:
    TokenAuth.bootstrap(tmp_path).issue("alice", ["user:alice"])
    before = (tmp_path / "admin.token").read_text()
    table = open_token_table(postgres_url)
    try:
        with pytest.raises(TokensNotMoved, match="import-data-dir"):
            TokenAuth.bootstrap_shared(tmp_path, PostgresTokenStore(table))
        assert table.rows() == [] and (tmp_path / "admin.token").read_text() == before
    finally:
        table.close()


async def test_a_token_change_the_table_cannot_take_is_503_and_a_token_gone_meanwhile_404(api: Api) -> None:
    admin = {"Authorization": f"Bearer {api.admin}"}
    alice_id = next(i for i, p in api.tokens.records() if p.name == "alice")
    other = TokenAuth.load(api.tokens.path.parent if api.tokens.path else Path())
    other.revoke(alice_id)  # by another process, unseen by the service until it looks
    r = await api.client.post(f"/v1/tokens/{alice_id}/rotate", headers=admin)
    assert r.status_code == 404 and r.json()["error"]["code"] == "token_not_found"
    assert api.tokens.path is not None
    api.tokens.path.write_text('{"version": 1, "tokens": [')  # half-written: the table fails closed
    r = await api.client.post("/v1/tokens", headers=admin, json={"name": "carol", "namespaces": ["user:carol"]})
    assert r.status_code == 503 and r.json()["error"]["code"] == "tokens_unavailable", r.text
    assert "not a valid token table" in r.json()["error"]["message"]


async def test_a_change_whose_notice_was_lost_holds_once_the_listener_is_back(
        postgres_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Notices sent while a supervisor's listener is away are lost: it reads the whole table when it is back."""
    import psycopg

    from codesdk.supervisor.api import _auth

    from tests.store.test_store_postgres import terminate_listeners

    monkeypatch.setattr(_auth, "REREAD_S", math.inf)  # no periodic read: only the reconnect can tell
    async with open_token_auth(tmp_path / "b", postgres_url) as b:
        _, _, alice = await trio.to_thread.run_sync(b.issue, "alice", ["user:alice"])
        with psycopg.connect(postgres_url, autocommit=True) as conn:  # a revoke whose notice never arrives
            conn.execute("DELETE FROM api_tokens WHERE name = 'alice'")
        assert b.authenticate(alice) is not None  # nothing told it
        assert await trio.to_thread.run_sync(terminate_listeners, postgres_url) >= 1
        await until("the revoke to hold once the listener reconnected", lambda: b.authenticate(alice) is None)
