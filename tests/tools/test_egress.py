"""The egress policy's host patterns and address rule, as properties."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from codesdk.supervisor.egress import HostPattern, PatternError, address_refusal, parse_network

label = st.from_regex(r"\A[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?\Z")
domain = st.lists(label, min_size=2, max_size=4).map(".".join)
names = domain.filter(lambda d: not all(part.isdigit() for part in d.split(".")))  # 1.2.3.4 is an IP address
ports = st.integers(1, 65535)
schemes = st.sampled_from(["http", "https"])
DEFAULT = {"http": 80, "https": 443}


@given(domain, domain, schemes)
def test_an_exact_pattern_matches_its_host_only_on_the_default_port(host: str, other: str, scheme: str) -> None:
    pattern = HostPattern.parse(host)
    assert pattern.matches(host, DEFAULT[scheme], scheme)
    assert not pattern.matches(host, 8443, scheme)
    assert pattern.matches(other, DEFAULT[scheme], scheme) == (other == host)


@given(names, label, st.text(alphabet="abcxyz-", min_size=1, max_size=5), ports, schemes)
def test_a_suffix_pattern_matches_hosts_below_the_domain_only(
        parent: str, sub: str, glued: str, port: int, scheme: str) -> None:
    pattern = HostPattern.parse(f"*.{parent}:{port}")
    assert pattern.matches(f"{sub}.{parent}", port, scheme)
    assert pattern.matches(f"a.{sub}.{parent}", port, scheme)
    assert not pattern.matches(parent, port, scheme)  # not the domain itself
    assert not pattern.matches(f"{glued}{parent}", port, scheme)  # evilexample.com is not below example.com
    assert not pattern.matches(f"{sub}.{parent}.evil.test", port, scheme)
    assert not pattern.matches(f"{sub}.{parent}", port % 65535 + 1, scheme)


@given(st.one_of(domain, names.map(lambda d: f"*.{d}"), st.ip_addresses().map(str)), st.none() | ports)
def test_a_pattern_reads_back_as_written(host: str, port: int | None) -> None:
    if ":" in host:
        host = f"[{host}]"
    text = host if port is None else f"{host}:{port}"
    pattern = HostPattern.parse(text)
    assert HostPattern.parse(str(pattern)) == pattern


def test_patterns_are_case_and_dot_insensitive() -> None:
    assert HostPattern.parse("API.Example.COM.") == HostPattern.parse("api.example.com")
    assert HostPattern.parse("[::FFFF:127.0.0.1]:8080").host == "::ffff:7f00:1"


@pytest.mark.parametrize("bad", ["", "*", "*.com", "a*.example.com", "*.*.example.com", "example.com:0",
                                 "example.com:65536", "example.com:http", "::1", "[::1", "[::1]x",
                                 "exa mple.com", "-bad.example.com", "bücher.example", "*.10.0.0.1",
                                 "a..b.com"])
def test_bad_patterns_are_refused_with_a_reason(bad: str) -> None:
    with pytest.raises(PatternError) as refused:
        HostPattern.parse(bad)
    assert str(refused.value)


NOT_PUBLIC = ["127.0.0.0/8", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "169.254.0.0/16",
              "0.0.0.0/8", "224.0.0.0/4", "240.0.0.0/4", "::1/128", "fc00::/7", "fe80::/10", "ff00::/8", "::/128"]


@given(st.sampled_from(NOT_PUBLIC), st.integers(0, 2**32 - 1))
def test_no_address_that_is_not_public_is_allowed_in_any_spelling(network: str, bits: int) -> None:
    net = ipaddress.ip_network(network)
    address = net[bits % net.num_addresses]
    assert address_refusal(address) is not None
    if isinstance(address, ipaddress.IPv4Address):
        for v6 in (f"::ffff:{address}", f"64:ff9b::{address}"):  # IPv4-mapped, NAT64
            assert address_refusal(ipaddress.IPv6Address(v6)) is not None
    assert address_refusal(address, (net,)) is None  # unless the operator exempts it


@given(st.ip_addresses())
def test_only_global_unicast_addresses_are_allowed(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> None:
    allowed = address_refusal(address) is None
    if allowed:
        assert address.is_global and not address.is_multicast


def test_public_addresses_are_allowed_and_metadata_endpoints_are_not() -> None:
    assert address_refusal(ipaddress.ip_address("93.184.216.34")) is None
    assert address_refusal(ipaddress.ip_address("2606:2800:220:1::1")) is None
    assert "link-local" in str(address_refusal(ipaddress.ip_address("169.254.169.254")))
    assert address_refusal(ipaddress.ip_address("fd00:ec2::254")) is not None
    assert address_refusal(ipaddress.ip_address("::ffff:169.254.169.254")) is not None


@pytest.mark.parametrize("bad", ["", "10.0.0.0/33", "example.com", "10.0.0.0/8/8"])
def test_bad_address_ranges_are_refused(bad: str) -> None:
    with pytest.raises(PatternError, match="CIDR"):
        parse_network(bad)


patterns = st.builds(lambda suffix, host, port: HostPattern(host, suffix, port), st.booleans(),
                     st.sampled_from(["example.com", "a.example.com", "b.a.example.com", "example.org"]),
                     st.sampled_from([None, 443, 8443]))
hosts = st.builds(lambda sub, parent: f"{sub}.{parent}" if sub else parent, st.sampled_from(["", "x", "a", "b.a"]),
                  st.sampled_from(["example.com", "a.example.com", "example.org"]))


@given(patterns, patterns, hosts, st.sampled_from([80, 443, 8443]), schemes)
def test_a_covered_pattern_never_allows_what_its_cover_does_not(
        outer: HostPattern, inner: HostPattern, host: str, port: int, scheme: str) -> None:
    """What a namespace may set (a pattern one of the operator's covers) narrows: never a host the operator's
    does not allow."""
    if outer.covers(inner) and inner.matches(host, port, scheme):
        assert outer.matches(host, port, scheme)


def test_covering_by_example() -> None:
    wide = HostPattern.parse("*.example.com")
    assert wide.covers(HostPattern.parse("docs.example.com")) and wide.covers(HostPattern.parse("*.a.example.com"))
    assert wide.covers(wide) and not wide.covers(HostPattern.parse("example.com"))
    assert not wide.covers(HostPattern.parse("docs.example.com:8443"))
    assert not HostPattern.parse("docs.example.com").covers(HostPattern.parse("*.docs.example.com"))
