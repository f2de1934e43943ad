"""Egress policy of ``http.fetch``: which hosts a call may name and which addresses it may connect to. Pure.

Two independent checks, both must pass:

* the URL's host (as written, lower-cased) against the operator's host patterns (``--allow-fetch``): ``example.com``
  (that host only), ``*.example.com`` (any host below it, not ``example.com`` itself), an IP literal (``10.1.2.3``,
  ``[fd00::1]``); each optionally with ``:PORT``. A pattern without a port allows the scheme's default port only
  (80 for http, 443 for https).
* every address the host resolves to against ``address_refusal``: only globally routable unicast addresses,
  unless the operator named the address in ``--allow-fetch-address`` (a CIDR). Loopback, RFC 1918, CGNAT
  (100.64/10), ULA (fc00::/7), link-local (169.254/16, fe80::/10, the cloud metadata endpoints among them),
  unspecified, multicast, reserved ranges and the IPv4-mapped/NAT64/6to4/Teredo spellings of those are refused.
  The check is on the resolver's answer, never on the URL's text, so ``2130706433`` or ``0x7f.1`` are 127.0.0.1 by
  the time they are looked at.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

DEFAULT_PORTS = {"http": 80, "https": 443}

_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


class PatternError(ValueError):
    """A host pattern or address range the operator wrote that cannot be used (the message says how to fix it)."""


def normalize_host(host: str) -> str:
    """The host as patterns compare it: lower case, no trailing dot, an IP literal in its canonical form (no
    brackets). ``PatternError`` for a host that is neither a DNS name nor an IP literal."""
    text = host.strip().lower()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
        try:
            return str(ipaddress.IPv6Address(text))
        except ValueError:
            raise PatternError(f"{host!r} is not an IPv6 address") from None
    try:
        return str(ipaddress.IPv4Address(text))
    except ValueError:
        pass
    text = text.removesuffix(".")
    if not text.isascii():
        raise PatternError(f"{host!r} is not ASCII: write an internationalized name in its xn-- (punycode) form")
    if len(text) > 253 or not all(_LABEL.match(label) for label in text.split(".")):
        raise PatternError(f"{host!r} is not a host name (letters, digits, '-' and dots) nor an IP address")
    return text


@dataclass(frozen=True)
class HostPattern:
    """One ``--allow-fetch`` entry: an exact host or, with ``suffix``, every host below ``host``."""

    host: str
    suffix: bool = False
    port: int | None = None

    @classmethod
    def parse(cls, text: str) -> HostPattern:
        """``host``, ``*.domain``, ``[v6]`` or ``1.2.3.4``, each optionally ``:PORT``; ``PatternError`` otherwise."""
        raw = text.strip()
        port: int | None = None
        head = raw
        if raw.startswith("["):
            close = raw.find("]")
            if close < 0:
                raise PatternError(f"{text!r}: an IPv6 address must be in brackets, [like::this]")
            head, rest = raw[: close + 1], raw[close + 1:]
            if rest:
                if not rest.startswith(":"):
                    raise PatternError(f"{text!r}: expected :PORT after the bracketed address")
                port = _port(text, rest[1:])
        elif raw.count(":") == 1:
            head, port_text = raw.split(":")
            port = _port(text, port_text)
        elif ":" in raw:
            raise PatternError(f"{text!r}: write an IPv6 address in brackets, e.g. [{raw}]")
        suffix = head.startswith("*.")
        if suffix:
            head = head[2:]
        if "*" in head:
            raise PatternError(f"{text!r}: '*' is allowed only as the first label ('*.example.com')")
        try:
            host = normalize_host(head)
        except PatternError as exc:
            raise PatternError(f"--allow-fetch {text!r}: {exc}") from None
        if suffix and _is_ip(host):
            raise PatternError(f"{text!r}: '*.' goes before a domain name, not an IP address")
        if suffix and "." not in host:
            raise PatternError(f"{text!r}: '*.{host}' would match a whole top-level domain; name a domain below it")
        return cls(host, suffix, port)

    def matches(self, host: str, port: int, scheme: str) -> bool:
        """Whether ``host`` (normalized) on ``port`` is allowed by this pattern."""
        if (self.port if self.port is not None else DEFAULT_PORTS.get(scheme)) != port:
            return False
        if self.suffix:
            return host.endswith("." + self.host)
        return host == self.host

    def covers(self, other: HostPattern) -> bool:
        """Whether every host and port ``other`` matches, this pattern matches too (a namespace's pattern must be
        covered by one of the operator's: it may narrow, never widen)."""
        if self.port != other.port:
            return False
        if not self.suffix:
            return not other.suffix and other.host == self.host
        return other.host.endswith("." + self.host) or (other.suffix and other.host == self.host)

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        text = ("*." if self.suffix else "") + host
        return text if self.port is None else f"{text}:{self.port}"


def _port(text: str, port: str) -> int:
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise PatternError(f"{text!r}: the port must be a number from 1 to 65535")
    return int(port)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def parse_network(text: str) -> IPNetwork:
    """One ``--allow-fetch-address`` entry: an address or a CIDR (``10.0.0.0/8``); ``PatternError`` otherwise."""
    try:
        return ipaddress.ip_network(text.strip(), strict=False)
    except ValueError:
        raise PatternError(f"--allow-fetch-address {text!r}: give an IP address or a CIDR such as 10.0.0.0/8 "
                           "or fd00::/8") from None


def embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one stands for (IPv4-mapped, NAT64, 6to4, Teredo's client), if any."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    return None


def _public(address: IPAddress) -> bool:
    return address.is_global and not address.is_multicast


def address_refusal(address: IPAddress, exceptions: tuple[IPNetwork, ...] = ()) -> str | None:
    """Why ``address`` may not be connected to (None: it may). Only globally routable unicast addresses may, and an
    IPv6 address standing for an IPv4 one only if that may too; ``exceptions`` (the operator's) allow any."""
    inner = embedded_ipv4(address) if isinstance(address, ipaddress.IPv6Address) else None
    if any(address in net for net in exceptions) or (inner is not None and any(inner in net for net in exceptions)):
        return None
    if inner is not None and not _public(inner):  # the IPv4 address it stands for says more
        return f"{address} (IPv4 {inner}), {_kind(inner)}"
    if not _public(address):
        return f"{address}, {_kind(address)}"
    return None


def _kind(address: IPAddress) -> str:
    """The reason ``address`` is not public, in words."""
    if address.is_loopback:
        return "a loopback address"
    if address.is_link_local:
        return "a link-local address (where cloud metadata endpoints live)"
    if address.is_unspecified:
        return "the unspecified address"
    if address.is_multicast:
        return "a multicast address"
    if address in ipaddress.ip_network("100.64.0.0/10"):
        return "a carrier-grade NAT address"
    if address.is_private:
        return "a private address"
    return "not a globally routable address"


@dataclass(frozen=True)
class EgressPolicy:
    """The operator's egress rules for ``http.fetch``: hosts a URL may name, addresses exempt from the public-only
    rule, and whether POST is allowed at all."""

    hosts: tuple[HostPattern, ...] = ()
    addresses: tuple[IPNetwork, ...] = ()
    allow_post: bool = False

    def host_allowed(self, host: str, port: int, scheme: str) -> bool:
        return any(pattern.matches(host, port, scheme) for pattern in self.hosts)

    def address_refusal(self, address: IPAddress) -> str | None:
        return address_refusal(address, self.addresses)

    def uncovered(self, patterns: tuple[HostPattern, ...]) -> list[HostPattern]:
        """The ``patterns`` (a namespace's) that would allow a host none of the operator's allows."""
        return [p for p in patterns if not any(mine.covers(p) for mine in self.hosts)]

    def describe_hosts(self) -> str:
        return ", ".join(str(pattern) for pattern in self.hosts) or "none"
