"""http.fetch against real servers in the test's own network namespace: what it returns, and every way a call
could reach what the egress policy forbids (SSRF) refused before a byte is sent. The tool runs in the test's own
loop, as in production; only its sockets are opened in the namespace (``Served.connect``, see tests/netns.py)."""

from __future__ import annotations

import ipaddress
import json
import os
import ssl
import subprocess
import threading
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import trio

from codesdk.protocol import ToolClass
from codesdk.supervisor.egress import EgressPolicy, HostPattern, IPAddress, parse_network
from codesdk.supervisor.tools import (
    FETCH_TOOL_NAME,
    FetchPolicy,
    ToolContext,
    ToolLimits,
    ToolRegistry,
    ToolResult,
    ToolsConfig,
    system_resolver,
)

from tests.netns import FreshNetns
from tests.tools.http_server import BIG, Served, serve_in

#: The test server's address: allowed by the operator's --allow-fetch-address; 127.0.0.1 (where a "secret" server
#: listens) is not.
SERVER = "127.0.0.2"
SECRET = "127.0.0.1"
NAMES = {"api.example.test": [SERVER], "meta.example.test": ["169.254.169.254"],
         "mixed.example.test": [SERVER, SECRET], "ec2v6.example.test": ["fd00:ec2::254"]}


async def fake_resolver(host: str, port: int) -> list[IPAddress]:
    """Names the tests made up; everything else (numeric spellings) as the system resolves it."""
    if host in NAMES:
        return [ipaddress.ip_address(a) for a in NAMES[host]]
    return await system_resolver(host, port)


class Blobs:
    def __init__(self) -> None:
        self.stored: dict[str, tuple[bytes, str]] = {}

    async def put(self, data: bytes, media_type: str) -> str:
        ref = f"blob-{len(self.stored)}"
        self.stored[ref] = (data, media_type)
        return ref


def registry(port: int, via: Served | None = None, *, hosts: tuple[str, ...] = (), post: bool = False,
             ssl_context: ssl.SSLContext | None = None) -> ToolRegistry:
    """http.fetch allowed on ``*.example.test:port`` (and ``hosts``), connecting into ``via``'s namespace."""
    patterns = tuple(HostPattern.parse(p) for p in (f"*.example.test:{port}", *hosts))
    egress = EgressPolicy(hosts=patterns, addresses=(parse_network(f"{SERVER}/32"),), allow_post=post)
    policy = FetchPolicy(egress=egress, resolver=fake_resolver, ssl_context=ssl_context)
    if via is not None:
        assert via.connect is not None
        policy = replace(policy, connect=via.connect)
    return ToolRegistry(ToolsConfig(fetch=policy))


Scenario = Callable[[FreshNetns, Served, Served, Path], Awaitable[Any]]


async def in_netns(tmp_path: Path, scenario: Scenario) -> Any:
    """Run ``scenario(netns, server, secret, workspace)`` with both servers up in a network namespace of their
    own."""
    async with FreshNetns() as netns:
        server = await serve_in(netns, SERVER)
        secret = await serve_in(netns, SECRET)
        with trio.fail_after(60):
            return await scenario(netns, server, secret, tmp_path)


async def call(tools: ToolRegistry, workspace: Path, blobs: Blobs | None = None,
               limits: ToolLimits | None = None, **args: Any) -> ToolResult:
    ctx = ToolContext(workspace=workspace, limits=limits or ToolLimits(),
                      put_blob=blobs.put if blobs is not None else None, namespace="user:alice")
    return await tools.execute(FETCH_TOOL_NAME, args, ctx)


def error_of(result: ToolResult) -> tuple[str, str]:
    assert result.is_error and isinstance(result.content, dict)
    error = result.content["error"]
    assert isinstance(error, dict)
    return str(error["code"]), str(error["message"])


def test_off_unless_a_host_is_allowed() -> None:
    tools = ToolRegistry()
    assert FETCH_TOOL_NAME not in tools.tools
    on = registry(80)
    assert on.spec(FETCH_TOOL_NAME) is not None and on.spec(FETCH_TOOL_NAME).tool_class is ToolClass.NETWORK  # type: ignore[union-attr]


async def test_disabled_tool_says_how_to_enable_it(tmp_path: Path) -> None:
    result = await ToolRegistry().execute(FETCH_TOOL_NAME, {"url": "http://x.test/"}, ToolContext(workspace=tmp_path))
    assert error_of(result) == ("unknown_tool", error_of(result)[1]) and "--allow-fetch" in error_of(result)[1]


async def test_text_json_and_binary_bodies(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async def scenario(netns: FreshNetns, server: Served, secret: Served, ws: Path) -> None:
        tools, blobs = registry(server.port, server), Blobs()
        base = f"http://api.example.test:{server.port}"
        text = await call(tools, ws, blobs, url=f"{base}/text")
        assert not text.is_error and isinstance(text.content, dict)
        assert text.content["status"] == 200 and text.content["text"] == "hello from the namespace"
        assert text.content["final_url"] == f"{base}/text" and text.content["truncated"] is False
        assert "set-cookie" not in text.content["headers"]  # type: ignore[operator]
        ref = text.content["body_ref"]
        assert isinstance(ref, str) and blobs.stored[ref][0] == b"hello from the namespace"
        assert text.output_ref == ref  # named by tool.call.completed, so the session's readers may download it
        assert text.sandbox.network is True and text.execution_env == "supervisor:network"
        data = await call(tools, ws, blobs, url=f"{base}/json")
        assert isinstance(data.content, dict) and json.loads(str(data.content["text"])) == {"ok": True}
        binary = await call(tools, ws, blobs, url=f"{base}/bin")
        assert isinstance(binary.content, dict) and binary.content["text"] is None
        assert blobs.stored[str(binary.content["body_ref"])] == (bytes(range(256)), "application/octet-stream")
        head = await call(tools, ws, blobs, url=f"{base}/text", method="HEAD")
        assert isinstance(head.content, dict) and head.content["status"] == 200 and head.content["bytes"] == 0
        missing = await call(tools, ws, blobs, url=f"{base}/nothing")
        assert missing.is_error and isinstance(missing.content, dict) and missing.content["status"] == 404
    caplog.set_level("INFO", logger="codesdk.audit")
    await in_netns(tmp_path, scenario)
    fetched = [r for r in caplog.records if getattr(r, "audit", {}).get("action") == "tool.http_fetch"]
    assert len(fetched) == 5 and all(r.audit["by"] == "namespace:user:alice" for r in fetched)  # type: ignore[attr-defined]
    assert fetched[0].audit["status"] == 200 and fetched[0].audit["outcome"] == "ok"  # type: ignore[attr-defined]


async def test_size_is_truncated_and_says_so(tmp_path: Path) -> None:
    async def scenario(netns: FreshNetns, server: Served, secret: Served, ws: Path) -> None:
        tools, blobs = registry(server.port, server), Blobs()
        url = f"http://api.example.test:{server.port}/big"
        cut = await call(tools, ws, blobs, url=url, max_bytes=1000)
        assert isinstance(cut.content, dict) and cut.content["truncated"] is True and cut.content["bytes"] == 1000
        assert "cut at 1000 bytes" in str(cut.content["note"])
        capped = await call(tools, ws, blobs, ToolLimits(fetch_max_bytes=4096), url=url, max_bytes=10 * BIG)
        assert isinstance(capped.content, dict) and capped.content["bytes"] == 4096 and capped.content["truncated"]
        whole = await call(tools, ws, blobs, url=url)
        assert isinstance(whole.content, dict) and whole.content["bytes"] == BIG and not whole.content["truncated"]
    await in_netns(tmp_path, scenario)


async def test_timeout_is_its_own_error(tmp_path: Path) -> None:
    async def scenario(netns: FreshNetns, server: Served, secret: Served, ws: Path) -> None:
        result = await call(registry(server.port, server), ws, limits=ToolLimits(fetch_timeout_s=0.5),
                            url=f"http://api.example.test:{server.port}/slow")
        code, message = error_of(result)
        assert code == "timeout" and "within 0.5s" in message
    await in_netns(tmp_path, scenario)


async def test_redirects_are_followed_and_a_loop_is_cut(tmp_path: Path) -> None:
    async def scenario(netns: FreshNetns, server: Served, secret: Served, ws: Path) -> None:
        tools = registry(server.port, server)
        base = f"http://api.example.test:{server.port}"
        followed = await call(tools, ws, url=f"{base}/redirect?to=/text")
        assert isinstance(followed.content, dict) and followed.content["final_url"] == f"{base}/text"
        assert followed.content["redirects"] == [f"{base}/redirect?to=/text"]
        code, message = error_of(await call(tools, ws, url=f"{base}/loop"))
        assert code == "network_error" and "more than 5 redirects" in message
    await in_netns(tmp_path, scenario)


async def test_post_only_with_the_switch(tmp_path: Path) -> None:
    async def scenario(netns: FreshNetns, server: Served, secret: Served, ws: Path) -> None:
        url = f"http://api.example.test:{server.port}/echo"
        code, message = error_of(await call(registry(server.port, server), ws, url=url, method="POST", body="x=1"))
        assert code == "egress_refused" and "--allow-fetch-post" in message
        assert server.hits == []
        posted = await call(registry(server.port, server, post=True), ws, url=url, method="POST", body="x=1",
                            headers={"X-Token": "t"})
        assert isinstance(posted.content, dict)
        echoed = json.loads(str(posted.content["text"]))
        assert echoed["method"] == "POST" and echoed["body"] == "x=1" and echoed["headers"]["x-token"] == "t"
        assert echoed["headers"]["host"] == f"api.example.test:{server.port}"
    await in_netns(tmp_path, scenario)


async def test_a_post_redirected_elsewhere_keeps_its_body_and_a_strange_charset_is_read_as_utf8(
        tmp_path: Path) -> None:
    async def scenario(netns: FreshNetns, server: Served, secret: Served, ws: Path) -> None:
        tools = registry(server.port, server, post=True)
        base = f"http://api.example.test:{server.port}"
        here = await call(tools, ws, url=f"{base}/redirect?status=307&to=/echo", method="POST", body="x=1")
        assert isinstance(here.content, dict)
        assert json.loads(str(here.content["text"]))["body"] == "x=1"  # the same origin: the body goes along
        other = f"http://other.example.test:{server.port}/echo"
        code, message = error_of(await call(tools, ws, url=f"{base}/redirect?status=308&to={other}", method="POST",
                                            body="secret=1"))
        assert code == "network_error" and "another origin" in message
        assert server.hits[-1] == f"/redirect?status=308&to={other}"  # the body never went to the other
        odd = await call(tools, ws, url=f"{base}/charset")
        assert isinstance(odd.content, dict) and odd.content["text"] == "café \ufffd"
    await in_netns(tmp_path, scenario)


@pytest.mark.parametrize("headers", [{"Host": "metadata.google.internal"}, {"Transfer-Encoding": "chunked"},
                                     {"Connection": "upgrade"}, {"Proxy-Authorization": "x"},
                                     {"X-Evil": "a\r\nHost: b"}])
async def test_headers_that_would_change_the_request_are_refused(tmp_path: Path, headers: dict[str, str]) -> None:
    result = await call(registry(80), tmp_path, url="http://api.example.test/text", headers=headers)
    assert error_of(result)[0] == "invalid_input"


#: (URL path after http://, why it must be refused). {port} is the secret server's.
SSRF = [
    ("127.0.0.1:{port}/text", "loopback"),  # a loopback literal (allowlisted below, refused by address)
    ("2130706433:{port}/text", "loopback"),  # decimal spelling of 127.0.0.1
    ("0x7f.1:{port}/text", "loopback"),  # hex, short form
    ("[::1]:{port}/text", "loopback"),
    ("[::ffff:127.0.0.1]:{port}/text", "loopback"),  # IPv4-mapped
    ("meta.example.test:{port}/latest/meta-data/", "link-local"),  # a name resolving to the metadata endpoint
    ("ec2v6.example.test:{port}/", "private"),  # fd00:ec2::254
    ("mixed.example.test:{port}/text", "loopback"),  # one bad answer among good ones
    ("unlisted.test:{port}/text", "is not allowed for http.fetch"),  # not on the allowlist
]


@pytest.mark.parametrize(("where", "why"), SSRF)
async def test_ssrf_attempts_are_refused_before_connecting(tmp_path: Path, where: str, why: str,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    async def scenario(netns: FreshNetns, server: Served, secret: Served, ws: Path) -> None:
        port = secret.port
        literal = ("127.0.0.1", "2130706433", "0x7f.1", "[::1]", "[::ffff:127.0.0.1]")
        tools = registry(port, secret, hosts=tuple(f"{host}:{port}" for host in literal))
        code, message = error_of(await call(tools, ws, url="http://" + where.format(port=port)))
        assert code == "egress_refused" and why in message, message
        assert secret.hits == []
    caplog.set_level("INFO", logger="codesdk.audit")
    await in_netns(tmp_path, scenario)
    [refused] = [r for r in caplog.records if getattr(r, "audit", {}).get("action") == "tool.http_fetch"]
    assert refused.audit["outcome"] == "egress_refused"  # type: ignore[attr-defined]


async def test_a_redirect_to_loopback_is_refused(tmp_path: Path) -> None:
    async def scenario(netns: FreshNetns, server: Served, secret: Served, ws: Path) -> None:
        tools = registry(server.port, server, hosts=(f"127.0.0.1:{secret.port}",))
        to = f"http://127.0.0.1:{secret.port}/text"
        code, message = error_of(await call(tools, ws, url=f"http://api.example.test:{server.port}/redirect?to={to}"))
        assert code == "egress_refused" and "127.0.0.1, a loopback address" in message
        assert server.hits and secret.hits == []
    await in_netns(tmp_path, scenario)


async def test_a_closed_port_or_a_broken_answer_is_a_network_error(tmp_path: Path) -> None:
    async def scenario(netns: FreshNetns, server: Served, secret: Served, ws: Path) -> None:
        code, message = error_of(await call(registry(1, server), ws, url="http://api.example.test:1/text"))
        assert code == "network_error" and "could not connect" in message
        for path in ("/garbage", "/close"):
            code, message = error_of(await call(registry(server.port, server), ws,
                                                url=f"http://api.example.test:{server.port}{path}"))
            assert code == "network_error" and "the exchange with api.example.test failed" in message, message
    await in_netns(tmp_path, scenario)


def _certificate(tmp_path: Path, host: str) -> tuple[Path, Path]:
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    try:
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                        str(cert), "-days", "1", "-subj", f"/CN={host}", "-addext", f"subjectAltName=DNS:{host}"],
                       check=True, capture_output=True, timeout=60)
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"no openssl to make a test certificate with: {exc}")
    return key, cert


async def test_https_verifies_the_certificate_against_the_host_name(tmp_path: Path) -> None:
    key, cert = _certificate(tmp_path, "api.example.test")
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)
    trusting = ssl.create_default_context(cafile=str(cert))

    async with FreshNetns() as netns:
        server = await serve_in(netns, SERVER, tls=server_tls)
        NAMES["other.example.test"] = [SERVER]
        try:
            tools = registry(server.port, server, ssl_context=trusting)
            ok = await call(tools, tmp_path, url=f"https://api.example.test:{server.port}/text")
            assert isinstance(ok.content, dict) and ok.content["text"] == "hello from the namespace", ok.content
            code, message = error_of(await call(tools, tmp_path, url=f"https://other.example.test:{server.port}/"))
            assert code == "network_error" and "TLS" in message
        finally:
            del NAMES["other.example.test"]


async def test_a_namespace_list_that_cannot_be_read_refuses_rather_than_widens(tmp_path: Path) -> None:
    def broken(namespace: str) -> tuple[HostPattern, ...] | None:
        raise ValueError("namespace-egress.json is not a namespace egress file")

    egress = EgressPolicy(hosts=(HostPattern.parse("api.example.test"),))
    tools = ToolRegistry(ToolsConfig(fetch=FetchPolicy(egress=egress, resolver=fake_resolver, namespace_hosts=broken)))
    code, message = error_of(await call(tools, tmp_path, url="http://api.example.test/text"))
    assert code == "egress_refused" and "egress policy cannot be read" in message


async def test_the_connection_goes_to_the_address_checked_not_a_later_answer(tmp_path: Path) -> None:
    """DNS rebinding: a name that answers an allowed address first and loopback after is looked up once per
    request, and that first answer is where the connection goes — not to a twin server on loopback's same port."""
    async def scenario(netns: FreshNetns, server: Served, secret: Served, ws: Path) -> None:
        answers: list[str] = []

        async def rebinding(host: str, port: int) -> list[IPAddress]:
            answers.append(host)
            return [ipaddress.ip_address(SERVER if len(answers) == 1 else SECRET)]

        egress = EgressPolicy(hosts=(HostPattern.parse(f"rebind.example.test:{server.port}"),),
                              addresses=(parse_network(f"{SERVER}/32"),))
        assert server.connect is not None
        tools = ToolRegistry(ToolsConfig(fetch=FetchPolicy(egress=egress, resolver=rebinding,
                                                           connect=server.connect)))
        twin = await serve_in(netns, SECRET, port=server.port)
        result = await call(tools, ws, url=f"http://rebind.example.test:{server.port}/text")
        assert isinstance(result.content, dict) and result.content["text"] == "hello from the namespace"
        assert answers == ["rebind.example.test"] and server.hits == ["/text"] and twin.hits == []
    await in_netns(tmp_path, scenario)


def _netns_of_python_threads() -> set[str]:
    """The network namespaces of this process's running Python threads (threads ending meanwhile are left out)."""
    seen = set()
    for thread in threading.enumerate():
        try:
            seen.add(os.readlink(f"/proc/self/task/{thread.native_id}/ns/net"))
        except FileNotFoundError:
            pass
    return seen


def _netns_of_threads() -> set[str]:
    """The network namespaces this process's threads are in (threads ending meanwhile are left out)."""
    seen = set()
    for task in Path("/proc/self/task").iterdir():
        try:
            seen.add(os.readlink(task / "ns" / "net"))
        except FileNotFoundError:
            pass
    return seen


async def test_no_thread_of_the_process_is_left_in_the_namespace(tmp_path: Path) -> None:
    """Only the servers' thread enters the namespace: worker threads the fetch and the test use (trio keeps them
    for later tests) are in the process's own, during the test and after."""
    ours = os.readlink("/proc/thread-self/ns/net")
    before = _netns_of_threads()  # an earlier test's threads may still be ending: this test answers for its own
    theirs: set[str] = set()

    async def scenario(netns: FreshNetns, server: Served, secret: Served, ws: Path) -> None:
        fetched = await call(registry(server.port, server), ws, url=f"http://api.example.test:{server.port}/text")
        assert isinstance(fetched.content, dict) and fetched.content["status"] == 200
        in_worker = await trio.to_thread.run_sync(os.readlink, "/proc/thread-self/ns/net")
        assert in_worker == ours
        theirs.update(_netns_of_threads() - before - {ours})
        assert len(theirs) == 1  # the servers' thread's, and only it left ours
    await in_netns(tmp_path, scenario)
    # every thread still running (trio's idle workers among them) is out of it; the servers' own has returned (its
    # kernel task may linger a moment after join, so /proc alone would not say)
    assert not _netns_of_python_threads() & theirs
