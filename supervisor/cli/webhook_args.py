"""The arguments of ``codesdk webhooks …`` (``webhooks`` runs them). Imported by ``front`` before the heavy imports:
the standard library only."""

from __future__ import annotations

from typing import Any


def add_parser(command: Any, common: Any) -> None:
    """``codesdk webhooks ACTION``, on ``front``'s ``command(name, help)``; each action takes the ``common``
    options too (``--url``, ``--token`` after the action's name)."""
    webhooks = command("webhooks", "webhook endpoints sent signed deliveries of what happens (through the service: "
                                   "--url); docs/webhooks.md")
    actions = webhooks.add_subparsers(dest="action", required=True)

    def action(name: str, text: str, *, webhook: bool = True) -> Any:
        parser = actions.add_parser(name, help=text, parents=[common])
        if webhook:
            parser.add_argument("webhook", help="the webhook's id (wh_…), as `codesdk webhooks list` shows it")
        parser.add_argument("--json", action="store_true", help="print the answer as JSON")
        return parser

    add = action("add", "register an endpoint; prints its id and its secret (shown this once)", webhook=False)
    add.add_argument("endpoint", metavar="URL", help="http(s) URL on a host the operator allows (serve --webhook-allow)")
    add.add_argument("--kind", dest="kinds", action="append", metavar="KIND", required=True,
                     help="a kind to deliver: task.completed, task.failed, task.stopped, approval.requested, "
                          "question.requested, approval.escalated, question.escalated, budget.reached, "
                          "worker.quarantined, lease.moved, or * for all; repeatable")
    add.add_argument("--namespace", help="the namespace whose events it gets (a tenant: its own, by default; the "
                                         "admin: every namespace unless named)")
    add.add_argument("--description", help="what it is for, for people")
    action("list", "the webhooks the token sees", webhook=False)
    action("show", "one webhook")
    action("remove", "remove a webhook and the deliveries not yet sent")
    rotate = action("rotate", "a new secret (printed once); the previous one signs beside it for a day")
    rotate.add_argument("--end-overlap", action="store_true",
                        help="rotate although an earlier rotation's day runs: the secret it rotated out stops "
                             "signing now (switch every receiver to the current secret first)")
    action("test", "send a webhook.test delivery")
    deliveries = action("deliveries", "a webhook's deliveries, newest first; with a delivery id: it and its attempts")
    deliveries.add_argument("delivery", nargs="?", help="one delivery's id (msg_…)")
    deliveries.add_argument("--state", choices=["pending", "delivered", "dead"], help="only deliveries in this state")
    deliveries.add_argument("--limit", type=int, default=None, metavar="N",
                            help="at most N deliveries (default 100, at most 1000)")
    deliveries.add_argument("--before", metavar="DELIVERY",
                            help="only deliveries made before this one (the id the previous page says to go on from)")
    redeliver = action("redeliver", "send a delivery again now, with the same id")
    redeliver.add_argument("delivery", help="the delivery's id (msg_…)")
