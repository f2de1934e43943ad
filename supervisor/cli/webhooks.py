"""``codesdk webhooks …``: registering endpoints and following their deliveries, through the service's API
(docs/webhooks.md)."""

from __future__ import annotations

import argparse
import sys

from codesdk.protocol import api, parse_kinds

from ..terminal import one_line
from .common import EXIT_OK, CliError
from .render import json_line


def _webhook_line(webhook: api.Webhook) -> str:
    """One line per webhook; what a tenant wrote (URL, description) cannot drive the admin's terminal."""
    line = (f"{webhook.id}  {webhook.url}  kinds={','.join(webhook.kinds)}  namespace={webhook.namespace or '*'}"
            f"{'  disabled' if webhook.disabled else ''}{f'  {webhook.description}' if webhook.description else ''}")
    return one_line(line)


def _delivery_line(delivery: api.Delivery) -> str:
    """One line per delivery; its last error quotes the receiver's answer, shown escaped."""
    tried = delivery.attempts if isinstance(delivery.attempts, int) else len(delivery.attempts)
    return one_line(f"{delivery.id}  {delivery.state.value:<9} {delivery.kind}  attempts={tried}  "
                    f"created={delivery.created_at.isoformat()}"
                    f"{f'  last error: {delivery.last_error}' if delivery.last_error else ''}")


async def cmd_webhooks(args: argparse.Namespace) -> int:
    from .remote import client_for  # imported only when used: the HTTP client costs start-up time

    if not args.url:
        raise CliError("webhooks are registered with the service that sends them: pass --url (or set CODESDK_URL) "
                       "and a token")
    if args.action == "add":
        try:
            kinds = parse_kinds(args.kinds)
        except ValueError as exc:
            raise CliError(f"--kind: {exc}") from None
    async with client_for(args) as client:
        shown: api.Answer | None = None
        if args.action == "add":
            created = await client.create_webhook(args.endpoint, kinds, namespace=args.namespace,
                                                  description=args.description or "")
            shown = created
            if not args.json:
                print(_webhook_line(created.webhook))
                print(f"secret {created.secret}  (shown this once: the receiver verifies signatures with it)")
        elif args.action == "list":
            webhooks = await client.webhooks()
            for webhook in webhooks:
                if args.json:
                    json_line(webhook.model_dump(mode="json", exclude_none=True))
                else:
                    print(_webhook_line(webhook))
            if not webhooks and not args.json:
                print("no webhooks (codesdk webhooks add URL --kind KIND)", file=sys.stderr)
            return EXIT_OK
        elif args.action == "show":
            shown = await client.webhook(args.webhook)
            if not args.json:
                print(_webhook_line(shown))
        elif args.action == "remove":
            await client.delete_webhook(args.webhook)
            print(f"removed {args.webhook}", file=sys.stderr)
            return EXIT_OK
        elif args.action == "rotate":
            rotated = await client.rotate_webhook_secret(args.webhook, end_overlap=args.end_overlap)
            shown = rotated
            if not args.json:
                print(f"secret {rotated.secret}  (the previous one also signs until "
                      f"{rotated.previous_valid_until.isoformat()})")
        elif args.action == "test":
            shown = await client.test_webhook(args.webhook)
            if not args.json:
                print(_delivery_line(shown))
        elif args.action == "deliveries" and args.delivery is None:
            page = await client.list_deliveries(args.webhook, state=args.state, before=args.before,
                                                limit=args.limit)
            for delivery in page.deliveries:
                if args.json:
                    json_line(delivery.model_dump(mode="json", exclude_none=True))
                else:
                    print(_delivery_line(delivery))
            if not page.deliveries and not args.json:
                print(f"no {args.state or ''} deliveries".replace("  ", " "), file=sys.stderr)
            if page.has_more:
                print(f"older deliveries follow: codesdk webhooks deliveries {args.webhook} "
                      f"{f'--state {args.state} ' if args.state else ''}--before {page.next_before}", file=sys.stderr)
            return EXIT_OK
        elif args.action == "deliveries":
            delivery = await client.delivery(args.webhook, args.delivery)
            shown = delivery
            if not args.json:
                print(_delivery_line(delivery))
                for attempt in delivery.attempts if not isinstance(delivery.attempts, int) else ():
                    print(one_line(f"  {attempt.at.isoformat()}  status="
                                   f"{attempt.status if attempt.status is not None else '-'}  "
                                   f"{attempt.duration_ms:g} ms{f'  {attempt.error}' if attempt.error else ''}"))
        else:
            shown = await client.redeliver(args.webhook, args.delivery)
            if not args.json:
                print(_delivery_line(shown))
    if args.json and shown is not None:
        json_line(shown.model_dump(mode="json", exclude_none=True))
    return EXIT_OK
