"""Whether this process runs with no way off the machine: what a test that starts a real agent runtime needs."""

from __future__ import annotations

import socket

#: Why a test that needs a loopback-only network namespace was skipped, and how to run it.
OUTSIDE_NETNS_REASON = (
    "needs a loopback-only network namespace (real agent runtimes must not reach the network): run pytest inside "
    "one, e.g. `unshare --net --map-root-user sh -c 'ip link set lo up && exec pytest …'`, or CodeSDK's "
    "scripts/netns-run")


def loopback_only() -> bool:
    """True inside a network namespace whose only interface is loopback."""
    return [name for _, name in socket.if_nameindex()] == ["lo"]
