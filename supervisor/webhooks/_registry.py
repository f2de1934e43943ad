"""Which endpoints want what: the URL check at registration, and an in-memory view for cheap questions."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit

from codesdk.protocol import webhook_wants

from ..egress import DEFAULT_PORTS, EgressPolicy, PatternError, normalize_host
from ..store import WebhookRecord


def url_refusal(egress: EgressPolicy, url: str) -> str | None:
    """Why ``url`` may not be an endpoint (None: it may), in words that say what the operator must allow. The same
    policy is checked again on every send, against the addresses the host then resolves to."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return f"{url!r} is not a valid URL: {exc}"
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        return f"{url!r}: a webhook URL is http:// or https://"
    if parts.username is not None or parts.password is not None:
        return f"{url!r}: credentials in the URL are not allowed (deliveries are signed instead)"
    if not parts.hostname:
        return f"{url!r} names no host"
    try:
        host = normalize_host(f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname)
    except PatternError as exc:
        return f"{url!r}: {exc}"
    port = port if port is not None else DEFAULT_PORTS[scheme]
    shown = f"[{host}]" if ":" in host else host
    if not egress.host_allowed(host, port, scheme):
        return (f"host {shown}:{port} is not allowed for webhooks (allowed: {egress.describe_hosts()}); the "
                f"operator allows it with `codesdk-supervisor serve --webhook-allow {shown}"
                f"{'' if port == DEFAULT_PORTS[scheme] else f':{port}'}`")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None  # a name: its addresses are checked when it is resolved, on each send
    refusal = egress.address_refusal(address)
    if refusal is not None:
        return (f"{refusal}: webhooks reach only public addresses unless the operator allows this one with "
                f"`codesdk-supervisor serve --webhook-allow-address {address}`")
    return None


@dataclass(frozen=True, slots=True)
class _Subscription:
    namespace: str | None
    kinds: tuple[str, ...]


class WebhookRegistry:
    """The registered endpoints' namespaces and kinds, kept current on register/remove (and reloaded from the store
    now and then, for those another supervisor registered): what ``accepts`` answers from, without the store."""

    def __init__(self) -> None:
        self._subscriptions: dict[str, _Subscription] = {}

    def load(self, records: list[WebhookRecord]) -> None:
        self._subscriptions = {r.webhook_id: _Subscription(r.namespace, r.kinds) for r in records if not r.disabled}

    def add(self, record: WebhookRecord) -> None:
        if not record.disabled:
            self._subscriptions[record.webhook_id] = _Subscription(record.namespace, record.kinds)

    def remove(self, webhook_id: str) -> None:
        self._subscriptions.pop(webhook_id, None)

    def accepts(self, namespace: str, kind: str) -> bool:
        """Whether some endpoint gets ``kind`` from ``namespace`` (one of its own, or one of every namespace)."""
        return any((s.namespace is None or s.namespace == namespace) and webhook_wants(s.kinds, kind)
                   for s in self._subscriptions.values())
