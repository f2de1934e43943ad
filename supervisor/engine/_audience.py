"""Who can answer an approval or a question, and what happens when nobody can.

An approval or a question waits for a person. Someone can answer one in a namespace when a client is attached (an
open SSE event stream of one of the namespace's sessions, counted by the API's stream handlers), when a web console
that may see the namespace is active (it polls; the API counts it), when its task has its own approver or answerer
(a terminal, an embedding app), or when a webhook takes ``approval.requested`` (or ``question.requested``) there.
When nobody can, waiting the whole timeout only holds a worker for nobody: the operator's ``RoutingPolicy`` applies
at once — deny (decline) with a reason that says what to attach or register, or wait with a shorter deadline, which
becomes the whole timeout again as soon as someone can answer. A request still pending ``escalate_after_s`` after it
opened is escalated once (``approval.escalated`` / ``question.escalated``) so that a second target hears of it.

The count is this process's: a client attached to another supervisor sharing the store is not seen here.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

import trio

from codesdk.protocol import utc_now

log = logging.getLogger("codesdk.supervisor.audience")

#: Whether a webhook in a namespace takes a kind of event (``WebhookRegistry.accepts``): cheap and synchronous.
WebhookSource = Callable[[str, str], bool]

#: Web consoles active now that may see a namespace (the API's console sessions): cheap and synchronous.
ConsoleSource = Callable[[str], int]

#: The kinds a webhook would be told of a request by.
APPROVAL_KIND, QUESTION_KIND = "approval.requested", "question.requested"


def nobody(namespace: str, kind: str) -> bool:
    """The webhook source of a supervisor without webhooks."""
    return False


def no_consoles(namespace: str) -> int:
    """The console source of a supervisor that serves no console."""
    return 0


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
#: How often a wait for someone to answer looks again at what wakes nobody: a webhook registered meanwhile.
RECHECK_S = 1.0


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
    """The clients attached per namespace, the webhook source (``webhooks``, replaceable: the service sets its
    registry's ``accepts``) and the console source (``console_source``: the API sets its console sessions')."""

    def __init__(self, webhooks: WebhookSource = nobody, console_source: ConsoleSource = no_consoles) -> None:
        self.webhooks = webhooks
        self.console_source = console_source
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

    def consoles(self, namespace: str) -> int:
        try:
            return int(self.console_source(namespace))
        except Exception:  # as a broken webhook source: nobody, never a failed request
            log.exception("the console source failed for %s", namespace)
            return 0

    def noticed(self) -> None:
        """Someone may have become able to answer (a console was seen): waits for someone look again."""
        self._wake()

    def webhook_takes(self, namespace: str, kind: str) -> bool:
        try:
            return bool(self.webhooks(namespace, kind))
        except Exception:  # a broken source tells nobody: the fallback applies, never a failed request
            log.exception("the webhook source failed for %s in %s", kind, namespace)
            return False

    def reachable(self, namespace: str, kind: str) -> bool:
        """Someone attached or registered could answer a request of ``kind`` in ``namespace``."""
        return self.streams(namespace) > 0 or self.consoles(namespace) > 0 or self.webhook_takes(namespace, kind)

    async def wait_reachable(self, namespace: str, kind: str, limit_s: float) -> bool:
        """Whether someone can answer within ``limit_s`` (a client attaching meanwhile counts)."""
        with trio.move_on_after(limit_s):
            await self._until_reachable(namespace, kind)
            return True
        return self.reachable(namespace, kind)

    async def reachable_before(self, namespace: str, kind: str, done: trio.Event) -> bool:
        """Wait until someone can answer (True) or ``done`` is set (False), whichever is first."""
        reached = False
        async with trio.open_nursery() as racing:
            async def until_reachable() -> None:
                nonlocal reached
                await self._until_reachable(namespace, kind)
                reached = True
                racing.cancel_scope.cancel()

            async def until_done() -> None:
                await done.wait()
                racing.cancel_scope.cancel()

            racing.start_soon(until_reachable)
            racing.start_soon(until_done)
        return reached and not done.is_set()

    async def _until_reachable(self, namespace: str, kind: str) -> None:
        while not self.reachable(namespace, kind):
            changed = self._changed
            with trio.move_on_after(RECHECK_S):
                await changed.wait()

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


async def await_answer(audience: Audience, namespace: str, kind: str, routed: Route, decided: trio.Event, *,
                       answerable: Callable[[], Awaitable[Route]],
                       escalate: Callable[[], Awaitable[None]]) -> Route:
    """Wait for ``decided`` until the route's deadline (counted from now), escalating once when due. A request
    nobody could answer (fallback ``wait``) watches for someone who can: then ``answerable()`` gives it its whole
    timeout (and stores its new deadline), so that it waits as if someone could from the start. The route that
    applied at the end: its fallback is still ``wait`` only if nobody could answer all along."""
    start = trio.current_time()
    escalated, escalate_at = False, None
    while not decided.is_set():
        if escalate_at is None and not escalated and (due := routed.escalate_in(utc_now())) is not None:
            escalate_at = trio.current_time() + due
        now = trio.current_time()
        if escalate_at is not None and now >= escalate_at:
            await escalate()  # in the wait: always stored before the decision
            escalated, escalate_at = True, None
            continue
        deadline = start + routed.timeout_s
        if now >= deadline:
            break
        reached = False
        with trio.move_on_at(deadline if escalate_at is None else min(deadline, escalate_at)):
            if routed.fallback is Unattended.WAIT:
                reached = await audience.reachable_before(namespace, kind, decided)
            else:
                await decided.wait()
        if reached:  # outside the deadline's scope: the new deadline is stored even if the old one is now
            routed, escalate_at = await answerable(), None
    return routed


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


def expiry_reason(waited: str, routed: Route, audience: Audience, namespace: str, kind: str,
                  policy: RoutingPolicy | None) -> str:
    """Why a request expired, true when written: nobody could answer it only if nobody could, all along and now."""
    if routed.fallback is Unattended.WAIT and policy is not None and not audience.reachable(namespace, kind):
        return f"{waited} ({nobody_reason(namespace, kind, policy)})"
    return waited


def nobody_reason(namespace: str, kind: str, policy: RoutingPolicy) -> str:
    """Why a request was refused or cut short: nobody could answer, and what would let someone."""
    what = "approval" if kind == APPROVAL_KIND else "question"
    now = f"wait {policy.unattended_wait_s:g} s" if policy.unattended is Unattended.WAIT else "deny"
    return (f"{NOBODY_COULD_ANSWER} this {what}: no client was following namespace {namespace!r} (an open event "
            f"stream of one of its sessions: `codesdk run`, `codesdk events --follow`, a UI; or the web console "
            f"open on it) and no webhook there "
            f"takes {kind}; follow the session before the task asks, or register a webhook for {kind} "
            f"(the operator's `serve --unattended` is {now})")
