"""Which endpoints want what: the URL check at registration, and an in-memory view for cheap questions."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from codesdk.protocol import webhook_wants

from ..egress import DEFAULT_PORTS, EgressPolicy, embedded_ipv4
from ..store import WebhookRecord
from ..tools import ToolError, parse_target


def url_refusal(egress: EgressPolicy, url: str, *, to_admin: bool) -> str | None:
    """Why ``url`` may not be an endpoint (None: it may). The admin is told which flag would allow it; a tenant only
    to ask the operator (the operator's allowlist is not a tenant's to read). The same policy is checked again on
    every send, against the addresses the host then resolves to."""
    try:  # the sender's own parse: a URL it could never send to is refused now, not dead on every delivery
        target = parse_target(url, "webhook", " (deliveries are signed instead)")
    except ToolError as exc:
        return exc.message
    host, port, scheme = target.host, target.port, target.scheme
    shown = f"[{host}]" if ":" in host else host
    if not egress.host_allowed(host, port, scheme):
        if not to_admin:
            return (f"host {shown}:{port} is not one this service sends webhooks to: use a host its operator "
                    "allows, or ask the operator to allow this one")
        return (f"host {shown}:{port} is not allowed for webhooks (allowed: {egress.describe_hosts()}); the "
                f"operator allows it with `codesdk-supervisor serve --webhook-allow {shown}"
                f"{'' if port == DEFAULT_PORTS[scheme] else f':{port}'}`")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None  # a name: its addresses are checked when it is resolved, on each send
    refusal = egress.address_refusal(address)
    if refusal is None:
        return None
    if not to_admin:
        return (f"{refusal}: this service sends webhooks only to public addresses; ask its operator if this one "
                "must be reached")
    inner = embedded_ipv4(address) if isinstance(address, ipaddress.IPv6Address) else None
    if address.is_link_local or (inner is not None and inner.is_link_local):
        return (f"{refusal}: cloud metadata services answer on link-local addresses (169.254.169.254 hands out the "
                "machine's credentials), so a webhook there could read and leak them. Allow it only if no such "
                f"service answers on this network: `codesdk-supervisor serve --webhook-allow-address {address}`")
    return (f"{refusal}: webhooks reach only public addresses unless the operator allows this one with "
            f"`codesdk-supervisor serve --webhook-allow-address {address}`")


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
