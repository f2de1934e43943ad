"""The URL check at registration and the in-memory ``accepts`` view, as properties."""

from __future__ import annotations

import ipaddress
from datetime import UTC, datetime

import h11
from hypothesis import example, given
from hypothesis import strategies as st

from codesdk.protocol import WEBHOOK_ALL_KINDS, WebhookKind
from codesdk.supervisor.egress import EgressPolicy, HostPattern
from codesdk.supervisor.store import WebhookRecord
from codesdk.supervisor.tools import ToolError, parse_target
from codesdk.supervisor.webhooks import WebhookRegistry, url_refusal

labels = st.from_regex(r"[a-z][a-z0-9]{0,10}", fullmatch=True)
hosts = st.lists(labels, min_size=2, max_size=4).map(".".join)
ports = st.integers(1, 65535)
POLICY = EgressPolicy(hosts=(HostPattern.parse("hooks.example.com"), HostPattern.parse("*.ci.example.org:8443"),
                             HostPattern.parse("10.1.2.3:9000")),
                      addresses=(ipaddress.ip_network("10.1.2.0/24"),))


@given(st.text(max_size=200), st.booleans())
def test_any_text_is_judged_without_an_exception(url: str, to_admin: bool) -> None:
    refusal = url_refusal(POLICY, url, to_admin=to_admin)
    assert refusal is None or isinstance(refusal, str)


ALLOWED = st.sampled_from(["http://hooks.example.com", "https://hooks.example.com", "http://10.1.2.3:9000",
                           "https://x.ci.example.org:8443"])


@example("http://hooks.example.com", "/x\r\nX-Evil: 1")
@example("http://hooks.example.com", "/a b")
@example("http://hooks.example.com", "/\u0000x")
@example("http://hooks.example.com", "/\u00e9")
@example("http://hooks.example.com", "/x\ty")
@given(ALLOWED, st.text(max_size=40).map(lambda tail: "/" + tail))
def test_a_url_registration_takes_is_one_the_sender_can_send_to(base: str, tail: str) -> None:
    """Whatever the path and query, registration accepts a URL on an allowed host exactly when the sender's parse
    does, and then HTTP/1.1 can carry its request target: no webhook is accepted only to go dead on every send."""
    url = base + tail
    refusal = url_refusal(POLICY, url, to_admin=True)
    try:
        target = parse_target(url, "webhook")
    except ToolError as exc:
        assert refusal is not None and "http.fetch" not in refusal and "webhook" in exc.message
        return
    assert refusal is None, (url, refusal)
    h11.Connection(h11.CLIENT).send(h11.Request(method="POST", target=target.target, headers=[("Host", target.host)]))


@example("https", "hooks.example.com", None, "/a")
@example("https", "hooks.example.com", 8443, "")
@example("http", "build.ci.example.org", 8443, "/")
@example("http", "ci.example.org", 8443, "/")
@given(st.sampled_from(["http", "https"]), hosts | st.sampled_from(["hooks.example.com", "x.ci.example.org"]), st.none() | ports, st.from_regex(r"(/[a-z0-9]{0,8}){0,3}",
                                                                                     fullmatch=True))
def test_a_host_is_allowed_exactly_as_its_pattern_says(scheme: str, host: str, port: int | None, path: str) -> None:
    url = f"{scheme}://{host}{'' if port is None else f':{port}'}{path}"
    effective = port if port is not None else {"http": 80, "https": 443}[scheme]
    allowed = ((host == "hooks.example.com" and effective == {"http": 80, "https": 443}[scheme])
               or (host.endswith(".ci.example.org") and effective == 8443))
    refusal = url_refusal(POLICY, url, to_admin=True)
    assert (refusal is None) == allowed, (url, refusal)
    if refusal is not None:
        assert "--webhook-allow" in refusal
    told = url_refusal(POLICY, url, to_admin=False)
    assert (told is None) == allowed
    if told is not None:  # a tenant is told to ask the operator, never the allowlist or the flags
        assert "operator" in told and "--webhook" not in told and "hooks.example.com" not in told.replace(host, "")


@given(st.ip_addresses(v=4))
def test_an_address_needs_both_the_host_and_the_address_rule(address: ipaddress.IPv4Address) -> None:
    policy = EgressPolicy(hosts=(HostPattern.parse(str(address)),))
    refusal = url_refusal(policy, f"http://{address}/", to_admin=True)
    assert (refusal is None) == (address.is_global and not address.is_multicast)
    if refusal is not None:
        assert f"--webhook-allow-address {address}" in refusal
        assert ("metadata" in refusal) == address.is_link_local  # never suggested lightly
        told = url_refusal(policy, f"http://{address}/", to_admin=False)
        assert told is not None and "--webhook" not in told and "operator" in told


def _record(webhook_id: str, namespace: str | None, kinds: tuple[str, ...]) -> WebhookRecord:
    return WebhookRecord(webhook_id, "http://x/", kinds, namespace, "", "whsec_AA==", None, None,
                         datetime.now(UTC), "test", False)


subscriptions = st.lists(st.tuples(st.sampled_from([None, "user:a", "user:b"]),
                                   st.lists(st.sampled_from([*WebhookKind, WEBHOOK_ALL_KINDS]), min_size=1)),
                         max_size=6)


@given(subscriptions, st.sampled_from(["user:a", "user:b", "default"]), st.sampled_from(list(WebhookKind)),
       st.data())
def test_accepts_is_whether_some_endpoint_wants_it(subs: list[tuple[str | None, list[str]]], namespace: str,
                                                   kind: str, data: st.DataObject) -> None:
    registry = WebhookRegistry()
    records = [_record(f"wh_{n}", ns, tuple(kinds)) for n, (ns, kinds) in enumerate(subs)]
    registry.load(records[:1])
    for record in records[1:]:
        registry.add(record)
    removed = data.draw(st.sets(st.sampled_from([r.webhook_id for r in records])) if records else st.just(set()))
    for webhook_id in removed:
        registry.remove(webhook_id)
    expected = any((r.namespace in (None, namespace))
                   and (kind in r.kinds or WEBHOOK_ALL_KINDS in r.kinds or kind == WebhookKind.WEBHOOK_TEST)
                   for r in records if r.webhook_id not in removed)
    assert registry.accepts(namespace, kind) == expected
