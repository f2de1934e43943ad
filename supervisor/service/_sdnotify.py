"""The sd_notify protocol: datagrams to ``$NOTIFY_SOCKET`` (a path, or ``@name`` for the abstract namespace).

A no-op when not started by systemd with ``Type=notify``. Written here (a dozen lines) rather than pulled in
as a dependency: the protocol is one sendto per state change.
"""

from __future__ import annotations

import os
import socket


class Notifier:
    def __init__(self, address: str | None = None) -> None:
        address = address if address is not None else os.environ.get("NOTIFY_SOCKET")
        if address and address.startswith("@"):
            address = "\0" + address[1:]
        self.address = address or None

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def notify(self, *states: str) -> None:
        if self.address is None:
            return
        message = "\n".join(states).encode()
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            try:
                sock.sendto(message, self.address)
            except OSError:
                pass  # systemd gone or socket not ours: notifications are advisory


def watchdog_interval_s() -> float | None:
    """Half of ``$WATCHDOG_USEC`` (systemd's advice), if a watchdog is configured for this process."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return int(usec) / 1_000_000 / 2
    except ValueError:
        return None
