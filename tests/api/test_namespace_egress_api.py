"""A namespace's narrowing of http.fetch's hosts over the API: admin only, never wider than the operator's, and
what a fetch in that namespace is then refused."""

from __future__ import annotations

from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path

import pytest
import trio

from codesdk import AsyncClient, Forbidden, InvalidRequest
from codesdk.supervisor.egress import EgressPolicy, HostPattern
from codesdk.supervisor.tools import FETCH_TOOL_NAME, ToolContext

from tests.api.conftest import Api, serve_test_api
from tests.conftest import MakeEngine

OPERATOR = EgressPolicy(hosts=(HostPattern.parse("*.example.com"), HostPattern.parse("api.example.org:8443")))


@pytest.fixture
async def egress_api(make_engine: MakeEngine, tmp_path: Path, nursery: trio.Nursery) -> AsyncIterator[Api]:
    async with serve_test_api(partial(make_engine, fetch=OPERATOR), tmp_path) as served:
        yield served


async def test_admin_narrows_reads_and_drops_a_namespaces_hosts(egress_api: Api, tmp_path: Path) -> None:
    api = egress_api
    with trio.fail_after(30):
        async with AsyncClient(socket=api.socket, token=api.admin) as admin:
            before = await admin.namespace_egress("user:alice")
            assert before.operator_hosts == ("*.example.com", "api.example.org:8443") and before.hosts is None
            narrowed = await admin.set_namespace_egress("user:alice", ["docs.example.com", "*.cdn.example.com"])
            assert narrowed.hosts == ("docs.example.com", "*.cdn.example.com")
            assert (await admin.namespace_egress("user:alice")).hosts == narrowed.hosts
            assert (await admin.namespace_egress("user:bob")).hosts is None  # only that namespace

            tools, ws = api.engine.tooling, tmp_path / "ws"
            ws.mkdir()
            refused = await tools.execute(FETCH_TOOL_NAME, {"url": "https://www.example.com/"},
                                          ToolContext(workspace=ws, namespace="user:alice"))
            assert refused.is_error and isinstance(refused.content, dict)
            assert refused.content["error"] == {  # refused before any look-up: www is not on alice's list
                "code": "egress_refused", "message": "'https://www.example.com/': host www.example.com:443 is not "
                "allowed for http.fetch in namespace 'user:alice' (its egress policy allows: docs.example.com, "
                "*.cdn.example.com)"}

            assert (await admin.set_namespace_egress("user:alice", [])).hosts == ()
            dropped = await admin.set_namespace_egress("user:alice", None)
            assert dropped.hosts is None


@pytest.mark.parametrize(("hosts", "said"), [
    (["evil.test"], "would allow hosts the operator's --allow-fetch"),
    (["api.example.org"], "would allow hosts"),  # the operator allows only port 8443 there
    (["*.com"], "would match a whole top-level domain"),
    (["a*.example.com"], "'*' is allowed only as the first label"),
])
async def test_a_list_wider_than_the_operators_or_malformed_is_a_clear_422(egress_api: Api, hosts: list[str],
                                                                           said: str) -> None:
    with trio.fail_after(30):
        async with AsyncClient(socket=egress_api.socket, token=egress_api.admin) as admin:
            with pytest.raises(InvalidRequest) as refused:
                await admin.set_namespace_egress("user:alice", hosts)
            assert refused.value.code == "invalid_pattern" and said in refused.value.message
            assert (await admin.namespace_egress("user:alice")).hosts is None


async def test_tenants_may_neither_read_nor_change_egress(egress_api: Api) -> None:
    with trio.fail_after(30):
        async with AsyncClient(socket=egress_api.socket, token=egress_api.alice) as alice:
            for call in (alice.namespace_egress("user:alice"), alice.set_namespace_egress("user:alice", None)):
                with pytest.raises(Forbidden, match="admin token"):
                    await call
