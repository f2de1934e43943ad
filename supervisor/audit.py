"""The service's audit log: who changed or removed what, a line each, on the logger ``codesdk.audit`` (the service's
log; with ``--log-format json`` each line carries the facts as fields)."""

from __future__ import annotations

import logging

log = logging.getLogger("codesdk.audit")


def audit(action: str, by: str, **facts: object) -> None:
    """Record ``action`` (``session.deleted`` …) done by ``by`` (``api:<token name>``, ``cli``), with its facts."""
    said = " ".join(f"{name}={value}" for name, value in facts.items())
    log.info("%s by %s: %s", action, by, said, extra={"audit": {"action": action, "by": by, **facts}})
