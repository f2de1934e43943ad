"""Who can answer an approval or a question, and what happens when nobody can.

An approval or a question waits for a person. Someone can answer one in a namespace when a client is attached (an
open SSE event stream of one of the namespace's sessions, counted by the API's stream handlers), when its task has
its own approver or answerer (a terminal, an embedding app), or when a webhook takes ``approval.requested`` (or
``question.requested``) there. When nobody can, waiting the whole timeout only holds a worker for nobody: the
operator's ``RoutingPolicy`` applies at once — deny (decline) with a reason that says what to attach or register,
or wait with a shorter deadline. A request still pending ``escalate_after_s`` after it opened is escalated once
(``approval.escalated`` / ``question.escalated``) so that a second target hears of it.

The count is this process's: a client attached to another supervisor sharing the store is not seen here.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

import trio

log = logging.getLogger("codesdk.supervisor.audience")

#: Whether a webhook in a namespace takes a kind of event (``WebhookRegistry.accepts``): cheap and synchronous.
WebhookSource = Callable[[str, str], bool]

#: The kinds a webhook would be told of a request by.
APPROVAL_KIND, QUESTION_KIND = "approval.requested", "question.requested"


def nobody(namespace: str, kind: str) -> bool:
    """The webhook source of a supervisor without webhooks."""
    return False


class Unattended(StrEnum):
    """What an approval or question nobody can answer becomes (``serve --unattended``)."""

    DENY = "deny"  # denied (a question declined) at once, saying why
    WAIT = "wait"  # waits, but only ``unattended_wait_s``


#: ``serve``'s defaults: wait two minutes. Denying at once would refuse a call whose client is a moment late — a
#: client starts its task, then opens its stream — or is reconnecting; two minutes frees the worker soon anyway,
#: and an expired approval is a denial: nothing runs unapproved either way.
SERVICE_UNATTENDED, SERVICE_UNATTENDED_WAIT_S = Unattended.WAIT, 120.0
#: How long a request nobody can answer looks for a client attaching before the fallback applies: the client that
#: has just started the task opens its stream a moment later (an approval looks before it is stored; a question,
#: recorded in its runtime's order without waiting, only before it is declined by ``deny``).
ATTACH_GRACE_S = 5.0


@dataclass(frozen=True, slots=True)
class RoutingPolicy:
    """The operator's routing of approvals and questions (``serve --unattended``, ``--unattended-wait``,
    ``--escalate-after``)."""

    unattended: Unattended = SERVICE_UNATTENDED
    unattended_wait_s: float = SERVICE_UNATTENDED_WAIT_S
    escalate_after_s: float | None = None
    attach_grace_s: float = ATTACH_GRACE_S

    def __post_init__(self) -> None:
        for name in ("unattended_wait_s", "escalate_after_s", "attach_grace_s"):
            value = getattr(self, name)
            if value is not None and (not math.isfinite(value) or value < 0 or (value == 0 and name != "attach_grace_s")):
                raise ValueError(f"{name} must be a finite number of seconds above 0, not {value!r}")


class Audience:
    """The clients attached per namespace, and the webhook source (``webhooks``, replaceable: the service sets
    its registry's ``accepts``)."""

    def __init__(self, webhooks: WebhookSource = nobody) -> None:
        self.webhooks = webhooks
        self._streams: dict[str, int] = {}
        self._changed = trio.Event()

    @contextmanager
    def attached(self, namespace: str) -> Iterator[None]:
        """A client follows the namespace for as long as this is entered (released however it ends)."""
        self._streams[namespace] = self._streams.get(namespace, 0) + 1
        self._wake()
        try:
            yield
        finally:
            left = self._streams[namespace] - 1
            if left:
                self._streams[namespace] = left
            else:
                del self._streams[namespace]

    def streams(self, namespace: str) -> int:
        return self._streams.get(namespace, 0)

    def webhook_takes(self, namespace: str, kind: str) -> bool:
        try:
            return bool(self.webhooks(namespace, kind))
        except Exception:  # a broken source tells nobody: the fallback applies, never a failed request
            log.exception("the webhook source failed for %s in %s", kind, namespace)
            return False

    def reachable(self, namespace: str, kind: str) -> bool:
        """Someone attached or registered could answer a request of ``kind`` in ``namespace``."""
        return self.streams(namespace) > 0 or self.webhook_takes(namespace, kind)

    async def wait_reachable(self, namespace: str, kind: str, limit_s: float) -> bool:
        """Whether someone can answer within ``limit_s`` (a client attaching meanwhile counts)."""
        with trio.move_on_after(limit_s):
            while not self.reachable(namespace, kind):
                changed = self._changed
                await changed.wait()
            return True
        return self.reachable(namespace, kind)

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()


@dataclass(frozen=True, slots=True)
class Route:
    """How one request was routed when it opened: whether someone could answer it then, the fallback that
    applied (None: none did), its wait, when it escalates (None: never, before it expires), and whether its task
    has its own approver or answerer (someone always can)."""

    answerable: bool
    fallback: Unattended | None
    timeout_s: float
    escalates_at: datetime | None
    own: bool = False

    def escalate_in(self, now: datetime) -> float | None:
        return None if self.escalates_at is None else max(0.0, (self.escalates_at - now).total_seconds())


def route(policy: RoutingPolicy | None, answerable: bool, timeout_s: float, now: datetime, *,
          own: bool = False) -> Route:
    """The route of a request opening ``now`` that would wait ``timeout_s``; without a policy, as before: it waits
    its whole timeout and never escalates."""
    if policy is None:
        return Route(answerable, None, timeout_s, None, own)
    fallback = None if answerable else policy.unattended
    if fallback is Unattended.WAIT:
        timeout_s = min(timeout_s, policy.unattended_wait_s)
    after = policy.escalate_after_s
    # A task's own approver (an embedding app) is asked in its own call, which nothing interrupts: not escalated.
    escalates = now + timedelta(seconds=after) if after is not None and after < timeout_s \
        and fallback is not Unattended.DENY and not own else None
    return Route(answerable, fallback, timeout_s, escalates, own)


#: How every reason of a request nobody could answer begins (the tool flow records such a denial as unanswered).
NOBODY_COULD_ANSWER = "nobody could answer"


def nobody_reason(namespace: str, kind: str, policy: RoutingPolicy) -> str:
    """Why a request was refused or cut short: nobody could answer, and what would let someone."""
    what = "approval" if kind == APPROVAL_KIND else "question"
    now = f"wait {policy.unattended_wait_s:g} s" if policy.unattended is Unattended.WAIT else "deny"
    return (f"{NOBODY_COULD_ANSWER} this {what}: no client was following namespace {namespace!r} (an open event "
            f"stream of one of its sessions: `codesdk run`, `codesdk events --follow`, a UI) and no webhook there "
            f"takes {kind}; follow the session before the task asks, or register a webhook for {kind} "
            f"(the operator's `serve --unattended` is {now})")
